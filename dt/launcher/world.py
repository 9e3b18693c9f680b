"""The world a tool runs on: the ranks torchrun launched, or local processes it starts.

    with open_world(size, backend) as world:      # every tool, one way
        per_rank = world.run(fn, *args)          # every rank's result, in rank order, on every rank

Under torchrun (RANK, WORLD_SIZE and MASTER_ADDR in the environment) this
process *is* one rank: `LaunchedWorld.run` runs fn here, on every rank at
once, and gathers every rank's result (or error) through torchrun's own store,
the one its agents rendezvous on, so a table printed on rank 0 covers every
host. Elsewhere it is a local WorkerPool, as before. Tools say in one line
when the world asked for on their command line is not the launched one
(`resolve_world`), and only rank 0 writes to stdout (`rank_zero_output`): every
rank holds the same gathered figures, one table is enough.

The store carries results the way the local pool's pipes do: it is the
launcher's channel, not a collective, and its bytes are not dt's traffic.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from dt import transport
from dt.launcher.group import launcher_wait, resolve_backend, start_run
from dt.launcher.pool import (
    COLLECTIVE_ERRORS,
    DEADLINE_GRACE_S,
    DEFAULT_TIMEOUT,
    GRACE_S,
    RemoteError,
    WorkerPool,
    blame,
)
from dt.launcher.torchrun import die_with_agent, init, under_torchrun
from dt.transport import liveness, settings

__all__ = ["LaunchedWorld", "WorldConflict", "launch", "launched_rank", "launched_size", "open_world",
           "rank_zero_output", "resolve_world"]


def launched_size() -> int | None:
    """WORLD_SIZE under torchrun, else None."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def launched_rank() -> int:
    """This process's rank under torchrun (0 elsewhere: the launcher speaks for its workers)."""
    return int(os.environ["RANK"]) if under_torchrun() else 0


class WorldConflict(ValueError):
    """A tool's world size option disagrees with the world torchrun launched."""


def resolve_world(requested: int | None, default: int, option: str = "--world") -> int:
    """The tool's world: the launched one under torchrun (requested must agree), else requested or default."""
    launched = launched_size()
    if launched is None:
        return default if requested is None else requested
    if requested is not None and requested != launched:
        raise WorldConflict(f"{option} {requested} conflicts with the {launched} ranks torchrun launched "
                            f"(drop {option}, or launch {requested})")
    return launched


# Every rank runs the same jobs in the same order, so a count names a job's keys alike on
# all of them; one count per process, so a second LaunchedWorld never reads the first's keys.
_RUNS = itertools.count()
_POLL_S = 0.05  # how often a rank looks for the others' replies


