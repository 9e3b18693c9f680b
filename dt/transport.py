"""The wire: every byte dt moves goes through this file.

Collectives never call torch.distributed directly. They ask this module for a
`Comm` (a group seen from one rank, bound to one collective call) and use its
`isend` / `irecv` / `exchange`. That one choke point is what lets dt

- count bytes and messages per rank and per collective (`traffic()`),
- turn a deadlock into an error that names the collective, the step and the
  peer it was waiting on (`set_timeout`),
- check, before a collective moves any data, that every rank of the group
  called the same collective with compatible arguments (`set_validation`),
- run collectives asynchronously, in issue order, on one communication
  thread per group (`submit`), which is what data parallel overlaps with
  backward.

Peers are always named by their rank *in the group*; this module translates
to the global ranks torch.distributed wants.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "CollectiveError",
    "CollectiveTimeout",
    "Comm",
    "Group",
    "Traffic",
    "Work",
    "get_timeout",
    "resolve_group",
    "set_timeout",
    "set_validation",
    "submit",
    "traffic",
    "validation_enabled",
]


class CollectiveError(RuntimeError):
    """A collective failed: bad input, mismatched ranks, or a lost peer."""


class CollectiveTimeout(CollectiveError):
    """A wait on a peer outlasted the timeout: the usual symptom of a deadlock."""


# --------------------------------------------------------------------------
# Settings: timeout and validation. One place, read by every collective.
# --------------------------------------------------------------------------

_timeout_s: float = float(os.environ.get("DT_TIMEOUT", "300"))
_validate: bool = os.environ.get("DT_VALIDATE", "1") not in ("0", "false", "False", "")


def set_timeout(seconds: float) -> None:
    """Longest dt waits on one message before declaring the peer stuck."""
    global _timeout_s
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {seconds}")
    _timeout_s = float(seconds)


def get_timeout() -> float:
    return _timeout_s


def set_validation(enabled: bool) -> None:
    """Check arguments across ranks before each collective (on by default).

    The check is one Bruck all-gather of an 8(8+2p)-byte signature per collective:
    ceil(lg p) tiny messages. It turns a mismatch (different lengths, dtypes,
    roots, or a rank calling another collective) into the same clear error on
    every rank, where gloo would abort the receiving process. Benchmarks turn it
    off, as torch.distributed runs without such a check by default.
    """
    global _validate
    _validate = bool(enabled)


def validation_enabled() -> bool:
    return _validate


# --------------------------------------------------------------------------
# Groups: a process group as seen from this rank.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """A process group from this rank's point of view.

    `pg` is what torch.distributed calls the group (None for the default
    world group); `ranks` are its members' global ranks in group order.
    """

    pg: Any
    rank: int
    size: int
    ranks: tuple[int, ...]

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(
                f"global rank {global_rank} is not a member of this group "
                f"(members: {list(self.ranks)})"
            ) from None

    @property
    def key(self) -> tuple[int, ...]:
        return self.ranks

    def __deepcopy__(self, memo: dict) -> Group:
        # A handle on shared communicators: copying a module that holds one
        # (copy.deepcopy(model)) must share the group, not try to pickle it.
        return self


_groups: dict[int, Group] = {}


def resolve_group(group: Any = None) -> Group:
    """Translate `group` (None, a ProcessGroup, or a `Group`) for this rank.

    Raises ValueError, naming this rank and the group's members, when this
    rank is not in the group.
    """
    if isinstance(group, Group):
        return group
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: call dt.launcher.init() or run "
            "under dt.launcher.run_workers / torchrun first"
        )
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"rank {dist.get_rank()} is not a member of the group it passed "
            "(dist.new_group returned NON_GROUP_MEMBER on this rank)"
        )
    cached = _groups.get(id(group))
    if cached is not None and cached.pg is group:
        return cached
    if group is None:
        ranks = tuple(range(dist.get_world_size()))
    else:
        ranks = tuple(dist.get_process_group_ranks(group))
    me = dist.get_rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of the group {list(ranks)}")
    view = Group(pg=group, rank=ranks.index(me), size=len(ranks), ranks=ranks)
    _groups[id(group)] = view
    return view


def default_device(group: Group | None = None) -> torch.device:
    """Where this group's tensors live: the current CUDA device under NCCL, else the CPU."""
    pg = group.pg if group is not None else None
    if dist.get_backend(pg) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------
# Byte accounting.
# --------------------------------------------------------------------------


