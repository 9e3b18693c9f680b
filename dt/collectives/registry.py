"""Algorithms by name: what `algorithm=` in the dispatchers chooses from.

Each algorithm is a plain function with torch.distributed's signature for
its collective (e.g. `ring_all_reduce(tensor, op=ReduceOp.SUM, group=None)`),
registered with `@algorithm("all_reduce", "ring")`. Called directly, it runs
with no cross-rank validation and no async; through the dispatcher it gets
both. Its traffic is charged to its collective either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from dt import transport

F = TypeVar("F", bound=Callable[..., Any])

ALGORITHMS: dict[str, dict[str, Callable[..., Any]]] = {}


def algorithm(collective: str, name: str) -> Callable[[F], F]:
    def register(fn: F) -> F:
        @functools.wraps(fn)
        def charged(*args: Any, **kwargs: Any) -> Any:
            with transport.charged_to(collective, name):
                return fn(*args, **kwargs)

        ALGORITHMS.setdefault(collective, {})[name] = charged
        return charged  # type: ignore[return-value]

    return register


def lookup(collective: str, name: str) -> Callable[..., Any]:
    table = ALGORITHMS.get(collective, {})
    if name not in table:
        raise ValueError(
            f"{collective}: unknown algorithm {name!r}; choose one of "
            f"{sorted(table) + ['auto']}"
        )
    return table[name]
