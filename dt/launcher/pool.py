"""WorkerPool and run_workers: N local processes, a function on each, every failure reported.

See the package docstring (dt/launcher/__init__.py) for what the pool promises.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dt.args import ENVIRONMENT, check_local_world
from dt.launcher import preflight, tempdirs, worker
from dt.launcher.group import launcher_wait, resolve_backend
from dt.launcher.worker import worker_main
from dt.transport import liveness, settings

__all__ = ["COLLECTIVE_ERRORS", "DEADLINE_GRACE_S", "GRACE_S", "RemoteError", "Terminated", "WorkerError",
           "WorkerPool", "blame", "run_workers"]

DEFAULT_TIMEOUT = settings.DEFAULT_TIMEOUT
GRACE_S = 5.0  # after the first error, how long the other ranks get to report theirs
DEADLINE_GRACE_S = 3.0  # after a run's timeout, how long stuck ranks get to say where they are
COLLECTIVE_ERRORS = ("CollectiveError", "CollectiveTimeout")  # the transport announced those


class Terminated(SystemExit):
    """The launcher got SIGTERM or SIGHUP: its workers were stopped; exit status 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signal = signal.Signals(signum).name


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


def run_workers(fn: Callable[..., Any], world_size: int, *args: Any,
                timeout: float = DEFAULT_TIMEOUT, backend: str = "gloo", **kwargs: Any) -> list[Any]:
    """Run fn(*args, **kwargs) on `world_size` fresh processes; return each rank's result.

    `fn` must be importable by name (a module-level function), as with any
    multiprocessing start method that does not fork the caller; what would make
    the workers die before they run it is refused first, in one line (preflight.py).
    """
    with WorkerPool(world_size, backend=backend) as pool:
        return pool.run(fn, *args, timeout=timeout, **kwargs)


def _context() -> Any:
    # forkserver: workers fork from a clean server that has already imported
    # torch, so a start costs a fork, not an import, and never inherits the
    # caller's OpenMP threads (fork after OpenMP start-up can hang).
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "dt"])
    return ctx