@dataclass
class Counts:
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Traffic(Counts):
    """What this rank moved while a `traffic()` block was open.

    Totals are the fields inherited from Counts; `by_collective` splits them by
    the outermost collective that caused them ("all_reduce", "validate", ...)
    and `by_algorithm` by "collective:algorithm".
    """

    by_collective: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    by_algorithm: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    # Wall time the calling threads spent inside synchronous collectives (the
    # outermost call only): the communication a step cannot hide.
    seconds: float = 0.0


_recorders: list[Traffic] = []
_recorders_lock = threading.Lock()


@contextlib.contextmanager
def traffic() -> Iterator[Traffic]:
    """Count this rank's point-to-point traffic inside the block (all threads)."""
    record = Traffic()
    with _recorders_lock:
        _recorders.append(record)
    try:
        yield record
    finally:
        with _recorders_lock:
            _recorders.remove(record)


def _account(collective: str, algorithm: str, sent: int, received: int, calls: int = 0) -> None:
    if not _recorders:
        return
    with _recorders_lock:
        for rec in _recorders:
            for c in (rec, rec.by_collective[collective], rec.by_algorithm[f"{collective}:{algorithm}"]):
                if sent >= 0:
                    c.bytes_sent += sent
                    c.messages_sent += 1
                if received >= 0:
                    c.bytes_received += received
                    c.messages_received += 1
                c.calls += calls


# --------------------------------------------------------------------------
# Point-to-point with context: every wait knows what it is waiting for.
# --------------------------------------------------------------------------


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Handle:
    """One posted send or receive; `wait()` raises with the collective's context."""

    __slots__ = ("work", "comm", "what", "peer", "nbytes", "step")

    def __init__(self, work: Any, comm: Comm, what: str, peer: int, nbytes: int, step: int):
        self.work, self.comm, self.what, self.peer, self.nbytes, self.step = (
            work, comm, what, peer, nbytes, step)

    def wait(self) -> None:
        if self.work is None:
            return
        timeout = _timeout_s
        try:
            self.work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            self.comm._fail(self, exc, timeout)
        self.work = None


_NO_HANDLE = Handle(None, None, "", -1, 0, -1)  # type: ignore[arg-type]

_scope = threading.local()


class Comm:
    """A group bound to one collective call: the only way collectives talk.

    `step` is the algorithm's current sequential step; it is carried into
    every error message so a deadlock says where it happened.
    """

    def __init__(self, group: Group, collective: str, algorithm: str):
        self.group = group
        self.rank = group.rank
        self.size = group.size
        self.collective = collective
        self.algorithm = algorithm
        self.step = 0
        outer = getattr(_scope, "name", None)
        # Traffic of a collective built from others (naive all-reduce = reduce +
        # broadcast) is charged to the outermost one, the one the user called.
        self._charge_to = outer if outer is not None else (collective, algorithm)

    # -- posting ------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int) -> Handle:
        nbytes = _nbytes(tensor)
        work = dist.isend(tensor, self.group.ranks[peer], group=self.group.pg)
        _account(*self._charge_to, sent=nbytes, received=-1)
        return Handle(work, self, "send", peer, nbytes, self.step)

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle:
        nbytes = _nbytes(tensor)
        work = dist.irecv(tensor, self.group.ranks[peer], group=self.group.pg)
        _account(*self._charge_to, sent=-1, received=nbytes)
        return Handle(work, self, "receive", peer, nbytes, self.step)

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        self.isend(tensor, peer).wait()

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        self.irecv(tensor, peer).wait()

    def exchange(
        self,
        send: torch.Tensor | None,
        to: int,
        recv: torch.Tensor | None,
        frm: int,
    ) -> None:
        """Send to one peer while receiving from another (both posted first).

        Posting the receive before waiting on the send is what keeps a ring
        from deadlocking: every rank is a sender and a receiver at once.
        """
        r = self.irecv(recv, frm) if recv is not None else _NO_HANDLE
        s = self.isend(send, to) if send is not None else _NO_HANDLE
        r.wait()
        s.wait()

    # -- errors -------------------------------------------------------------
    def where(self) -> str:
        return (
            f"rank {self.group.ranks[self.rank]} (group rank {self.rank} of {self.size}) "
            f"in {self.collective}[{self.algorithm}] at step {self.step}"
        )

    def _fail(self, handle: Handle, exc: BaseException, timeout: float) -> None:
        peer_global = self.group.ranks[handle.peer]
        direction = "from" if handle.what == "receive" else "to"
        msg = (
            f"{self.where()}: {handle.what} of {handle.nbytes} bytes {direction} "
            f"rank {peer_global} failed"
        )
        text = str(exc)
        if "Timed out" in text or "timeout" in text.lower() and "closure" not in text:
            raise CollectiveTimeout(
                f"{msg}: waited {timeout:g}s (dt.transport timeout) with nothing from the "
                f"peer; it is stuck elsewhere or never called {self.collective}"
            ) from exc
        first_line = text.splitlines()[0] if text else type(exc).__name__
        first_line = first_line.split(" This is typically")[0]  # gloo's boilerplate
        raise CollectiveError(f"{msg}: {first_line}") from exc


