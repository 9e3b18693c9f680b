"""Algorithms by name: what `algorithm=` in the dispatchers chooses from, and what each costs.

Each algorithm is a plain function with torch.distributed's signature for
its collective (e.g. `ring_all_reduce(tensor, op=ReduceOp.SUM, group=None)`),
registered with one record beside it:

    @algorithm("all_reduce", "ring", traffic=..., formula=textbook.ring_all_reduce,
               levels=levels.ring_all_reduce)

Called directly, it runs with no cross-rank validation and no async; through
the dispatcher it gets both. Its traffic is charged to its collective either way.

The record's arithmetic lives in dt.cost (cost is below collectives in the layer
order, and dt.cost must not import dt.collectives): `traffic` takes a
dt.cost.records.Call and returns the exact per-rank RankTraffic, `formula` the
textbook (steps, bytes, reduced bytes), `levels` the two-level schedule. The
decorator hands them down to dt.cost.records, the one table `traffic_for`,
`formula`, `schedule`, LEVELED and `auto`'s candidates all read; so the arrow
points one way (collectives -> cost), and adding an algorithm edits its own file
(plus its arithmetic in dt.cost, which no table names). Why this way round: a
table kept here would need traffic_for and formula to move up into the
collectives, and everything that prices without running (ZeRO's formulas, the
study, `dt model`, the judge) would then import them; a table kept in dt.cost
beside the arithmetic would leave the algorithm's file silent about its cost and
bring back the string-keyed tables. `unpriced()` says where registry and records
disagree (tests/test_registry.py). A tensor form (`all_gather_into_tensor` ...) is priced as its collective's
record (dt.cost.family); `tensor_forms` makes it from the list form.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dt import args, transport
from dt.collectives.ops import ReduceOp
from dt.cost import records
from dt.cost.records import ALIASES, COSTS, CostRecord, Formula, Schedule, Traffic, family

F = TypeVar("F", bound=Callable[..., Any])

ALGORITHMS: dict[str, dict[str, Callable[..., Any]]] = {}
# Load/store algorithms: they read peers' memory, so they run only on a group
# whose ranks all share one host segment (dt.transport.connect's board).
SHARED_MEMORY: set[tuple[str, str]] = set()
# Fast paths (dt.collectives.plan): prepare(group, numel, dtype, op name) makes, once per call
# shape on a connected group, the callable that does only the per-call work; None where it cannot.
Prepare = Callable[[Any, int, Any, str], "Callable[[Any], None] | None"]
PREPARED: dict[tuple[str, str], Prepare] = {}
POINT_TO_POINT = ("shm", "torch")  # the wires a point-to-point algorithm runs on (dt.transport)


def algorithm(collective: str, name: str, *, traffic: Traffic | None = None, formula: Formula | None = None,
              levels: Schedule | None = None, aliases: tuple[str, ...] = (), shared_memory: bool = False,
              prepare: Prepare | None = None) -> Callable[[F], F]:
    """Register fn as `algorithm=name` of `collective`, with its cost record.

    traffic, formula, levels: dt.cost's functions for it (see the module doc; a tensor
    form takes its collective's); aliases: other names that select it; shared_memory: a
    load/store algorithm; prepare: its fast path's maker, see dt.collectives.plan.
    """

    def register(fn: F) -> F:
        if shared_memory:
            SHARED_MEMORY.add((collective, name))
        if prepare is not None:
            PREPARED[(collective, name)] = prepare

        run = charged(fn, collective, name)
        table = ALGORITHMS.setdefault(collective, {})
        for each in (name, *aliases):
            table[each] = run
        if family(collective) == collective:
            wires = ("shm",) if shared_memory else POINT_TO_POINT
            records.register(CostRecord(collective, name, traffic, formula, levels, wires), aliases)
        return run

    return register


def charged(fn: F, collective: str, label: str) -> F:
    """fn with its traffic charged to `collective:label`: THE place a collective's label is set.

    Every registered algorithm runs through it, from the dispatchers (dt.collectives.api
    looks it up; an alias is charged under the algorithm's own name) or called directly;
    an algorithm built from others (naive all-reduce = reduce + broadcast) is charged
    once, to the outermost. The transport reads the label (accounting.label), it never
    sets one.
    """

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with transport.charged_to(collective, label):
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def equal_blocks(flat: Any, block: int, p: int) -> list[Any]:
    """p consecutive blocks of `block` elements of the flat tensor (p empty views when block is 0)."""
    return list(flat.split(block)) if block else [flat[:0]] * p


def tensor_forms(name: str, *, all_gather: Callable[..., Any] | None = None,
                 reduce_scatter: Callable[..., Any] | None = None,
                 shared_memory: bool = False) -> tuple[Callable[..., Any], ...]:
    """Register algorithm `name` of all_gather_into_tensor / reduce_scatter_tensor as its list
    form run on p equal blocks of the flat tensor: the one adapter from list to tensor form.

    The blocks are views that lie back to back, so a list form that gathers into (or reads
    from) one flat buffer can use the tensor itself (`joined`). Returns the registered
    forms (all-gather's, then reduce-scatter's)."""
    made = []
    if all_gather is not None:
        gather = all_gather

        def all_gather_into_tensor(output: Any, input: Any, group: object = None) -> None:
            p = transport.resolve_group(group).size
            gather(equal_blocks(output.view(-1), input.numel(), p), input, group)

        all_gather_into_tensor.__name__ = f"{name}_all_gather_into_tensor"
        made.append(algorithm("all_gather_into_tensor", name,
                              shared_memory=shared_memory)(all_gather_into_tensor))
    if reduce_scatter is not None:
        scatter = reduce_scatter

        def reduce_scatter_tensor(output: Any, input: Any, op: object = ReduceOp.SUM,
                                  group: object = None) -> None:
            p = transport.resolve_group(group).size
            scatter(output, equal_blocks(input.view(-1), output.numel(), p), op, group)

        reduce_scatter_tensor.__name__ = f"{name}_reduce_scatter_tensor"
        made.append(algorithm("reduce_scatter_tensor", name,
                              shared_memory=shared_memory)(reduce_scatter_tensor))
    return tuple(made)


def joined(blocks: list[Any]) -> Any:
    """One flat tensor over all the blocks when they lie back to back in memory (the views
    `tensor_forms` passes; ZeRO's flat gradients split into shards), so a list form can work
    in that memory directly; else None."""
    if not blocks or not all(b.is_contiguous() for b in blocks):
        return None
    isz, at = blocks[0].element_size(), blocks[0].data_ptr()
    for b in blocks:
        if b.data_ptr() != at and b.numel():
            return None
        at += b.numel() * isz
    return blocks[0].as_strided((sum(b.numel() for b in blocks),), (1,))


def unpriced(algorithms: Mapping[str, Mapping[str, Any]] | None = None,
             costs: Mapping[tuple[str, str], CostRecord] | None = None) -> list[str]:
    """What the registry and the cost tables disagree on, one line each (empty: they agree).

    Every registered algorithm needs a record with its exact traffic and a price (a
    textbook formula, or a two-level schedule); every record must name a registered
    algorithm. Defaults: this registry and dt.cost's table.
    """
    algorithms = ALGORITHMS if algorithms is None else algorithms
    costs = COSTS if costs is None else costs
    wrong = []
    for collective in sorted(algorithms):
        base = family(collective)
        for name in sorted(algorithms[collective]):
            record = costs.get((base, ALIASES.get((base, name), name)))
            if record is None:
                wrong.append(f"{collective} {name}: registered without a cost record")
            elif record.traffic is None:
                wrong.append(f"{collective} {name}: registered without traffic=")
            elif record.formula is None and record.levels is None:
                wrong.append(f"{collective} {name}: registered without formula= (or levels=)")
    for collective, name in sorted(costs):
        if name not in algorithms.get(collective, {}):
            wrong.append(f"{collective} {name}: a cost record names no registered algorithm")
    return wrong


def names(collective: str, *, loadstore: bool | None = None) -> list[str]:
    """The algorithms registered for `collective`, aliases left out, sorted (loadstore: True
    only the load/store ones, False only the point-to-point ones, None all): what the
    tests' and the tools' lists of algorithms are made from."""
    return [name for name in sorted(ALGORITHMS.get(collective, {})) if not is_alias(collective, name)
            and loadstore in (None, needs_shared_memory(collective, name))]


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
