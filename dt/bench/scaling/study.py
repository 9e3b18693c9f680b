"""The Study: plan what the selected tables need, measure it once on reused pools, aggregate.

plan() turns the tables' needs (tables/, merged) into measurement units grouped
by world size, so each world's WorkerPool starts once, serves every table, and
is closed before the next world's starts (fewer processes alive at once).
measure() runs the units (a unit that fails is recorded and its rows stay
empty: one failure never loses the rest). What the ranks return is reduced
here to what the tables read: per repetition the slowest rank (a collective or
a step ends when its last rank does), then the median and spread.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from dt.bench import report as R
from dt.bench.scaling.model import schedules_offered
from dt.bench.scaling.settings import StudySettings
from dt.bench.scaling.tables import Needs, Table, needs_of
from dt.bench.scaling.workers import collectives_worker, dp_worker, pipeline_worker
from dt.launcher import LaunchedWorld, WorkerPool, open_world

__all__ = ["Study", "aggregate_dp", "aggregate_pipeline"]

# The order things are timed and listed in; names not listed here come after, sorted.
ALLREDUCE_ORDER = ("ring", "naive", "recursive_doubling", "rabenseifner", "ring@shm", "naive@shm",
                   "recursive_doubling@shm", "rabenseifner@shm", "one_shot@shm", "two_shot@shm", "gloo")
DP_ORDER = ("compute", "dt_off", "dt_on", "torch")


def _ordered(names: set[str], order: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in order if n in names) + tuple(sorted(names - set(order)))


class Study:
    """Runs the measurements the selected tables need, once each, on reused pools."""

    def __init__(self, settings: StudySettings, progress: bool = True):
        self.s = settings
        self.machine = R.machine(settings.backend)
        self.cores = self.machine["cores"]
        self.pools: dict[int, WorkerPool | LaunchedWorld] = {}
        self.progress = progress
        self.bar: Any = None
        self.coll: dict[tuple[int, int], dict[str, Any]] = {}  # (world, nbytes) -> aggregated
        self.gamma: dict[int, float] = {}
        self.memcpy: dict[int, float] = {}  # world -> seconds per byte copied, every rank at once
        self.dp: dict[tuple[int, int], dict[str, Any]] = {}  # (world, batch) -> impl -> aggregated
        self.pp: dict[tuple[str, str, int], dict[str, Any]] = {}  # (stage kind, schedule, m)
        self.runs: dict[str, list[Any]] = {}  # a table's own worker: label -> every rank's result
        self.tables: dict[int, Table] = {}
        self.t1_single_thread: set[int] = set()  # batches whose baseline ran faster on one thread
        self.failures: list[str] = []  # measurements that raised: their tables show the gap
        self.unit_seconds: dict[str, float] = {}  # wall time of each measurement (pool start included)
        self.started = time.time()

    # -- pools and progress ---------------------------------------------------
    def pool(self, world: int) -> WorkerPool | LaunchedWorld:
        if world not in self.pools:  # under torchrun: the launched ranks (cli.py allows no other world)
            self.pools[world] = open_world(world, self.s.backend)
        return self.pools[world]

    def run(self, world: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
        return self.pool(world).run(fn, *args, timeout=self.s.timeout)

    def close(self) -> None:
        for p in self.pools.values():
            p.close()
        self.pools.clear()
        if self.bar is not None:
            self.bar.close()

    # -- the plan: the union of the selected tables' needs ----------------------
    @property
    def needs(self) -> Needs:
        return needs_of(self.s)

    def coll_sizes(self) -> list[int]:
        return sorted(set().union(*self.needs.allreduce.values()))

    def coll_impls(self) -> tuple[str, ...]:
        """The all-reduce algorithms timed at every size (gloo: torch.distributed's own)."""
        return _ordered(self.needs.algorithms, ALLREDUCE_ORDER)

    def dp_plan(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(world, global batch, impls) calls: every batch that splits evenly over its world."""
        return sorted((w, b, _ordered(impls, DP_ORDER))
                      for (w, b), impls in self.needs.dp.items() if b % w == 0)

    def pp_schedules(self) -> tuple[str, ...]:
        """GPipe and 1F1B, and the interleaved schedule where dt.pipeline offers it."""
        return schedules_offered(self.s.pp_virtual)

    def pp_plan(self) -> list[tuple[str, str, int]]:
        """(stage kind, schedule, micro-batches): "linear" stages compute, "timed" ones sleep."""
        return list(self.needs.pipeline)

    def pp_virtual(self, sched: str) -> int:
        return self.s.pp_virtual if sched == "interleaved" else 1

    def plan(self) -> list[tuple[int, str, Callable[[], None]]]:
        """Every measurement the selected tables need: (world, label, run), grouped by world."""
        needs = self.needs
        units: list[tuple[int, str, Callable[[], None]]] = []
        for world in sorted(needs.allreduce):
            sizes = sorted(needs.allreduce[world])
            for nbytes in sizes:
                gamma = needs.gamma and nbytes == sizes[0]
                units.append((world, f"all-reduce {R.fmt_bytes(nbytes)} world {world}",
                              lambda w=world, n=nbytes, g=gamma: self.measure_allreduce(w, n, g)))
        for world, batch, impls in self.dp_plan():
            units.append((world, f"data parallel world {world} batch {batch}",
                          lambda w=world, b=batch, i=impls: self.measure_dp(w, b, i)))
        for kind, sched, m in self.pp_plan():
            units.append((needs.stages, f"pipeline {kind} {sched} m={m}",
                          lambda k=kind, sc=sched, mb=m: self.measure_pipeline(k, sc, mb)))
        for label, r in needs.runs.items():
            units.append((r.world, label, lambda lb=label, rn=r: self.runs.__setitem__(
                lb, self.run(rn.world, rn.fn, *rn.args))))
        return sorted(units, key=lambda u: u[0])  # stable: table order within a world

    # -- measuring -----------------------------------------------------------
    def measure(self) -> None:
        units = self.plan()
        if self.progress and sys.stderr.isatty():  # a redrawn bar in a log is a frame per unit
            from tqdm import tqdm

            self.bar = tqdm(total=len(units), desc="scaling study", unit="run", dynamic_ncols=True,
                            file=sys.stderr)
        for k, (world, label, run) in enumerate(units):
            if self.bar is not None:
                self.bar.set_postfix_str(label)
            t0 = time.perf_counter()
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - one failed measurement must not lose the rest
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.failures.append(f"{label}: {type(exc).__name__}: {first}")
                msg = f"FAILED {label}: {type(exc).__name__}: {first}"
                (self.bar.write if self.bar is not None else print)(msg)
            self.unit_seconds[label] = time.perf_counter() - t0
            if self.bar is not None:
                self.bar.update(1)
            if k + 1 == len(units) or units[k + 1][0] != world:
                pool = self.pools.pop(world, None)
                if pool is not None:
                    pool.close()

    def measure_allreduce(self, world: int, nbytes: int, with_gamma: bool) -> None:
        impls = self.coll_impls()
        res = self.run(world, collectives_worker, nbytes, impls, self.s.coll_reps_for(nbytes),
                       self.s.coll_warmup, with_gamma)
        agg: dict[str, Any] = {}
        for impl in impls:
            reps = R.per_rep_max([r["times"][impl] for r in res])
            entry: dict[str, Any] = {"time": R.Stat.of(reps)}
            if impl in res[0]["traffic"]:
                sent = [r["traffic"][impl]["bytes_sent"] for r in res]
                entry["bytes_sent_max"] = max(sent)
                entry["bytes_sent_per_rank"] = sent
                entry["messages_sent_max"] = max(r["traffic"][impl]["messages_sent"] for r in res)
            agg[impl] = entry
        if with_gamma:
            self.gamma[world] = float(sorted(r["gamma"] for r in res)[len(res) // 2])
            self.memcpy[world] = float(max(r.get("memcpy", 0.0) for r in res))
        self.coll[(world, nbytes)] = agg

    def measure_dp(self, world: int, batch: int, impls: tuple[str, ...]) -> None:
        res = self.run(world, dp_worker, batch, self.s.hidden, self.s.layers, impls,
                       self.s.dp_steps_for(batch), self.s.dp_warmup, self.s.dp_algorithm, world > 1)
        alone = ("t1", "t1_1t", "alone")  # rank 0 alone ran these: the baseline, one rank's share
        agg = {impl: aggregate_dp([r[impl] for r in res]) for impl in res[0] if impl not in alone}
        for k in alone:
            if res[0].get(k):
                agg[k] = aggregate_dp([res[0][k]])
        self.dp[(world, batch)] = agg

    def measure_pipeline(self, kind: str, sched: str, m: int) -> None:
        res = self.run(self.s.pp_stages, pipeline_worker, sched, m, self.s.pp_batch,
                       self.s.pp_hidden, self.s.pp_blocks_per_stage, self.s.pp_steps,
                       self.s.pp_warmup, self.s.pp_timed_s if kind == "timed" else 0.0,
                       self.pp_virtual(sched))
        self.pp[(kind, sched, m)] = aggregate_pipeline(res)


def aggregate_dp(per_rank: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Per step: the slowest rank's step time, and the other figures averaged over ranks;
    then the median (and spread) over steps."""
    steps = len(per_rank[0])
    keys = per_rank[0][0].keys() if steps else []
    out: dict[str, Any] = {}
    for k in keys:
        per_step = []
        for i in range(steps):
            vals = [r[i][k] for r in per_rank]
            per_step.append(max(vals) if k in ("step", "bytes_sent") else sum(vals) / len(vals))
        out[k] = R.Stat.of(per_step)
    return out


def aggregate_pipeline(per_rank: list[list[dict[str, float]]]) -> dict[str, Any]:
    """The bubble as (p-1)/(m+p-1) counts it: idle stage-time over the pipeline's whole step.

    The step is the makespan, the slowest stage's step (a stage that finishes
    early, like the last one in GPipe, idles until the others are done). A
    stage's bubble is its idle time (dt.pipeline's StepStats.idle_s: blocked on a
    receive or on its last sends) plus that wait at the end, over the makespan;
    the table shows the mean over stages, median over steps.
    """
    steps = len(per_rank[0])
    per_stage: list[list[float]] = [[] for _ in per_rank]
    makespan, compute_mean, idle_mean = [], [], []
    for i in range(steps):
        span = max(r[i]["step"] for r in per_rank)
        makespan.append(span)
        idles = [r[i]["idle"] + span - r[i]["step"] for r in per_rank]
        for k, idle in enumerate(idles):
            per_stage[k].append(idle / span)
        compute_mean.append(sum(r[i]["compute"] for r in per_rank) / len(per_rank))
        idle_mean.append(sum(idles) / len(idles))
    bubble = [sum(s[i] for s in per_stage) / len(per_stage) for i in range(steps)]
    return {
        "bubble": R.Stat.of(bubble),
        "bubble_per_stage": [R.Stat.of(s).median for s in per_stage],
        "step": R.Stat.of(makespan),
        "compute": R.Stat.of(compute_mean),
        "idle": R.Stat.of(idle_mean),
        "peak_stash": [int(r[0]["peak_stash"]) for r in per_rank],
        "bytes_sent_max": max(r[0]["bytes_sent"] for r in per_rank),
    }
