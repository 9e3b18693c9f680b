"""What every table is made of: what it needs measured, what it is built from, what it returns.

A table is one file in this folder, t<N>_<name>.py, defining `SPEC = TableSpec(...)`:
its number and title, `needs(settings) -> Needs` (what must be measured for it)
and `build(results) -> Table` (the rows, notes and raw data, from the
measurements). The study measures the union of the selected tables' needs, once,
on pools reused across tables, then calls each builder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dt.bench import report as R

__all__ = ["WIRES", "Needs", "Results", "RingNaive", "Run", "Table", "TableSpec", "contention_notes",
           "ring_and_naive"]


@dataclass(frozen=True)
class Run:
    """A measurement a table brings along: `fn(*args)` on every rank of a pool of `world`.

    The study runs it once (whichever tables name it) and keeps every rank's
    return value, in rank order, in `runs[label]`; the table reduces them.
    fn must be a module-level function (the pool imports it by name).
    """

    world: int
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass
class Needs:
    """What a table needs measured. Each family is measured once for all tables that name it."""

    # all-reduce: world -> message sizes in bytes, each timed with every algorithm below
    allreduce: dict[int, set[int]] = field(default_factory=dict)
    algorithms: set[str] = field(default_factory=set)  # dt's names, and "gloo" for torch's own
    gamma: bool = False  # also gamma (seconds per reduced byte) on each all-reduce world
    # data parallel: (world, global batch) -> impls ("compute", "dt_off", "dt_on", "torch")
    dp: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    # pipeline on `stages` ranks: (stage kind "linear" | "timed", schedule, micro-batches), in order
    pipeline: list[tuple[str, str, int]] = field(default_factory=list)
    stages: int = 0
    # anything else, by label: a table's own worker (tables 8 and 9: the all-to-all layers)
    runs: dict[str, Run] = field(default_factory=dict)

    def __or__(self, other: Needs) -> Needs:
        out = Needs(algorithms=self.algorithms | other.algorithms, gamma=self.gamma or other.gamma,
                    pipeline=list(dict.fromkeys(self.pipeline + other.pipeline)),
                    stages=max(self.stages, other.stages), runs={**self.runs, **other.runs})
        for mine, theirs, merged in ((self.allreduce, other.allreduce, out.allreduce),
                                     (self.dp, other.dp, out.dp)):
            for key in [*mine, *theirs]:
                merged[key] = mine.get(key, set()) | theirs.get(key, set())
        return out

    def worlds(self) -> set[int]:
        """Every world size a pool is started for."""
        return (set(self.allreduce) | {w for w, _ in self.dp} | ({self.stages} if self.pipeline else set())
                | {r.world for r in self.runs.values()})


class Results(Protocol):
    """What a table is built from: the Study is one, the tests build others from synthetic figures.

    coll[(world, bytes)][algorithm]: {"time": Stat, "bytes_sent_max", "messages_sent_max", ...};
    gamma[world]: seconds per reduced byte; dp[(world, batch)][impl][figure]: Stat over steps;
    pp[(stage kind, schedule, m)]: the pipeline's bubble, step, compute, idle, stash;
    runs[label]: every rank's return value of the Run of that label (a table's own worker).
    """

    s: Any  # the run's StudySettings (settings.py lists the tables, so it sits above them)
    cores: int
    coll: dict[tuple[int, int], dict[str, Any]]
    gamma: dict[int, float]
    dp: dict[tuple[int, int], dict[str, Any]]
    pp: dict[tuple[str, str, int], dict[str, Any]]
    runs: dict[str, list[Any]]
    t1_single_thread: set[int]

    def coll_sizes(self) -> list[int]: ...

    def coll_impls(self) -> tuple[str, ...]: ...

    def pp_schedules(self) -> tuple[str, ...]: ...

    def pp_virtual(self, sched: str) -> int: ...


@dataclass
class Table:
    """One table of the study: printed as markdown, saved as JSON (`data`: the unformatted figures)."""

    id: int
    title: str
    headers: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    align: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more JSON beside the rows (table 7: fits)

    def markdown(self) -> str:
        lines = [f"### Table {self.id}. {self.title}", "",
                 R.markdown_table(self.headers, self.rows, self.align)]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class TableSpec:
    """A table's declaration: the registry (tables/__init__.py) collects one per t<N>_*.py file."""

    id: int
    title: str
    needs: Callable[[Any], Needs]  # StudySettings -> what to measure
    build: Callable[[Results], Table]
    # what the README shows of the table (default: all of it); results/scaling.md has it whole
    readme: Callable[[Results, Table], Table] | None = None


def contention_notes(worlds: Sequence[int], cores: int) -> list[str]:
    """The note every table with more ranks than cores carries."""
    over = [w for w in worlds if w > cores]
    if not over:
        return []
    return [f"world {', '.join(map(str, over))} > {cores} cores: those ranks share {cores} cores "
            f"(oversubscribed, whatever the wire); the run competes with itself, so those rows measure "
            f"contention as much as the algorithm"]


WIRES = (("torch", ""), ("shm", "@shm"))  # (wire, the suffix its timings are filed under)


@dataclass
class RingNaive:
    """One (world, wire) row of tables 1 and 2: the ring's and naive's timings, gloo's (torch wire
    only), and the cost model's time of each from `dt tune`'s figures (predicted.py)."""

    world: int
    wire: str
    ring: dict[str, Any]
    naive: dict[str, Any]
    gloo: dict[str, Any] | None
    pred_ring: float | None
    pred_naive: float | None


def ring_and_naive(st: Results, nbytes: int) -> list[tuple[int, list[RingNaive] | None]]:
    """Per world size, its rows on each wire that timed both algorithms (None: the world was not
    measured at this size)."""
    from dt.bench.scaling import predicted

    out = []
    for world in st.s.coll_worlds:
        m = st.coll.get((world, nbytes))
        rows = []
        for wire, at in WIRES if m is not None else ():
            if f"ring{at}" in m and f"naive{at}" in m:
                pred = [predicted.seconds(a + at, nbytes, world, st.s.backend) for a in ("ring", "naive")]
                rows.append(RingNaive(world, wire, m[f"ring{at}"], m[f"naive{at}"],
                                      m.get("gloo") if wire == "torch" else None, *pred))
        out.append((world, rows if m is not None else None))
    return out
