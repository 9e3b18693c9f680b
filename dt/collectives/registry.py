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

from dt import args, transport
from dt.collectives.ops import ReduceOp
from dt.cost.traffic import ALIASES

F = TypeVar("F", bound=Callable[..., Any])

ALGORITHMS: dict[str, dict[str, Callable[..., Any]]] = {}
# Load/store algorithms: they read peers' memory, so they run only on a group
# whose ranks all share one host segment (dt.transport.connect's board).
SHARED_MEMORY: set[tuple[str, str]] = set()
# Fast paths (dt.collectives.plan): prepare(group, numel, dtype, op name) makes, once per call
# shape on a connected group, the callable that does only the per-call work; None where it cannot.
Prepare = Callable[[Any, int, Any, str], "Callable[[Any], None] | None"]
PREPARED: dict[tuple[str, str], Prepare] = {}


def algorithm(collective: str, name: str, *, shared_memory: bool = False,
              prepare: Prepare | None = None) -> Callable[[F], F]:
    """Register fn as `algorithm=name` of `collective` (shared_memory: a load/store algorithm;
    prepare: its fast path's maker, see dt.collectives.plan)."""

    def register(fn: F) -> F:
        if shared_memory:
            SHARED_MEMORY.add((collective, name))
        if prepare is not None:
            PREPARED[(collective, name)] = prepare

        @functools.wraps(fn)
        def charged(*args: Any, **kwargs: Any) -> Any:
            with transport.charged_to(collective, name):
                return fn(*args, **kwargs)

        ALGORITHMS.setdefault(collective, {})[name] = charged
        return charged  # type: ignore[return-value]

    return register


def equal_blocks(flat: Any, block: int, p: int) -> list[Any]:
    """p consecutive blocks of `block` elements of the flat tensor (p empty views when block is 0)."""
    return list(flat.split(block)) if block else [flat[:0]] * p


def tensor_forms(name: str, *, all_gather: Callable[..., Any] | None = None,
                 reduce_scatter: Callable[..., Any] | None = None) -> None:
    """Register algorithm `name` of all_gather_into_tensor / reduce_scatter_tensor as its list
    form run on p equal blocks of the flat tensor: the one adapter from list to tensor form."""
    if all_gather is not None:
        gather = all_gather

        def all_gather_into_tensor(output: Any, input: Any, group: object = None) -> None:
            p = transport.resolve_group(group).size
            gather(equal_blocks(output.view(-1), input.numel(), p), input, group)

        all_gather_into_tensor.__name__ = f"{name}_all_gather_into_tensor"
        algorithm("all_gather_into_tensor", name)(all_gather_into_tensor)
    if reduce_scatter is not None:
        scatter = reduce_scatter

        def reduce_scatter_tensor(output: Any, input: Any, op: object = ReduceOp.SUM,
                                  group: object = None) -> None:
            p = transport.resolve_group(group).size
            scatter(output, equal_blocks(input.view(-1), output.numel(), p), op, group)

        reduce_scatter_tensor.__name__ = f"{name}_reduce_scatter_tensor"
        algorithm("reduce_scatter_tensor", name)(reduce_scatter_tensor)


def register_aliases() -> None:
    """Make each alias in dt.cost.ALIASES ("naive" broadcast = "flat") selectable by name.

    Called once every algorithm is registered (dt/collectives/__init__.py).
    """
    for (collective, alias), target in ALIASES.items():
        table = ALGORITHMS.get(collective, {})
        if target in table:
            table[alias] = table[target]


def needs_shared_memory(collective: str, name: str) -> bool:
    return (collective, name) in SHARED_MEMORY


def is_alias(collective: str, name: str) -> bool:
    return (collective, name) in ALIASES


def lookup(collective: str, name: str) -> Callable[..., Any]:
    table = ALGORITHMS.get(collective, {})
    if name not in table:
        raise ValueError(
            f"{collective}: unknown algorithm {name!r}; choose one of "
            f"{sorted(table) + ['auto']}"
        )
    return table[name]


def forced_algorithms(text: str) -> tuple[tuple[str | None, str], ...]:
    """DT_ALGO's value as (collective, algorithm) pairs; collective None: every one that has it.

    `ring` forces the ring wherever a collective has one; `all_reduce=naive,broadcast=ring`
    sets it per collective; `auto` leaves the choice to the model. A name that is no
    algorithm (or no collective) is refused, with the nearest name and the valid ones.
    """
    every = sorted({name for table in ALGORITHMS.values() for name in table} | {"auto"})
    pairs: list[tuple[str | None, str]] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        collective, _, name = part.rpartition("=")
        collective, name = collective.strip() or None, name.strip()
        if collective is not None and collective not in ALGORITHMS:
            raise args.InputError(f"names no collective {collective!r} in {part!r}"
                                  f"{args.did_you_mean(collective, sorted(ALGORITHMS))}: one of "
                                  f"{', '.join(sorted(ALGORITHMS))}")
        known = every if collective is None else sorted(ALGORITHMS[collective]) + ["auto"]
        if name not in known:
            what = "algorithm" if collective is None else f"{collective} algorithm"
            raise args.InputError(f"names no {what} {name!r}{args.did_you_mean(name, known)}: one of "
                                  f"{', '.join(known)}")
        if name != "auto":
            pairs.append((collective, name))
    return tuple(pairs)


args.register("DT_ALGO", forced_algorithms, "force an algorithm (as NCCL_ALGO): ring, or "
                                            "all_reduce=naive,broadcast=ring")
