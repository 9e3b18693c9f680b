"""One worker pool per world size, started once and reused by every test.

`run(world, fn, *args)` runs the module-level function `fn` on `world`
processes that already hold a gloo process group, and returns each rank's
result. A run that fails restarts its pool, so one failing test cannot poison
the next. Every run has a timeout; pytest-timeout bounds every test as well.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

from dt.launcher import WorkerPool

WORLD_SIZES = (1, 2, 3, 4, 5, 8)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_temp_dirs():
    """Fails the session if a dt-* temporary directory it made is left behind.

    The session (and every worker it starts: they inherit TMPDIR) makes its
    temporary files in a directory of its own, so another run's leftovers on
    a shared machine cannot fail this one; it is removed at the end.
    """
    # multiprocessing's own directory for this process stays where it is: it removes it at exit,
    # after this fixture has removed the private one
    multiprocessing.util.get_temp_dir()
    private = tempfile.mkdtemp(prefix="dt-suite-")
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = private, None
    yield
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None
    left = sorted(name for name in os.listdir(private) if name.startswith("dt-"))
    shutil.rmtree(private, ignore_errors=True)
    assert not left, f"the suite left {len(left)} dt-* temporary directories behind: {', '.join(left[:5])}"


@pytest.fixture(autouse=True)
def whole_timing_budget(monkeypatch):
    """Each test plans with the planner's whole timing budget (dt.plan.timed.BUDGET): it is spent per
    process, and a whole suite's plans would otherwise spend it, leaving later tests' stages priced
    by rate instead of timed. The timings themselves stay cached (each shape timed once a process)."""
    from dt.plan import timed

    monkeypatch.setattr(timed, "BUDGET", timed.TimingBudget())


@pytest.fixture(scope="session")
def pools():
    cache: dict[int, WorkerPool] = {}

    def get(world: int) -> WorkerPool:
        if world not in cache:
            cache[world] = WorkerPool(world)
        return cache[world]

    yield get
    for pool in cache.values():
        pool.close()


@pytest.fixture(scope="session")
def run(pools) -> Callable[..., list[Any]]:
    def _run(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0,
             **kwargs: Any) -> list[Any]:
        return pools(world).run(fn, *args, timeout=timeout, **kwargs)

    return _run
