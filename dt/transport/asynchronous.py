"""Asynchronous collectives: one communication thread per group, in issue order.

`submit(group, name, fn, async_op)` is how every collective runs. With
async_op=True the call is queued on the group's thread and a `Work` comes
back at once, which is what data parallel overlaps with backward; a
synchronous call runs inline when nothing is queued, else waits its turn, so
every rank sees the same order. A queued call's traffic is charged to the
label its caller had open (accounting.charged_to), as if it had run inline.

On a GPU the thread works on the group's device, on a stream of its own:
a CUDA event recorded on the caller's stream at submit time makes the
thread's stream wait until the data the collective reads is written, and an
event recorded when it is done makes `Work.wait()` order the caller's stream
after it, without blocking the host on the GPU.
"""

from __future__ import annotations

import atexit
import datetime
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dt.transport import accounting
from dt.transport.errors import CollectiveError, CollectiveTimeout, timed_out
from dt.transport.group import Group, default_device

__all__ = ["THREADS", "CommThreads", "Work", "after_queued", "submit"]

EXIT_WAIT_S = 5.0  # at exit, the longest a communication thread's running collective is waited for


class Work(dist.Work):
    """Handle of an asynchronous dt collective: a torch.distributed Work.

    `wait()`, `is_completed()`, `is_success()`, `exception()`, `result()` and
    `get_future()` behave as torch's: the future's value is what torch's gloo
    work carries (e.g. `[tensor]` for all_reduce), or the collective's error.
    """

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._exc: BaseException | None = None
        self._result: Any = None
        self._future: torch.futures.Future | None = None  # what get_future hands out
        self._settled: torch.futures.Future | None = None  # the one finish() completes
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.cuda_start: Any = None  # CUDA events around the collective on the comm stream
        self.cuda_done: Any = None  # (the caller's stream waits on this one)

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until done (timeout: seconds or a timedelta; None or 0 waits without limit, as torch)."""
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if not self._done.wait(timeout or None):
            raise CollectiveTimeout(f"{self.name}: {timed_out(timeout)} for it to complete "
                                    "(it goes on: wait again)")
        if self._exc is not None:
            raise self._error() from self._exc
        if self.cuda_done is not None:
            torch.cuda.current_stream().wait_event(self.cuda_done)
        return True

    def synchronize(self) -> None:
        self.wait()

    def seconds(self) -> float:
        """How long the collective ran: on a GPU between its CUDA events, else on the host clock."""
        self.wait()
        if self.cuda_start is not None:
            self.cuda_done.synchronize()
            return self.cuda_start.elapsed_time(self.cuda_done) / 1e3
        return (self.finished_at or 0.0) - (self.started_at or 0.0)

    def result(self) -> Any:
        self.wait()
        return self._result

    def get_future(self) -> torch.Future:
        """A torch.Future (the type of gloo's) completed with the result (or the error) when the work is.

        The error must be the future's own, not its value: torch.futures.Future.set_exception
        stores the exception as the future's *value* and only Python's wait() raises it, so a
        reader in C++ takes it for a result (DDP's reducer reads each bucket's future as
        tensors: an exception there is a segmentation fault, not an error). A future
        completed by a callback that raises holds a real error, seen from C++ and Python
        alike (as torch's RuntimeError, "... CollectiveError: ...", the text naming the
        failed peer), so the future handed out is that of `_unwrap` on the one this work settles.
        """
        with self._lock:
            if self._future is None:
                settled = torch.futures.Future()
                self._future = settled.then(_unwrap)
                self._settled = settled
                if self._done.is_set():
                    self._settle(settled)
            return self._future

    def _error(self) -> CollectiveError:
        """The collective's error as wait() raises it: a timeout stays a CollectiveTimeout."""
        kind = CollectiveTimeout if isinstance(self._exc, CollectiveTimeout) else CollectiveError
        return kind(f"async {self.name} failed: {self._exc}")

    def _settle(self, future: torch.futures.Future) -> None:
        if self._exc is not None:
            future.set_exception(self._error())
        else:
            future.set_result(self._result)

    def finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        """Mark the collective done (by the thread that ran it), with its result or error."""
        with self._lock:
            self._result, self._exc = result, exc
            self.finished_at = time.perf_counter()
            self._done.set()
            future = self._settled
        if future is not None:
            self._settle(future)  # outside the lock: the future's callbacks may run here


def _unwrap(settled: torch.futures.Future) -> Any:
    """The settled future's value, or its exception raised (making it the next future's error)."""
    return settled.wait()


class _CommThread:
    """Runs a group's collectives one after another, in the order issued."""

    def __init__(self, key: tuple, device: torch.device | None):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0
        self.lock = threading.Lock()
        self.device = device  # the group's GPU, or None on the CPU
        self.thread = threading.Thread(target=self._loop, name=f"dt-comm-{key}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        stream = None
        if self.device is not None:
            torch.cuda.set_device(self.device)  # a new thread starts on cuda:0
            stream = torch.cuda.Stream(self.device)
        while (job := self.jobs.get()) is not None:  # None: stop (CommThreads.reset)
            work, fn, ready, label = job
            work.started_at = time.perf_counter()
            try:
                if stream is None:
                    with accounting.charged_as(label):
                        result = fn()
                else:
                    stream.wait_event(ready)
                    work.cuda_start = torch.cuda.Event(enable_timing=True)
                    work.cuda_start.record(stream)
                    with torch.cuda.stream(stream), accounting.charged_as(label):
                        result = fn()
                    work.cuda_done = torch.cuda.Event(enable_timing=True)
                    work.cuda_done.record(stream)
                work.finish(result=result)
            except BaseException as exc:  # surfaces at wait()
                work.finish(exc=exc)
            with self.lock:
                self.pending -= 1


    def stop(self) -> None:
        """End the thread once what is queued has run (it is not waited for)."""
        self.jobs.put(None)

    def stop_at_exit(self, within: float) -> None:
        """End the thread without running what is queued (each such Work fails, naming why), and
        wait up to `within` seconds for the collective it is running to end."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].finish(exc=CollectiveError(f"{job[0].name}: not run: the process exited first"))
                with self.lock:
                    self.pending -= 1
        self.jobs.put(None)
        self.thread.join(timeout=within)


@dataclass
class CommThreads:
    """Every group's communication thread in this process, by the group's key (its name and ranks).

    `reset()` (dt.transport.reset) stops them all: a run starts with none, as its groups
    start unconnected; a run that left work queued has it run first.
    """

    threads: dict[tuple, _CommThread] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        with self.lock:
            for thread in self.threads.values():
                thread.stop()
            self.threads.clear()

    def stop_at_exit(self, within: float = EXIT_WAIT_S) -> None:
        """At exit, while the interpreter still runs every thread (atexit): end each thread before
        it finalizes. A daemon thread still inside torch's C++ then is killed there, and the
        process aborts ("terminate called without an active exception") after a run that may
        have reported its error already: a survivor whose peer died, its queued collectives
        failing one by one as the main thread exits."""
        with self.lock:
            threads = list(self.threads.values())
            self.threads.clear()
        for thread in threads:
            thread.stop_at_exit(within)


THREADS = CommThreads()
atexit.register(THREADS.stop_at_exit)


def _comm_thread(group: Group) -> _CommThread:
    with THREADS.lock:
        t = THREADS.threads.get(group.key)
        if t is None:
            device = default_device(group)
            t = THREADS.threads[group.key] = _CommThread(group.key,
                                                         device if device.type == "cuda" else None)
        group.links.comm = t  # read without a call by a fast path (is anything queued?)
        return t


def submit(group: Group, name: str, fn: Callable[[], Any], async_op: bool) -> Any:
    """Run collective `fn` on `group` in issue order.

    async_op=True queues it on the group's communication thread and returns a
    Work at once. A synchronous call runs inline on the caller's thread when
    nothing is queued for the group (no thread hop on the fast path), and
    otherwise queues behind the earlier asynchronous ones and waits, so every
    rank sees the same order.
    """
    thread = THREADS.threads.get(group.key)
    if not async_op and (thread is None or thread.pending == 0):
        return accounting.blocking(fn)
    thread = thread or _comm_thread(group)
    work = Work(name)
    ready = None
    if thread.device is not None:  # the data this collective reads is written on the caller's stream
        ready = torch.cuda.Event()
        ready.record()
    with thread.lock:
        thread.pending += 1
    # Its bytes are charged where it was issued (a layer's label), not to the thread that runs it.
    thread.jobs.put((work, fn, ready, accounting.charge_target()))
    if async_op:
        return work
    return accounting.blocking(work.result)


def after_queued(group: Group) -> None:
    """Return once the collectives queued on `group`'s thread have run (at once when none is, or
    when called on that thread: a queued collective's own messages).

    Point-to-point posted straight on a group (ring attention's hops, a pipeline's activations,
    dt.transport.p2p) travels on the channels its queued collectives use: posted while one is in
    flight (FSDP's gather ahead, a DDP bucket), its messages would interleave with the
    collective's and each peer would read the other's as its own. Waiting for the queue first
    keeps one order of messages per channel on every rank, as one NCCL communicator's stream
    runs its calls in issue order.
    """
    thread = group.links.comm
    if thread is None or thread.pending == 0 or threading.current_thread() is thread.thread:
        return
    submit(group, "point-to-point behind the queued collectives", lambda: None, async_op=False)
