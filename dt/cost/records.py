"""Every algorithm's cost record, by (collective, name): the one table dt.cost prices from.

A record holds what an algorithm costs: its exact per-rank traffic (what
dt.traffic() counts), its textbook formula (dt.cost.time), its two-level
schedule (dt.cost.levels), and the wires it runs on. The records are
declared beside the algorithms, in dt/collectives/*.py, by
`@algorithm(collective, name, traffic=..., formula=..., levels=...)`
(dt.collectives.registry), which registers them here.

The table lives in dt.cost, not in dt.collectives, so that dependencies point
one way: the algorithm files import their arithmetic from dt.cost and hand it
down; dt.cost never imports dt.collectives, and every cost question
(`traffic_for`, `formula`, `schedule`) is a lookup in this table followed by
a call of dt.cost's own arithmetic. Importing any module of `dt` runs
dt/__init__.py, which imports dt.collectives: the table is full before anyone
can ask it.

`family` and `canonical` are the one place a collective's API forms and an
algorithm's aliases are resolved: every table keyed by collective asks them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ALIASES", "COSTS", "FORMS", "LEVELED", "LOADSTORE", "Call", "CostRecord", "RankTraffic",
           "call_of", "canonical", "family", "record_for", "register"]


@dataclass(frozen=True)
class RankTraffic:
    """One rank's share of one collective call, predicted (dt.traffic() measures it)."""

    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int
    steps: int  # sequential communication steps (latency terms)

    def __add__(self, other: RankTraffic) -> RankTraffic:
        """One call after the other: bytes, messages and steps add up."""
        return RankTraffic(self.bytes_sent + other.bytes_sent, self.bytes_received + other.bytes_received,
                           self.messages_sent + other.messages_sent,
                           self.messages_received + other.messages_received, self.steps + other.steps)


@dataclass(frozen=True)
class Call:
    """One call of one algorithm as one rank sees it: what every record's traffic and levels get.

    n: the tensor's elements (all_reduce, broadcast, reduce), else the sum of `blocks`;
    blocks: every rank's block (all_gather, reduce_scatter, gather, scatter), or the
    blocks this rank sends (all_to_all, with `recv_numels` those it receives);
    hosts[r]: group rank r's host (None: one host).
    """

    collective: str  # the family: "all_gather", never "all_gather_into_tensor"
    algorithm: str  # the canonical name: an alias resolved
    n: int
    blocks: list[int]
    itemsize: int
    p: int
    rank: int
    root: int = 0
    segment_elems: int | None = None
    recv_numels: list[int] | None = None
    stage_bytes: int | None = None
    hosts: tuple[int, ...] | None = None

    @property
    def placed(self) -> tuple[int, ...]:
        """Every rank's host (one host when none was given)."""
        return self.hosts or (0,) * self.p

    @property
    def spans_hosts(self) -> bool:
        return len(set(self.hosts or (0,))) > 1

    @property
    def received_blocks(self) -> list[int]:
        """The blocks this rank receives (all_to_all: the same as it sends unless told)."""
        return self.blocks if self.recv_numels is None else list(self.recv_numels)


Counts = tuple[int, float, float]  # (steps, critical-path bytes, reduced bytes)
Traffic = Callable[[Call], RankTraffic]
Formula = Callable[[float, int, "int | None", "int | None"], Counts]  # (n, p, segment_bytes, stage_bytes)
Schedule = Callable[[Call], list[Any]]  # every message, step by step (dt.cost.levels.Step)


@dataclass(frozen=True)
class CostRecord:
    """What one algorithm costs, as dt.cost's functions (None: not priced that way)."""

    collective: str
    name: str
    traffic: Traffic | None
    formula: Formula | None  # the flat textbook model: `auto` considers only algorithms with one
    levels: Schedule | None  # the two-level model (dt.cost.levels)
    wires: tuple[str, ...]  # ("shm",): a load/store algorithm; else any point-to-point wire


COSTS: dict[tuple[str, str], CostRecord] = {}
# The original design called the flat (one-root) algorithms "naive"; the name stays selectable
# for broadcast, reduce, gather and scatter as an alias of "flat" (declared with `aliases=`).
ALIASES: dict[tuple[str, str], str] = {}
# Every collective the two-level model prices, and its algorithms (those with a `levels` record).
LEVELED: dict[str, tuple[str, ...]] = {}
# The load/store algorithms (wires ("shm",)), as (collective, name): priced at sync and mem.
LOADSTORE: set[tuple[str, str]] = set()

# The tensor forms of a collective (torch's `_into_tensor`, `_tensor`, `_single` APIs) and the
# collective each one is: every table keyed by collective looks them up through `family`.
FORMS = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
         "all_to_all_single": "all_to_all"}


def family(collective: str) -> str:
    """'all_gather_into_tensor' -> 'all_gather': the collective whatever API form names it."""
    return FORMS.get(collective, collective)


def canonical(collective: str, algorithm: str) -> str:
    """The algorithm an alias stands for ("naive" broadcast is "flat"); others unchanged."""
    return ALIASES.get((family(collective), algorithm), algorithm)


def register(record: CostRecord, aliases: tuple[str, ...] = ()) -> None:
    """Enter one algorithm's record (and the names that stand for it) in the tables."""
    COSTS[(record.collective, record.name)] = record
    for alias in aliases:
        ALIASES[(record.collective, alias)] = record.name
    if record.wires == ("shm",):
        LOADSTORE.add((record.collective, record.name))
    if record.levels is not None:
        LEVELED[record.collective] = tuple(sorted({*LEVELED.get(record.collective, ()), record.name}))


def record_for(collective: str, algorithm: str) -> CostRecord:
    """The record of `algorithm` of `collective` (any API form, any alias); KeyError if none."""
    base = family(collective)
    record = COSTS.get((base, canonical(base, algorithm)))
    if record is None:
        raise KeyError(f"no cost record for {collective} {algorithm}")
    return record


def call_of(collective: str, algorithm: str, numels: int | list[int], itemsize: int, p: int,
            rank: int, **shape: object) -> Call:
    """traffic_for's arguments as one Call (numels: one int for equal blocks, or every block)."""
    base = family(collective)
    blocks = [numels] * p if isinstance(numels, int) else list(numels)
    n = numels if isinstance(numels, int) else sum(numels)
    return Call(base, canonical(base, algorithm), n, blocks, itemsize, p, rank, **shape)  # type: ignore[arg-type]