@contextlib.contextmanager
def signals_raise_terminated(override: bool = False) -> Iterator[None]:
    """While the block runs: SIGTERM and SIGHUP raise Terminated (not a silent death), so the
    caller cleans up first (the pool stops its workers; dt cluster tears its hosts down).
    Only from the main thread; a handler someone else installed is kept unless `override`."""
    def stop(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if override or signal.getsignal(sig) == signal.SIG_DFL:
                old[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class WorkerPool:
    """`world_size` processes with a live process group, reused across runs."""

    def __init__(self, world_size: int, backend: str = "gloo", threads_per_worker: int | None = None):
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        check_local_world(world_size)  # before a process starts: a typo must not exhaust the machine
        self.world_size = world_size
        self.backend = resolve_backend(backend)
        self.threads = threads_per_worker or worker.threads_per_worker(world_size)
        self._procs: list[Any] = []
        self._conns: list[Any] = []  # jobs down, results up
        self._news: list[Any] = []  # failures both ways (dt.transport.liveness); end of file: gone
        self._heard: list[liveness.Failure] = []  # every failure told since the last start
        self._store_dir: str | None = None  # the rendezvous file's directory, while workers run
        self.starts = 0

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            self.close()
        else:  # interrupted or failed: nobody waits on the workers any longer
            self._kill()

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty before the first run)."""
        return [p.pid for p in self._procs]

    # -- life cycle ---------------------------------------------------------
    def _start(self) -> None:
        preflight.check_before_start()
        tempdirs.sweep()  # what SIGKILLed launchers left
        tempdirs.own_multiprocessing_dir()  # before the fork server makes its socket's
        ctx = _context()
        # The rendezvous is a file, not a TCPStore on localhost: every TCPStore connection
        # names its peer by a reverse DNS lookup of ::ffff:127.0.0.1 (c10d connects over
        # IPv6 first, and /etc/hosts only knows 127.0.0.1), so a DNS server that drops a
        # query stalled the start by the resolver's 5 s timeout. A file needs no name, no
        # port, and no port race; the directory is ours alone and goes with the workers.
        self._store_dir = tempdirs.make("pool")
        store_path = os.path.join(self._store_dir, "store")
        self._heard = []
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            news_end, child_news = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, name=f"dt-rank{rank}",
                               args=(rank, self.world_size, store_path, self.backend, child_end, child_news,
                                     list(sys.path), self.threads), daemon=True)
            proc.start()
            child_end.close()
            child_news.close()  # the launcher holds the only other end: its death is our EOF
            self._procs.append(proc)
            self._conns.append(parent_end)
            self._news.append(news_end)
        self.starts += 1
        self._collect(timeout=120.0, grace=0.0, what="start-up")

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
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in self._procs:
            p.join(5.0)
        for c in self._conns + self._news:
            c.close()
        if self._store_dir is not None:
            shutil.rmtree(self._store_dir, ignore_errors=True)
        self._procs, self._conns, self._news, self._store_dir = [], [], [], None

    def _tell(self, failure: liveness.Failure) -> None:
        """Relay a failure to every rank (the one it came from included)."""
        self._heard.append(failure)
        for c in self._news:
            with contextlib.suppress(OSError):
                c.send_bytes(liveness.encode(failure))

    # -- running ------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT,
            **kwargs: Any) -> list[Any]:
        """fn(*args, **kwargs) on every rank; the list of results in rank order."""
        timeout = settings.parse_timeout(timeout, "run_workers timeout")
        wait_timeout = launcher_wait(timeout)  # DT_TIMEOUT and set_timeout come first
        # The caller's DT_TIMEOUT / DT_VALIDATE as they are now (checked here: every rank
        # would refuse them alike): a worker forked from a fork server started earlier
        # would otherwise see the server's.
        settings.check_environment()
        env = {name: os.environ.get(name) for name in ENVIRONMENT}
        payload = preflight.job_payload(fn, args, kwargs, wait_timeout, env)
        with signals_raise_terminated():
            try:
                if not self._procs:
                    self._start()
                for c in self._conns:
                    c.send_bytes(payload)
                results = self._collect(timeout=timeout, grace=GRACE_S,
                                        what=getattr(fn, "__name__", "fn"))
            except BaseException:  # Ctrl-C, SIGTERM, or a failed start: stop every worker
                self._kill()
                raise
        if self._heard:  # a rank failed and carried on: its group is broken, start afresh
            self.close()
        return results

    def _collect(self, timeout: float, grace: float, what: str) -> list[Any]:
        n = self.world_size
        results: list[Any] = [None] * n
        errors: dict[int, RemoteError] = {}
        order: list[int] = []  # ranks in the order their error or death arrived
        pending = set(range(n))
        deadline = time.monotonic() + timeout
        limit = deadline
        timed_out = False
        while pending:
            now = time.monotonic()
            if now >= limit:
                if timed_out or order or not grace:
                    break
                # The run's time is up: tell every rank, so the stuck ones say where they
                # are (their collective, step and peer) before they are killed.
                timed_out = True
                limit = now + DEADLINE_GRACE_S
                self._tell(liveness.Failure(
                    liveness.EVERYONE, "deadline", f"the run passed its {timeout:g}s timeout"))
                continue
            waitables = {self._conns[r]: r for r in pending}
            waitables.update({self._procs[r].sentinel: r for r in pending})
            news = {c: r for r, c in enumerate(self._news) if not c.closed}
            for obj in mp.connection.wait([*waitables, *news], timeout=limit - now):
                if obj in news:  # a rank announced a failure of its own: everyone hears it
                    try:
                        self._tell(liveness.decode(obj.recv_bytes()))
                    except (EOFError, OSError):
                        obj.close()  # that rank has exited; its sentinel says how
                    continue
                r = waitables[obj]
                if r not in pending:
                    continue
                reply = self._reply(r, obj, what)
                if reply is None:
                    continue  # end of pipe seen before the exit: the sentinel follows
                pending.discard(r)
                if isinstance(reply, RemoteError):
                    errors[r] = reply
                    order.append(r)
                    if len(order) == 1 and not timed_out:
                        limit = min(deadline, time.monotonic() + grace)
                else:
                    results[r] = reply[1]
        if not errors and not pending:
            return results
        for r in pending:
            errors[r] = RemoteError(
                "stopped",
                f"still running {what} after {timeout:g}s" if timed_out
                else f"still running {what} {grace:g}s after rank {order[0]} failed; killed")
        self._drain_news()
        self._kill()
        raise blame(errors, order, what, timeout, timed_out, self._heard)

    def _drain_news(self) -> None:
        """Relay what the ranks announced but the loop has not read yet (blame reads it)."""
        for c in self._news:
            with contextlib.suppress(EOFError, OSError):
                while not c.closed and c.poll():
                    self._tell(liveness.decode(c.recv_bytes()))

    def _reply(self, r: int, obj: Any, what: str) -> Any:
        """Rank r's reply ("ok"/"ready", value), a RemoteError, or None for "not yet".

        A death or an exception is announced at once (dt.transport.liveness), so
        the other ranks stop waiting on rank r and say that it failed.
        """
        conn, proc = self._conns[r], self._procs[r]
        msg = None
        if conn.poll():
            with contextlib.suppress(EOFError, OSError):
                msg = pickle.loads(conn.recv_bytes())
        if msg is None:
            if obj is conn and proc.is_alive():
                return None
            proc.join(1.0)
            code = proc.exitcode
            how = (f"died (signal {signal.Signals(-code).name})" if code is not None and code < 0
                   else f"exited with code {code}")
            self._tell(liveness.Failure(r, "died", f"rank {r} {how}"))
            return RemoteError("died", f"rank {r} {how} during {what}")
        if msg[0] in ("ok", "ready"):
            return msg
        if msg[1] not in COLLECTIVE_ERRORS and not msg[4]:  # [4]: every rank raises it too
            first = msg[2].splitlines()[0] if msg[2] else ""
            self._tell(liveness.Failure(r, "raised", f"rank {r} raised {msg[1]}: {first}"))
        return RemoteError(msg[1], msg[2], msg[3])


def blame(errors: dict[int, RemoteError], order: list[int], what: str, timeout: float,
          timed_out: bool, failures: Sequence[liveness.Failure] = ()) -> WorkerError:
    """The WorkerError of a failed run: the rank where it started first, then what every rank said.

    `failures`: what the ranks announced (dt.transport.liveness); a rank that never
    arrived is found from them: the one the timed-out ranks waited on.
    """
    # Blame where it started: the first rank that died or raised something of its own,
    # before its consequences (peers that lost it, timeouts, kills).
    secondary = (*COLLECTIVE_ERRORS, "stopped")
    causes = [r for r in order if errors[r].kind not in secondary]
    late = None if causes else _never_arrived(errors, failures)
    if late is not None:
        blamed, waited = late
        head = f"{what}: rank {blamed} never arrived: {waited.text}"
        shown = waited.rank if waited.rank in errors else blamed
    else:
        blamed = causes[0] if causes else (order[0] if order else min(errors))
        shown = blamed
        e = errors[blamed]
        if timed_out and not causes:
            head = f"{what}: no result from ranks {sorted(errors)} within {timeout:g}s"
        elif e.kind == "died":
            head = f"{what}: {e.message}"
        else:
            head = f"{what}: rank {blamed} raised {e.line()}"
    lines = [head, "", "what every rank reported:"]
    lines += [f"  rank {r}: {errors[r].line()}" for r in sorted(errors)]
    if errors.get(shown, RemoteError("", "")).traceback:
        lines += ["", f"traceback of rank {shown}:", errors[shown].traceback.rstrip()]
    return WorkerError("\n".join(lines), blamed, errors)


def _never_arrived(errors: dict[int, RemoteError],
                   failures: Sequence[liveness.Failure]) -> tuple[int, liveness.Failure] | None:
    """The rank the first timed-out rank waited on (following who waited on whom), with that
    timeout, if that rank failed in nothing of its own: it was late (still running, or gone on)."""
    waited_on = {f.rank: f for f in reversed(failures) if f.kind == "timeout" and f.blame >= 0}
    for f in failures:
        if f.kind != "timeout" or f.blame < 0:
            continue
        seen, last = {f.rank}, f
        while last.blame in waited_on and last.blame not in seen:  # it timed out on another
            seen.add(last.blame)
            last = waited_on[last.blame]
        if last.blame in seen:
            continue  # a cycle of timeouts: nobody in it was late
        if last.blame not in errors or errors[last.blame].kind == "stopped":
            return last.blame, last
    return None