@contextlib.contextmanager
def charged_to(collective: str, algorithm: str) -> Iterator[None]:
    """Charge traffic of nested collectives in this block to `collective`."""
    prev = getattr(_scope, "name", None)
    if prev is None:
        _scope.name = (collective, algorithm)
        _account(collective, algorithm, sent=-1, received=-1, calls=1)
    try:
        yield
    finally:
        _scope.name = prev


# --------------------------------------------------------------------------
# Asynchronous collectives: one communication thread per group.
# --------------------------------------------------------------------------


class Work:
    """Handle of an asynchronous dt collective, like torch.distributed's Work."""

    def __init__(self, name: str):
        self.name = name
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._result: Any = None
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done.wait(timeout if timeout is not None else None):
            raise CollectiveTimeout(f"{self.name}: not completed within {timeout}s")
        if self._exc is not None:
            raise CollectiveError(f"async {self.name} failed: {self._exc}") from self._exc
        return True

    def result(self) -> Any:
        self.wait()
        return self._result

    def _finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        self._result, self._exc = result, exc
        self.finished_at = time.perf_counter()
        self._done.set()


class _CommThread:
    """Runs a group's collectives one after another, in the order issued."""

    def __init__(self, key: tuple[int, ...]):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=f"dt-comm-{key}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            work, fn = self.jobs.get()
            work.started_at = time.perf_counter()
            try:
                work._finish(result=fn())
            except BaseException as exc:  # surfaces at wait()
                work._finish(exc=exc)
            with self.lock:
                self.pending -= 1


_comm_threads: dict[tuple[int, ...], _CommThread] = {}
_comm_threads_lock = threading.Lock()


def _comm_thread(group: Group) -> _CommThread:
    with _comm_threads_lock:
        t = _comm_threads.get(group.key)
        if t is None:
            t = _comm_threads[group.key] = _CommThread(group.key)
        return t


def submit(group: Group, name: str, fn: Callable[[], Any], async_op: bool) -> Any:
    """Run collective `fn` on `group` in issue order.

    async_op=True queues it on the group's communication thread and returns a
    Work at once. A synchronous call runs inline on the caller's thread when
    nothing is queued for the group (no thread hop on the fast path), and
    otherwise queues behind the earlier asynchronous ones and waits, so every
    rank sees the same order.
    """
    thread = _comm_threads.get(group.key)
    if not async_op and (thread is None or thread.pending == 0):
        return _blocking(fn)
    thread = thread or _comm_thread(group)
    work = Work(name)
    with thread.lock:
        thread.pending += 1
    thread.jobs.put((work, fn))
    if async_op:
        return work
    return _blocking(work.result)


def _blocking(fn: Callable[[], Any]) -> Any:
    """Run fn, charging its wall time to the open traffic() records (`seconds`)."""
    if not _recorders or getattr(_scope, "blocking", False):
        return fn()
    _scope.blocking = True
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        _scope.blocking = False
        elapsed = time.perf_counter() - t0
        with _recorders_lock:
            for rec in _recorders:
                rec.seconds += elapsed


# --------------------------------------------------------------------------
# Public point-to-point, torch-shaped (peers are global ranks), accounted.
# --------------------------------------------------------------------------


def isend(tensor: torch.Tensor, dst: int, group: Any = None) -> Handle:
    """Post a send of `tensor` to global rank `dst`; `.wait()` the returned handle."""
    g = resolve_group(group)
    return Comm(g, "send_recv", "p2p").isend(tensor, g.group_rank(dst))


def irecv(tensor: torch.Tensor, src: int, group: Any = None) -> Handle:
    """Post a receive into `tensor` from global rank `src`; `.wait()` the returned handle."""
    g = resolve_group(group)
    return Comm(g, "send_recv", "p2p").irecv(tensor, g.group_rank(src))


def send(tensor: torch.Tensor, dst: int, group: Any = None) -> None:
    isend(tensor, dst, group).wait()


def recv(tensor: torch.Tensor, src: int, group: Any = None) -> None:
    irecv(tensor, src, group).wait()
