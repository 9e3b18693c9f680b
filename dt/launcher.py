"""Start N processes on this machine, run a function on each, never hang.

    results = run_workers(fn, 4, x, timeout=60)   # fn(x) on ranks 0..3

- The parent owns the rendezvous: it opens a TCPStore on a port the kernel
  picks (port 0) and hands the port to the workers, so two runs at once can
  never race for the same "free" port.
- Results travel back pickled by plain `pickle` over a pipe, never through a
  multiprocessing queue, whose tensor pickler passes a shared-memory handle
  that blocks the parent forever once the worker that made it has exited.
- The first worker exception comes back to the caller with its rank and
  traceback, together with what every other rank raised; workers still
  running after a short grace are killed. A run that outlives `timeout` is
  killed, and the transport's own timeout (a fraction of it) has by then made
  each stuck rank say in which collective, at which step, waiting on whom.
- `WorkerPool` keeps the processes and their process group alive between
  runs (the test suite pays the start-up once per world size); a pool whose
  run failed is restarted before its next run.
- Under torchrun (RANK and WORLD_SIZE in the environment) `launch` runs the
  same function in the current process instead: the same worker code runs
  single-node or multi-node, unchanged.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dt.device import backend_for, local_device

__all__ = ["WorkerError", "WorkerPool", "init", "launch", "run_workers"]

DEFAULT_TIMEOUT = 300.0
_GRACE_S = 5.0  # after the first error, how long the other ranks get to report theirs


class WorkerError(RuntimeError):
    """A worker raised or died; `.rank` is the one blamed, `.errors` all of them."""

    def __init__(self, message: str, rank: int, errors: dict[int, RemoteError]):
        super().__init__(message)
        self.rank = rank
        self.errors = errors


@dataclass
class RemoteError:
    kind: str  # exception class name, "died" or "stopped"
    message: str
    traceback: str = ""

    def line(self) -> str:
        return f"{self.kind}: {self.message.splitlines()[0] if self.message else ''}"


def _resolve_backend(backend: str | None) -> str:
    """"auto" (or None): nccl where CUDA is, else gloo."""
    return backend_for("auto") if backend in (None, "auto") else backend


def _init_process_group(backend: str, timeout: float | None, **kwargs: Any) -> None:
    """init_process_group with this rank's device bound under NCCL.

    Binding the device (device_id=) makes NCCL create its communicator now,
    eagerly, on every rank at once, instead of lazily at a pair's first
    message, where ranks that start on different neighbours (a ring, Bruck)
    could wait on each other in a cycle.
    """
    extra: dict[str, Any] = {}
    if backend == "nccl":
        rank = kwargs.get("rank", int(os.environ.get("RANK", "0")))
        local = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", kwargs.get("world_size", 1)))
        device = local_device(backend, local, local_world)
        torch.cuda.set_device(device)
        extra["device_id"] = device
    if timeout is not None:
        extra["timeout"] = datetime.timedelta(seconds=timeout)
    dist.init_process_group(backend, **kwargs, **extra)


def _attempt_store(timeout: float) -> Any:
    """Under torchrun on one node, a store private to this restart attempt (None: use env://).

    torchrun's workers share the agent's TCPStore across restarts (the default
    since torch 2.5), so a group restarted after a worker died would read the
    dead group's addresses from it (gloo: "connectFullMesh failed ... Connection
    refused"; torch issue #135712). The restart count, the same for every worker
    of one node's agent, names a fresh key space. Across nodes the agents' counts
    can differ: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 there instead.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("LOCAL_WORLD_SIZE") != env["WORLD_SIZE"]:
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), False,
                          timeout=datetime.timedelta(seconds=timeout))
    return dist.PrefixStore(f"dt/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def init(backend: str | None = "auto", timeout: float = DEFAULT_TIMEOUT) -> None:
    """Initialise torch.distributed from torchrun's environment (env://).

    backend "auto": NCCL when CUDA is available (one GPU per rank, LOCAL_RANK's), else gloo.
    """
    if dist.is_initialized():
        return
    store = _attempt_store(timeout)
    if store is None:
        _init_process_group(_resolve_backend(backend), timeout, init_method="env://")
    else:
        _init_process_group(_resolve_backend(backend), timeout, store=store,
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = DEFAULT_TIMEOUT,
           backend: str = "auto", **kwargs: Any) -> list[Any]:
    """run_workers here, or under torchrun just this rank: [fn(*args)] with rank 0's first."""
    if _under_torchrun():
        init(backend, timeout)
        return [fn(*args, **kwargs)]
    return run_workers(fn, world_size, *args, timeout=timeout, backend=backend, **kwargs)


def run_workers(fn: Callable[..., Any], world_size: int, *args: Any,
                timeout: float = DEFAULT_TIMEOUT, backend: str = "gloo", **kwargs: Any) -> list[Any]:
    """Run fn(*args, **kwargs) on `world_size` fresh processes; return each rank's result.

    `fn` must be importable by name (a module-level function), as with any
    multiprocessing start method that does not fork the caller.
    """
    with WorkerPool(world_size, backend=backend) as pool:
        return pool.run(fn, *args, timeout=timeout, **kwargs)


# ---------------------------------------------------------------------------


def _context() -> Any:
    # forkserver: workers fork from a clean server that has already imported
    # torch, so a start costs a fork, not an import, and never inherits the
    # caller's OpenMP threads (fork after OpenMP start-up can hang).
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "dt"])
    return ctx


