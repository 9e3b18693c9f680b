"""One worker pool per world size, started once and reused by every test.

`run(world, fn, *args)` runs the module-level function `fn` on `world`
processes that already hold a gloo process group, and returns each rank's
result. A run that fails restarts its pool, so one failing test cannot poison
the next. Every run has a timeout; pytest-timeout bounds every test as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dt.launcher import WorkerPool

WORLD_SIZES = (1, 2, 3, 4, 5, 8)


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