class LaunchedWorld:
    """This rank of a torchrun world: `run` gathers every rank's result through torchrun's store."""

    def __init__(self, backend: str = "gloo", timeout: float = DEFAULT_TIMEOUT):
        self.backend = resolve_backend(backend)
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.rank = int(os.environ["RANK"])
        self._timeout = timeout
        self._store: Any = None
        die_with_agent()  # from the start: the tool may work a while before its first run

    def __enter__(self) -> LaunchedWorld:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to stop: torchrun owns the processes and the group outlives the tool."""
        self._store = None

    def _results_store(self, timeout: float) -> Any:
        if self._store is None:
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                                  timeout=datetime.timedelta(seconds=timeout))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            self._store = dist.PrefixStore(f"dt/world/attempt{attempt}", store)
        self._store.set_timeout(datetime.timedelta(seconds=timeout))
        return self._store

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT,
            **kwargs: Any) -> list[Any]:
        """fn(*args, **kwargs) on this rank; every rank's result in rank order (or WorkerError).

        As in the local pool, once one rank has failed the others get a short grace to
        report, then the run ends here (a WorkerError) without waiting on the rest: this
        rank exits, and torchrun stops the ranks still running. `timeout` counts from
        the start of the run; past it the stuck ranks are told (they say where they are).
        """
        timeout = settings.parse_timeout(timeout, "run timeout")
        started = time.monotonic()
        init(self.backend, self._timeout)
        # Each run starts as the pool's worker starts one: the process (and its group) outlive
        # the last run here, its settings, links, threads and records must not. The transport's
        # own waits end first, so a stuck rank says where.
        start_run(launcher_wait(timeout))
        try:
            reply = ("ok", fn(*args, **kwargs))
        except Exception as exc:  # every rank's error is gathered, like its result
            reply = ("error", RemoteError(type(exc).__name__, str(exc), traceback.format_exc()),
                     transport.is_everywhere(exc))
            if type(exc).__name__ not in COLLECTIVE_ERRORS and not reply[2]:
                # a fault of this rank's own: the others' waits on it end now (as the pool tells them)
                first = str(exc).splitlines()[0] if str(exc) else ""
                liveness.announce(liveness.Failure(self.rank, "raised",
                                                   f"rank {self.rank} raised {type(exc).__name__}: {first}"))
        what = getattr(fn, "__name__", "fn")
        gathered = _Gathering(self._results_store(timeout + GRACE_S), f"run{next(_RUNS)}",
                              self.world_size)
        gathered.post(self.rank, reply)
        results, errors, timed_out = gathered.collect(started + timeout, timeout, what)
        if errors:
            raise blame(errors, gathered.order, what, timeout, timed_out, liveness.failures())
        return results


class _Gathering:
    """One run's replies in the store: `post` this rank's, `collect` every rank's.

    Keys: <job>/<rank> (a pickled reply), <job>/errors (how many replies are errors),
    <job>/deadline (the first rank past the deadline announces it, once).
    """

    def __init__(self, store: Any, job: str, world_size: int):
        self.store, self.job, self.n = store, job, world_size
        self.order: list[int] = []  # ranks whose error this rank read, in that order

    def post(self, rank: int, reply: tuple) -> None:
        self.store.set(f"{self.job}/{rank}", pickle.dumps(reply))
        if reply[0] != "ok":
            self.store.add(f"{self.job}/errors", 1)

    def collect(self, deadline: float, timeout: float, what: str
                ) -> tuple[list[Any], dict[int, RemoteError], bool]:
        results: list[Any] = [None] * self.n
        errors: dict[int, RemoteError] = {}
        pending, limit, timed_out, failed = list(range(self.n)), deadline, False, False
        while True:
            for r in [r for r in pending if self.store.check([f"{self.job}/{r}"])]:
                pending.remove(r)
                theirs = pickle.loads(self.store.get(f"{self.job}/{r}"))
                if theirs[0] == "ok":
                    results[r] = theirs[1]
                else:
                    errors[r] = theirs[1]
                    self.order.append(r)
            now = time.monotonic()
            if not pending:
                break
            if not failed and (errors or self.store.add(f"{self.job}/errors", 0)):
                failed, limit = True, min(limit, now + GRACE_S)  # a rank failed: the rest get a grace
            if now >= limit:
                if failed or timed_out:
                    break
                # The run's time is up: tell every rank, so the stuck ones say where they are.
                timed_out, limit = True, now + DEADLINE_GRACE_S
                if self.store.add(f"{self.job}/deadline", 1) == 1:
                    liveness.announce(liveness.Failure(
                        liveness.EVERYONE, "deadline", f"the run passed its {timeout:g}s timeout"))
                continue
            time.sleep(min(_POLL_S, max(0.0, limit - now)))
        for r in pending:  # the words of the local pool's, which kills them (here torchrun does)
            errors[r] = RemoteError("stopped", f"still running {what} after {timeout:g}s" if timed_out
                                    else f"still running {what} {GRACE_S:g}s after rank "
                                         f"{self.order[0] if self.order else '?'} failed")
        return results, errors, timed_out


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = DEFAULT_TIMEOUT,
           backend: str = "auto", **kwargs: Any) -> list[Any]:
    """fn(*args) on every rank (the launched ones, or `world_size` local processes); each one's result."""
    with open_world(world_size, backend, timeout=timeout) as world:
        return world.run(fn, *args, timeout=timeout, **kwargs)


def open_world(size: int, backend: str = "gloo", threads_per_worker: int | None = None,
               timeout: float = DEFAULT_TIMEOUT) -> WorkerPool | LaunchedWorld:
    """The launched world under torchrun (its size must be `size`), else a local pool of `size`."""
    launched = launched_size()
    if launched is None:
        return WorkerPool(size, backend=backend, threads_per_worker=threads_per_worker)
    if size != launched:
        raise WorldConflict(f"this run needs {size} ranks, but torchrun launched {launched}")
    return LaunchedWorld(backend, timeout)


@contextlib.contextmanager
def rank_zero_output() -> Iterator[None]:
    """Under torchrun, ranks other than 0 write nothing to stdout (every rank holds the same report).

    The file descriptor itself is pointed at /dev/null: reports bound to
    sys.stdout when their module was imported (`out=sys.stdout` defaults) go
    there too.
    """
    if launched_rank() == 0:
        yield
        return
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