def _threads_per_worker(world_size: int) -> int:
    return max(1, (os.cpu_count() or 1) // world_size)


def _worker_main(rank: int, world_size: int, port: int, backend: str, conn: Any,
                 sys_path: list[str], threads: int) -> None:
    for p in reversed(sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.environ["DT_LAUNCHER_RANK"] = str(rank)
    torch.set_num_threads(threads)
    from dt import transport

    store = dist.TCPStore("127.0.0.1", port, None, False,
                          timeout=datetime.timedelta(seconds=60))
    os.environ["LOCAL_RANK"] = str(rank)  # every rank of a local run is on this host
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    # No timeout on gloo: a group given one makes dt wait that long (torch's rule,
    # dt.transport.timeout_for); without one, each run's own wait_timeout applies. On
    # NCCL dt's waits only order streams, and NCCL's watchdog needs the timeout.
    group_timeout = transport.get_timeout() if backend == "nccl" else None
    _init_process_group(backend, group_timeout, store=store, rank=rank, world_size=world_size)
    defaults = (transport.get_timeout(), transport.validation_enabled())
    conn.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            break
        job = pickle.loads(msg)
        if job is None:
            break
        fn, args, kwargs, wait_timeout = job
        transport.set_timeout(wait_timeout)
        transport.set_validation(defaults[1])
        try:
            reply = pickle.dumps(("ok", fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            reply = pickle.dumps(("error", type(exc).__name__, str(exc), traceback.format_exc()))
        conn.send_bytes(reply)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


class WorkerPool:
    """`world_size` processes with a live process group, reused across runs."""

    def __init__(self, world_size: int, backend: str = "gloo", threads_per_worker: int | None = None):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.world_size = world_size
        self.backend = _resolve_backend(backend)
        self.threads = threads_per_worker or _threads_per_worker(world_size)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._store: Any = None
        self.starts = 0

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- life cycle ---------------------------------------------------------
    def _start(self) -> None:
        ctx = _context()
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=60))
        port = self._store.port
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_worker_main, name=f"dt-rank{rank}",
                               args=(rank, self.world_size, port, self.backend, child_end,
                                     list(sys.path), self.threads), daemon=True)
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
        self.starts += 1
        replies = self._collect(timeout=120.0, grace=0.0, what="start-up")
        del replies

    def close(self) -> None:
        for c in self._conns:
            try:
                c.send_bytes(pickle.dumps(None))
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except (ProcessLookupError, TypeError):
                    pass
        for p in self._procs:
            p.join(5.0)
        for c in self._conns:
            c.close()
        self._procs, self._conns, self._store = [], [], None

    # -- running ------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT,
            **kwargs: Any) -> list[Any]:
        """fn(*args, **kwargs) on every rank; the list of results in rank order."""
        if not self._procs:
            self._start()
        # dt's per-wait timeout fires well inside the run's, so a deadlock is
        # reported by the stuck ranks themselves, with their collective and step.
        wait_timeout = max(0.5, 0.8 * timeout)
        payload = pickle.dumps((fn, args, kwargs, wait_timeout))
        for c in self._conns:
            c.send_bytes(payload)
        return self._collect(timeout=timeout, grace=_GRACE_S, what=getattr(fn, "__name__", "fn"))

    def _collect(self, timeout: float, grace: float, what: str) -> list[Any]:
        n = self.world_size
        results: list[Any] = [None] * n
        errors: dict[int, RemoteError] = {}
        first_error: tuple[float, int] | None = None
        pending = set(range(n))
        deadline = time.monotonic() + timeout
        while pending:
            now = time.monotonic()
            limit = deadline if first_error is None else min(deadline, first_error[0] + grace)
            if now >= limit:
                break
            waitables = {self._conns[r]: r for r in pending}
            waitables.update({self._procs[r].sentinel: r for r in pending})
            ready = mp.connection.wait(list(waitables), timeout=limit - now)
            for obj in ready:
                r = waitables[obj]
                if r not in pending:
                    continue
                conn = self._conns[r]
                if conn.poll():
                    try:
                        msg = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        msg = None
                else:
                    msg = None
                if msg is None:
                    if obj is conn and self._procs[r].is_alive():
                        continue
                    code = self._procs[r].exitcode
                    sig = f" (signal {signal.Signals(-code).name})" if code and code < 0 else ""
                    errors[r] = RemoteError("died", f"rank {r} exited with code {code}{sig} "
                                                    f"during {what}")
                elif msg[0] in ("ok", "ready"):
                    results[r] = msg[1]
                else:
                    errors[r] = RemoteError(msg[1], msg[2], msg[3])
                pending.discard(r)
                if r in errors and first_error is None:
                    first_error = (time.monotonic(), r)
        if not errors and not pending:
            return results
        timed_out = first_error is None
        for r in pending:
            errors[r] = RemoteError(
                "stopped",
                f"still running {what} after {timeout:g}s" if timed_out
                else f"still running {what} {grace:g}s after rank {first_error[1]} failed; killed")
        self._kill()
        raise self._error(errors, what, timeout, timed_out, first_error)

    def _error(self, errors: dict[int, RemoteError], what: str, timeout: float,
               timed_out: bool, first_error: tuple[float, int] | None) -> WorkerError:
        # Blame a root cause (an ordinary exception) before its consequences
        # (peers losing their connection, timeouts, kills).
        secondary = ("CollectiveError", "CollectiveTimeout", "stopped", "died")
        causes = [r for r in sorted(errors) if errors[r].kind not in secondary]
        blamed = causes[0] if causes else (first_error[1] if first_error else min(errors))
        e = errors[blamed]
        if timed_out:
            head = f"{what}: no result from ranks {sorted(errors)} within {timeout:g}s"
        else:
            head = f"{what}: rank {blamed} raised {e.line()}"
        lines = [head, "", "what every rank reported:"]
        lines += [f"  rank {r}: {errors[r].line()}" for r in sorted(errors)]
        if e.traceback:
            lines += ["", f"traceback of rank {blamed}:", e.traceback.rstrip()]
        return WorkerError("\n".join(lines), blamed, errors)
