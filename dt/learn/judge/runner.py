"""The judge's own processes: bounded, restarted when broken, never left behind.

One `WorkerPool` (dt.launcher) per world size, one worker thread of torch
each (the cases are small; the ranks share the machine's cores). Each case
is one `pool.run` with a wall-clock limit. Three clocks bound it, shortest first:

- the instrumentation's wait timeout (`timeout`): a rank waiting that long on
  one message raises and says what it waited on (a deadlock);
- faulthandler in the worker (`hang_after`): a rank still running after that
  (a loop that never ends) writes its stack to its log and exits;
- the pool's own limit (`hang_after` + a margin): whatever is left is killed.

After any case that did not end cleanly (a rank timed out, raised in the
middle of a message, crashed or was killed) the pool is closed, and the next
case starts fresh processes: a timed-out gloo pair cannot be trusted again.
Every rank writes its events and its output to files in a temporary folder
(worker.log_paths); `logs` reads them back, whatever became of the process.
`close` (or leaving the `with` block, Ctrl-C included) ends every process and
removes the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dt.launcher import WorkerError, WorkerPool
from dt.learn.judge.worker import log_paths

__all__ = ["RankLog", "Runner"]

_MARGIN_S = 15.0
_OUTPUT_CHARS = 4000


@dataclass
class RankLog:
    """What one rank left behind for one case: its events (instrument.py) and its output."""

    events: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""


def _ready() -> bool:
    return True


class Runner:
    """Worker pools for the judge, one per world size; a context manager."""

    def __init__(self, timeout: float = 10.0, hang_after: float | None = None):
        self.timeout = timeout
        self.hang_after = hang_after if hang_after is not None else 3 * timeout + 5
        self.logdir = tempfile.mkdtemp(prefix="dt-judge-")
        self._pools: dict[int, WorkerPool] = {}
        self.starts = 0

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, world: int, fn: Callable[..., Any], *args: Any, hang_after: float | None = None,
            limit: float | None = None) -> tuple[list[Any] | None, WorkerError | None]:
        """(every rank's result, None), or (None, the failure) when a rank died or was killed.

        The run is killed after `limit` seconds (default: `hang_after` and a margin).
        """
        pool = self._pools.get(world)
        if pool is None:
            pool = WorkerPool(world, threads_per_worker=1)
            try:
                pool.run(_ready, timeout=120.0)  # a failed start is the judge's failure, not a verdict
            except WorkerError as exc:
                raise RuntimeError(f"the judge could not start {world} processes:\n{exc}") from None
            self._pools[world] = pool
        before = pool.starts
        try:
            limit = limit or (hang_after or self.hang_after) + _MARGIN_S
            return pool.run(fn, *args, timeout=limit), None
        except WorkerError as exc:  # the pool has already killed its processes
            return None, exc
        finally:
            self.starts += pool.starts - before

    def restart(self, world: int) -> None:
        """End this world's processes; the next run starts new ones."""
        pool = self._pools.pop(world, None)
        if pool is not None:
            pool.close()

    def logs(self, world: int) -> list[RankLog]:
        out = []
        for rank in range(world):
            events_path, output_path = log_paths(self.logdir, world, rank)
            log = RankLog()
            if os.path.exists(events_path):
                with open(events_path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        try:
                            log.events.append(json.loads(line))
                        except ValueError:
                            pass  # a line cut short by a crash
            if os.path.exists(output_path):
                with open(output_path, encoding="utf-8", errors="replace") as f:
                    log.output = f.read()[-_OUTPUT_CHARS:]
            out.append(log)
        return out

    def close(self) -> None:
        for world in list(self._pools):
            self.restart(world)
        shutil.rmtree(self.logdir, ignore_errors=True)
