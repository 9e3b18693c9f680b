"""The scaling study: what distributed training costs on this machine, and where the efficiency went.

    python bench/scaling.py                 # the full study (about 10 minutes on 2 cores)
    python bench/scaling.py --quick         # smoke test, under 2 minutes (CI runs it)
    dt bench scaling --tables 1,2,7         # only some tables
    python bench/scaling.py --update-readme # also rewrite the README's scaling section

It regenerates the original design's tables (see REFERENCE.md) from measurement:

1. ring vs naive all-reduce of 33.55 MB at world 2, 4, 8: bytes the busiest rank sent, counted by
   dt's transport (dt.traffic) next to dt.cost's arithmetic, time, and the ring's speedup;
2. the same at 0.26 MB, where the naive all-reduce's 2 steps beat the ring's 2(p-1);
3. data-parallel scaling of the reference model (6 linear layers of 1024, GELU between) at world
   1, 2, 4, 8: s/step, speedup, efficiency, communication fraction, dt's DDP with overlap off and on,
   torch's DDP beside it;
4. the batch sweep at the largest world: speedup, efficiency, comm fraction, compute and comm time;
5. where the efficiency went: each step split into compute, hidden comm, exposed comm, pipeline
   bubble and the rest, summing to 100%;
6. the pipeline bubble measured against (p-1)/(m+p-1), 4 stages, 1, 4 and 16 micro-batches, GPipe,
   1F1B and interleaved 1F1B ((p-1)/(vm+p-1)); stages that compute for real, and stages whose
   compute is a fixed sleep (the schedule's bubble without the cores' contention);
7. predicted vs measured: the alpha-beta-gamma cost model's time for each all-reduce next to the
   measured one, with the latency and bandwidth fitted from this run (or saved by `dt tune`).

How the figures are taken: every rank runs the same loop in a dt.launcher.WorkerPool (one pool per
world size, reused by every table); each repetition starts after a dt barrier and lasts as long as
its slowest rank; a table shows the median over repetitions and the spread (±half of max-min).
Speedups divide by a single-process step (the whole batch, all cores as threads) that each run
times itself, on rank 0 while the other ranks wait, before and after its data-parallel steps, so
a change in the machine's load between runs cannot fake a speedup.
Cross-rank argument validation is off while timing (dt.transport.set_validation(False)), as
torch.distributed runs without such a check. On a machine with fewer cores than ranks the ranks
share the cores (loopback, oversubscribed): those rows measure contention as much as algorithms,
and the output says so.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dt import cost, transport
from dt.bench import report as R
from dt.bench.ddp import reference_model
from dt.launcher import WorkerPool

T1_BYTES = 33_554_432  # 33.55 MB: 8,388,608 float32 (the reference's big tensor)
T2_BYTES = 262_144  # 0.26 MB: 65,536 float32 (the reference's small tensor)
ALL_TABLES = (1, 2, 3, 4, 5, 6, 7)

TITLES = {
    1: "Ring vs naive all-reduce, 33.55 MB float32",
    2: "Ring vs naive all-reduce, 0.26 MB float32 (latency-bound: naive's 2 steps win)",
    3: "Data-parallel scaling of the reference model",
    4: "Batch sweep at the largest world size",
    5: "Where the efficiency went: each step split into parts that sum to 100%",
    6: "Pipeline bubble: measured vs (p-1)/(m+p-1)",
    7: "Predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings",
}


# ==========================================================================
# Settings: what to measure and how often.
# ==========================================================================


@dataclass
class Settings:
    tables: tuple[int, ...] = ALL_TABLES
    quick: bool = False
    # collectives (tables 1, 2, 7)
    coll_worlds: tuple[int, ...] = (2, 4, 8)
    big_bytes: int = T1_BYTES
    small_bytes: int = T2_BYTES
    sweep_bytes: tuple[int, ...] = (4096, 32768, 2 << 20, 8 << 20)  # + the two above, for table 7
    coll_reps: int = 5
    coll_warmup: int = 1
    # data parallel (tables 3, 4, 5)
    dp_worlds: tuple[int, ...] = (1, 2, 4, 8)
    dp_batch: int = 16384
    sweep_batches: tuple[int, ...] = (256, 1024, 4096, 16384)
    hidden: int = 1024
    layers: int = 6
    dp_steps: int = 3  # timed steps per configuration (configurations interleaved)
    dp_warmup: int = 1
    dp_algorithm: str = "auto"
    torch_ddp: bool = True
    # pipeline (tables 5, 6)
    pp_stages: int = 4
    pp_micro: tuple[int, ...] = (1, 4, 16)
    pp_batch: int = 1024
    pp_hidden: int = 1024
    pp_blocks_per_stage: int = 2
    pp_steps: int = 3
    pp_warmup: int = 1
    pp_virtual: int = 2  # chunks per rank of the interleaved schedule (if dt.pipeline has it)
    pp_timed_s: float = 0.02  # forward seconds of a TimedStage (backward 2x); 0: skip those rows
    # output
    out_dir: Path = Path("results")
    plots: bool = True
    update_readme: bool = False
    timeout: float = 600.0

    def coll_reps_for(self, nbytes: int) -> int:
        """Small messages are cheap and noisy: four times the repetitions up to 1 MB."""
        return 4 * self.coll_reps if nbytes <= 1 << 20 else self.coll_reps

    def dp_steps_for(self, batch: int) -> int:
        """Timed steps at this batch (one number for all today; the hook to shrink big batches)."""
        return self.dp_steps

    @property
    def sweep_world(self) -> int:
        return max(self.dp_worlds)

    def worlds_used(self) -> list[int]:
        """Every world size the selected tables start a pool for."""
        used: set[int] = set()
        if any(t in self.tables for t in (1, 2, 7)):
            used.update(self.coll_worlds)
        if any(t in self.tables for t in (3, 5)):
            used.update(self.dp_worlds)
        if 4 in self.tables:
            used.update({1, self.sweep_world})
        if any(t in self.tables for t in (5, 6)):
            used.add(self.pp_stages)
        return sorted(used)

    def shrinkage(self) -> list[str]:
        """What this run measures smaller than the original design did, in words."""
        notes, tables = [], set(self.tables)
        if tables & {3, 5} and self.dp_batch != 16384:
            notes.append(f"table 3 uses global batch {self.dp_batch} (the original design: 16384) "
                         f"so the study fits in minutes on this machine; pass --dp-batch 16384 for "
                         f"the reference size")
        if 4 in tables and (min(self.sweep_batches) > 256 or max(self.sweep_batches) < 16384):
            notes.append(f"table 4 sweeps global batch {min(self.sweep_batches)}.."
                         f"{max(self.sweep_batches)} (the original design: 256..16384)")
        if tables & {3, 4, 5} and (self.hidden != 1024 or self.layers != 6):
            notes.append(f"the data-parallel model is {self.layers} layers of {self.hidden} "
                         f"(the reference: 6 of 1024)")
        if tables & {1, 7} and self.big_bytes != T1_BYTES:
            notes.append(f"table 1 all-reduces {self.big_bytes / 1e6:.2f} MB (the reference: 33.55 MB)")
        if tables & {2, 7} and self.small_bytes != T2_BYTES:
            notes.append(f"table 2 all-reduces {self.small_bytes / 1e6:.2f} MB (the reference: 0.26 MB)")
        if tables & {1, 2, 7} and max(self.coll_worlds) < 8:
            notes.append(f"collectives at world sizes {', '.join(map(str, self.coll_worlds))} "
                         f"(the reference: 2, 4, 8)")
        if tables & {3, 4, 5} and max(self.dp_worlds) < 8:
            notes.append(f"data parallel at world sizes {', '.join(map(str, self.dp_worlds))} "
                         f"(the reference: 1, 2, 4, 8)")
        reps = []
        if tables & {1, 2, 7}:
            reps.append(f"{self.coll_reps} per collective after {self.coll_warmup} warm-up "
                        f"({4 * self.coll_reps} up to 1 MB)")
        if tables & {3, 4, 5}:
            big = [b for b in {self.dp_batch, *self.sweep_batches}
                   if self.dp_steps_for(b) != self.dp_steps]
            reps.append(f"{self.dp_steps} steps per data-parallel configuration after "
                        f"{self.dp_warmup} warm-up" + (f" ({self.dp_steps_for(max(big))} at global "
                                                       f"batch {max(big)})" if big else ""))
        if tables & {5, 6}:
            reps.append(f"{self.pp_steps} steps per pipeline configuration after "
                        f"{self.pp_warmup} warm-up")
        if reps:
            notes.append("repetitions: " + "; ".join(reps))
        return notes


def quick_settings(s: Settings) -> Settings:
    """--quick: every table, small sizes, few repetitions, no world 8 (a smoke test)."""
    s.quick = True
    s.coll_worlds = (2, 4)
    s.big_bytes = 8 << 20
    s.sweep_bytes = (4096, 1 << 20)
    s.coll_reps, s.coll_warmup = 3, 1
    s.dp_worlds = (1, 2, 4)
    s.dp_batch = 512
    s.sweep_batches = (256, 1024)
    s.hidden = 512
    s.dp_steps, s.dp_warmup = 2, 1
    s.pp_micro = (1, 4, 16)
    s.pp_batch, s.pp_hidden = 512, 512
    s.pp_timed_s = 0.01
    s.pp_steps, s.pp_warmup = 2, 1
    return s


# ==========================================================================
# Workers: module-level functions every rank of a pool runs.
# ==========================================================================


def _barrier() -> None:
    from dt.collectives import barrier

    barrier(algorithm="dissemination")  # named, so "auto" and its tuning never run here


def _collectives_worker(nbytes: int, impls: Sequence[str], reps: int, warmup: int,
                        measure_gamma: bool = False) -> dict[str, Any]:
    """Time all-reduce of `nbytes` float32 for each impl ("ring", "naive", ..., "gloo").

    The impls take turns within each repetition (in an order that rotates, so
    none always runs first), so a change in the machine's load hits them alike.
    Returns, for this rank: seconds per repetition, and the bytes/messages the
    first (untimed) call moved as counted by the transport.
    """
    from dt.collectives import all_reduce

    transport.set_validation(False)
    x = torch.ones(nbytes // 4)
    out: dict[str, Any] = {"times": {impl: [] for impl in impls}, "traffic": {}}

    def call(impl: str) -> float:
        x.fill_(1.0)  # in place: keep the values from growing p-fold every call
        _barrier()
        t0 = time.perf_counter()
        if impl == "gloo":  # torch.distributed's own, on the same processes, for reference
            dist.all_reduce(x)
        else:
            all_reduce(x, algorithm=impl)
        return time.perf_counter() - t0

    for impl in impls:  # warm-up; the first call of each dt algorithm is also counted
        if impl != "gloo":
            with transport.traffic() as t:
                call(impl)
            out["traffic"][impl] = {"bytes_sent": t.bytes_sent, "bytes_received": t.bytes_received,
                                    "messages_sent": t.messages_sent}
        for _ in range(max(1, warmup) - (impl != "gloo")):
            call(impl)
    for rep in range(reps):
        for k in range(len(impls)):
            impl = impls[(rep + k) % len(impls)]
            out["times"][impl].append(call(impl))
    if measure_gamma:
        out["gamma"] = _reduction_seconds_per_byte()
    return out


def _reduction_seconds_per_byte(nbytes: int = 16 << 20, reps: int = 7) -> float:
    """gamma: seconds per byte to add one float32 buffer into another, on this rank's threads.

    All ranks measure at once, so on a shared machine gamma includes their contention;
    16 MB, larger than the caches, as the chunks of a big all-reduce are.
    """
    a, b = torch.ones(nbytes // 4), torch.ones(nbytes // 4)
    a.add_(b)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a.add_(b)
        samples.append(time.perf_counter() - t0)
    return R.Stat.of(samples).median / nbytes


def _single_process_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                         y: torch.Tensor) -> float:
    t0 = time.perf_counter()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def _dp_worker(global_batch: int, hidden: int, layers: int, impls: Sequence[str], steps: int,
               warmup: int, algorithm: str = "auto", baseline: bool = False
               ) -> dict[str, list[dict[str, float]]]:
    """Data-parallel training steps of the reference model; this rank's timings per step.

    impls: "compute" (the local step with no communication at all: what each rank
    computes when N ranks compute at once), "dt_off" / "dt_on" (dt's
    DistributedDataParallel, overlap off / on, with its own timers: backward
    compute, comm, exposed, hidden), "torch" (torch's DDP on gloo). The step
    itself is bench/ddp.py's, so `dt bench ddp` and this study time the same
    thing; configurations alternate within each repetition, so drifts in the
    machine's load hit them alike.

    baseline=True (world > 1): rank 0 also times the single-process step (the
    whole global batch, all the machine's cores as threads) while the other ranks
    wait at a barrier, once before and again after the data-parallel steps, so
    the speedup's numerator is measured in the same minutes as its denominator.
    At world 1 the "compute" step is the baseline; one extra step at one thread
    guards it against a loaded machine on which torch's threads slow it down.
    """
    from dt.bench.ddp import _step_worker

    rank, p = dist.get_rank(), dist.get_world_size()
    single: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor] | None = None
    t1: list[dict[str, float]] = []

    def baseline_steps(n: int, warm: int, threads_now: int | None = None,
                       out: list[dict[str, float]] = t1) -> None:
        nonlocal single
        if rank == 0:
            threads = torch.get_num_threads()
            torch.set_num_threads(threads_now or os.cpu_count() or 1)
            try:
                if single is None:
                    torch.manual_seed(0)
                    net = reference_model(hidden, layers)
                    gen = torch.Generator().manual_seed(1000)
                    single = (net, torch.optim.SGD(net.parameters(), lr=1e-6),
                              torch.randn(global_batch, hidden, generator=gen),
                              torch.randn(global_batch, hidden, generator=gen))
                for k in range(warm + n):
                    dt_s = _single_process_step(*single)
                    if k >= warm:
                        out.append({"step": dt_s})
            finally:
                torch.set_num_threads(threads)
        _barrier()  # the other ranks sit here, idle, while rank 0 has the machine

    if baseline and p > 1:
        baseline_steps(1, warmup)
    names = ["single" if i == "compute" else i for i in impls]
    got = _step_worker(global_batch, hidden, layers, names, steps, warmup, 25.0, 1.0, algorithm)
    records = {("compute" if k == "single" else k): v for k, v in got.items()}
    if baseline and p > 1:
        baseline_steps(max(1, steps - 1), 0)
        records["t1"] = t1
        if (os.cpu_count() or 1) > 1:  # the same guard as at world 1 (below): one step, one thread
            records["t1_1t"] = []
            baseline_steps(1, 0, 1, records["t1_1t"])
    if p == 1 and "compute" in impls and torch.get_num_threads() > 1:
        # The baseline must not be slowed by its own threads: on a loaded machine
        # (other jobs on the cores) torch's threads can make one process slower than
        # one thread would be, which would flatter every speedup. One step at one
        # thread (cold, so it never flatters itself); the baseline is the faster.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch.manual_seed(0)
            net = reference_model(hidden, layers)
            gen = torch.Generator().manual_seed(1000)
            x = torch.randn(global_batch, hidden, generator=gen)
            y = torch.randn(global_batch, hidden, generator=gen)
            opt = torch.optim.SGD(net.parameters(), lr=1e-6)
            records["compute_1t"] = [{"step": _single_process_step(net, opt, x, y)}]
        finally:
            torch.set_num_threads(threads)
    return records


class _Sleep(torch.autograd.Function):
    """Identity that takes `d` seconds forward and 2d backward without using a core."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, d: float) -> torch.Tensor:
        ctx.d = d
        time.sleep(d)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.d)
        return grad, None


class TimedStage(nn.Module):
    """A pipeline stage whose compute is a fixed time: the schedule's cost, free of core sharing.

    On a machine with fewer cores than stages, real stages that compute at the
    same time slow each other down, which blurs the bubble; a stage that sleeps
    its forward (d) and backward (2d) holds no core, so what is left is exactly
    what the schedule makes each stage wait.
    """

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x * self.weight, self.seconds)


def _pipeline_worker(schedule_name: str, micro_batches: int, batch: int, hidden: int,
                     blocks_per_stage: int, steps: int, warmup: int,
                     timed_stage_s: float = 0.0, virtual: int = 1) -> list[dict[str, float]]:
    """Train steps of a pipeline; this stage's dt.pipeline StepStats per step.

    Stages are `blocks_per_stage` (Linear, GELU) blocks of width `hidden`, or,
    with timed_stage_s > 0, a TimedStage per rank (micro-batches of 16 floats a row).
    virtual=v (schedule "interleaved"): each rank holds v chunks of 1/v the work.
    """
    from dt.parallel.pipeline import Pipeline, stage_module

    transport.set_validation(False)
    p, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    if timed_stage_s > 0:
        chunks = [TimedStage(timed_stage_s / virtual) for _ in range(virtual)]
        stage: nn.Module = chunks[0] if virtual == 1 else nn.ModuleList(chunks)
        hidden = 16
    else:
        blocks = [nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
                  for _ in range(p * blocks_per_stage)]
        stage = stage_module(blocks, virtual=virtual) if virtual > 1 else stage_module(blocks)
    pipe = Pipeline(stage)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(batch, hidden, generator=gen) if rank == 0 else None
    y = torch.randn(batch, hidden, generator=gen) if rank == p - 1 else None
    out = []
    for it in range(warmup + steps):
        _barrier()
        pipe.train_step(x, y, nn.functional.mse_loss, micro_batches=micro_batches,
                        schedule_name=schedule_name)
        stage.zero_grad(set_to_none=True)
        if it >= warmup:
            s = pipe.stats
            out.append({"step": s.step_s, "idle": s.idle_s, "compute": s.compute_s,
                        "peak_stash": float(s.peak_stash), "bytes_sent": float(s.bytes_sent)})
    return out


# ==========================================================================
# Pure functions: the arithmetic the tables are made of (tested directly).
# ==========================================================================


MODELED_ALL_REDUCE = ("ring", "naive", "recursive_doubling", "rabenseifner")


def model_terms(algorithm: str, nbytes: int, p: int) -> dict[str, float]:
    """What the alpha-beta-gamma model charges an all-reduce of `nbytes` on p ranks.

    steps (alpha), bytes on the critical path (beta) and bytes reduced on it
    (gamma), from dt.cost's per-rank counts of the busiest rank:

    - ring: every rank sends and receives 2(p-1)/p n at once (full duplex), so
      the critical path carries what one rank sends; (p-1)/p n are reduced.
    - naive: the root first receives (p-1) n (the reduce), then sends (p-1) n
      (the broadcast): the two phases add up; the root reduces (p-1) n.
    - recursive doubling / Rabenseifner: pairwise exchanges, full duplex; when
      p is not a power of two p', a folded rank's n comes in before and goes
      out after the exchanges (one extra n on the path), and is reduced once.
      Recursive doubling reduces n per round (n lg p'), Rabenseifner (p'-1)/p' n.
    """
    numel = nbytes // 4
    if algorithm == "ring":
        per_rank = [cost.ring_all_reduce(numel, 4, p, r) for r in range(p)]
        busiest = max(per_rank, key=lambda t: t.bytes_sent)
        return {"steps": busiest.steps, "beta_bytes": busiest.bytes_sent,
                "gamma_bytes": (p - 1) / p * nbytes, "bytes_sent_max": busiest.bytes_sent}
    if algorithm == "naive":
        root = cost.naive_all_reduce(numel, 4, p, 0)
        return {"steps": root.steps, "beta_bytes": root.bytes_sent + root.bytes_received,
                "gamma_bytes": (p - 1) * nbytes, "bytes_sent_max": root.bytes_sent}
    if algorithm in ("recursive_doubling", "rabenseifner"):
        fn = (cost.recursive_doubling_all_reduce if algorithm == "recursive_doubling"
              else cost.rabenseifner_all_reduce)
        per_rank = [fn(numel, 4, p, r) for r in range(p)]
        busiest = max(per_rank, key=lambda t: max(t.bytes_sent, t.bytes_received))
        p2 = 1 << (p.bit_length() - 1)
        folded = p != p2
        rounds = p2.bit_length() - 1
        reduced = rounds * nbytes if algorithm == "recursive_doubling" else (p2 - 1) / p2 * nbytes
        return {"steps": busiest.steps,
                "beta_bytes": max(busiest.bytes_sent, busiest.bytes_received) + (nbytes if folded else 0),
                "gamma_bytes": reduced + (nbytes if folded else 0),
                "bytes_sent_max": max(t.bytes_sent for t in per_rank)}
    raise ValueError(f"no cost model for all-reduce algorithm {algorithm!r}")


def predict(terms: dict[str, float], alpha: float, beta: float, gamma: float) -> float:
    return terms["steps"] * alpha + terms["beta_bytes"] * beta + terms["gamma_bytes"] * gamma


def fit_alpha_beta(points: Sequence[tuple[dict[str, float], float]], gamma: float) -> tuple[float, float]:
    """Least squares in relative error: alpha, beta >= 0 with steps*a + bytes*b ~ t - gamma term.

    Relative error, so a 4 KB message (tens of microseconds) weighs as much as
    a 33 MB one (a second); non-negative, so a noisy point cannot make latency
    or bandwidth negative.
    """
    import numpy as np

    rows, rhs = [], []
    for terms, t in points:
        if t <= 0:
            continue
        rows.append([terms["steps"] / t, terms["beta_bytes"] / t])
        rhs.append(1.0 - terms["gamma_bytes"] * gamma / t)
    if not rows:
        return math.nan, math.nan
    a = np.array(rows, dtype=float)
    b = np.array(rhs, dtype=float)
    sol, *_ = np.linalg.lstsq(a, b, rcond=None)
    alpha, beta = float(sol[0]), float(sol[1])
    if alpha < 0 or beta < 0:  # the constrained optimum lies on an axis: refit one term
        alpha_only = max(0.0, float(np.dot(a[:, 0], b) / np.dot(a[:, 0], a[:, 0])))
        beta_only = max(0.0, float(np.dot(a[:, 1], b) / np.dot(a[:, 1], a[:, 1])))
        err_a = float(np.sum((a[:, 0] * alpha_only - b) ** 2))
        err_b = float(np.sum((a[:, 1] * beta_only - b) ** 2))
        alpha, beta = (alpha_only, 0.0) if err_a <= err_b else (0.0, beta_only)
    return alpha, beta


BREAKDOWN_PARTS = ("compute", "hidden_comm", "exposed_comm", "bubble", "rest")
BREAKDOWN_LABELS = {
    "compute": "compute",
    "hidden_comm": "hidden comm",
    "exposed_comm": "exposed comm",
    "bubble": "pipeline bubble",
    "rest": "rest (contention, idle)",
}


def breakdown(step: float, compute: float, exposed: float = 0.0, hidden: float = 0.0,
              bubble: float = 0.0) -> dict[str, float]:
    """Split one step's wall time into parts that sum to exactly 1.

    - compute: time computing with no communication under it;
    - hidden comm: time computing *while* communication ran underneath (the
      overlap that bought something; carved out of the compute time);
    - exposed comm: time the step waited for communication;
    - bubble: time a pipeline stage waited for its neighbours;
    - rest: what is left of the step (Python, the optimizer's bookkeeping,
      ranks slowed by others sharing their cores, idle).

    When noise makes the measured parts exceed the step, they are scaled down
    together and the rest is 0.
    """
    if step <= 0:
        raise ValueError(f"step time must be positive, got {step}")
    compute, exposed, hidden, bubble = (max(0.0, v) for v in (compute, exposed, hidden, bubble))
    hidden = min(hidden, compute)
    parts = {"compute": compute - hidden, "hidden_comm": hidden, "exposed_comm": exposed,
             "bubble": bubble}
    total = sum(parts.values())
    if total > step:
        parts = {k: v / total for k, v in parts.items()}
        parts["rest"] = 0.0
    else:
        parts = {k: v / step for k, v in parts.items()}
        parts["rest"] = 1.0 - sum(parts.values())
    return {k: parts[k] for k in BREAKDOWN_PARTS}


def simulate_bubble(schedule_name: str, p: int, m: int, virtual: int = 1, forward: float = 1.0,
                    backward: float = 2.0) -> float:
    """The bubble a schedule leaves with free messages: dt.pipeline's own action order, played out.

    Each stage runs its actions (dt.pipeline.schedule) in order; a forward of
    micro-batch i on virtual stage q waits for q-1's forward of i, a backward for
    q+1's backward of i (the last virtual stage: its own forward). A chunk's
    forward costs forward/v, its backward backward/v. Returns the mean over
    stages of idle time / makespan: (p-1)/(m+p-1) for GPipe and 1F1B, and for
    interleaving (p-1)/(vm+p-1) when m is a multiple of p (more when m < p).
    """
    from dt.parallel.pipeline import schedule

    def actions(stage: int) -> list[tuple[str, int, int]]:
        acts = schedule(schedule_name, p, stage, m, virtual) if virtual > 1 else \
            schedule(schedule_name, p, stage, m)
        return [a if len(a) == 3 else (a[0], 0, a[1]) for a in acts]

    todo = [actions(st) for st in range(p)]
    finish: dict[tuple[str, int, int], float] = {}
    free, busy, nxt = [0.0] * p, [0.0] * p, [0] * p
    last = p * virtual - 1
    moved = True
    while moved:
        moved = False
        for st in range(p):
            while nxt[st] < len(todo[st]):
                kind, chunk, i = todo[st][nxt[st]]
                q = chunk * p + st
                if kind == "F":
                    dep = ("F", q - 1, i) if q > 0 else None
                else:
                    dep = ("B", q + 1, i) if q < last else ("F", q, i)
                if dep is not None and dep not in finish:
                    break  # waits on another stage
                cost = (forward if kind == "F" else backward) / virtual
                start = max(free[st], finish[dep] if dep else 0.0)
                finish[(kind, q, i)] = free[st] = start + cost
                busy[st] += cost
                nxt[st] += 1
                moved = True
    if any(nxt[st] < len(todo[st]) for st in range(p)):
        raise RuntimeError(f"schedule {schedule_name!r} deadlocks at p={p}, m={m}, v={virtual}")
    span = max(free)
    return sum(1 - b / span for b in busy) / p


def scaling_row(t1: float, tn: float, world: int) -> dict[str, float]:
    """speedup T1/TN and efficiency speedup/N."""
    speedup = t1 / tn if tn > 0 else math.nan
    return {"speedup": speedup, "efficiency": speedup / world}


# ==========================================================================
# Tables: a title, rows, notes; printed as markdown, saved as JSON.
# ==========================================================================


@dataclass
class Table:
    id: int
    title: str
    headers: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    align: list[str] | None = None

    def markdown(self) -> str:
        lines = [f"### Table {self.id}. {self.title}", "",
                 R.markdown_table(self.headers, self.rows, self.align)]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)


class Study:
    """Runs the measurements the selected tables need, once each, on reused pools."""

    def __init__(self, settings: Settings, progress: bool = True):
        self.s = settings
        self.machine = R.machine("gloo")
        self.cores = self.machine["cores"]
        self.pools: dict[int, WorkerPool] = {}
        self.progress = progress
        self.bar: Any = None
        self.coll: dict[tuple[int, int], dict[str, Any]] = {}  # (world, nbytes) -> aggregated
        self.gamma: dict[int, float] = {}
        self.dp: dict[tuple[int, int], dict[str, Any]] = {}  # (world, batch) -> impl -> aggregated
        self.pp: dict[tuple[str, str, int], dict[str, Any]] = {}  # (stage kind, schedule, m)
        self.tables: dict[int, Table] = {}
        self.t1_single_thread: set[int] = set()  # batches whose baseline ran faster on one thread
        self.failures: list[str] = []  # measurements that raised: their tables show the gap
        self.unit_seconds: dict[str, float] = {}  # wall time of each measurement (pool start included)
        self.started = time.time()

    # -- pools and progress ---------------------------------------------------
    def pool(self, world: int) -> WorkerPool:
        if world not in self.pools:
            self.pools[world] = WorkerPool(world)
        return self.pools[world]

    def run(self, world: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
        return self.pool(world).run(fn, *args, timeout=self.s.timeout)

    def close(self) -> None:
        for p in self.pools.values():
            p.close()
        self.pools.clear()
        if self.bar is not None:
            self.bar.close()

    # -- the plan ---------------------------------------------------------------
    def _need(self, *tables: int) -> bool:
        return any(t in self.s.tables for t in tables)

    def coll_sizes(self) -> list[int]:
        sizes: set[int] = set()
        if self._need(1, 7):
            sizes.add(self.s.big_bytes)
        if self._need(2, 7):
            sizes.add(self.s.small_bytes)
        if self._need(7):
            sizes.update(self.s.sweep_bytes)
        return sorted(sizes)

    def dp_plan(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """(world, global batch, impls) calls for tables 3, 4, 5."""
        plan: dict[tuple[int, int], set[str]] = {}
        n_max = self.s.sweep_world
        if self._need(3, 5):
            for w in self.s.dp_worlds:
                impls = {"compute"} if w == 1 else {"compute", "dt_off", "dt_on"}
                if w > 1 and self.s.torch_ddp and self._need(3):
                    impls.add("torch")
                plan.setdefault((w, self.s.dp_batch), set()).update(impls)
        if self._need(4):  # each world-N run times its own single-process baseline
            for b in self.s.sweep_batches:
                plan.setdefault((n_max, b), set()).update({"compute", "dt_off", "dt_on"})
        order = ["compute", "dt_off", "dt_on", "torch"]
        calls = [(w, b, tuple(i for i in order if i in impls))
                 for (w, b), impls in plan.items() if b % w == 0]
        return sorted(calls)

    def pp_schedules(self) -> tuple[str, ...]:
        """GPipe and 1F1B, and the interleaved schedule where dt.pipeline offers it."""
        from dt.parallel import pipeline

        try:
            pipeline.schedule("interleaved", 2, 0, 2, 2)
        except (ValueError, TypeError):
            return ("gpipe", "1f1b")
        return ("gpipe", "1f1b", "interleaved") if self.s.pp_virtual > 1 else ("gpipe", "1f1b")

    def pp_plan(self) -> list[tuple[str, str, int]]:
        """(stage kind, schedule, micro-batches): "linear" stages compute, "timed" ones sleep."""
        if not self._need(5, 6):
            return []
        kinds = ["linear"] + (["timed"] if self.s.pp_timed_s > 0 and self._need(6) else [])
        return [(kind, sched, m) for kind in kinds for sched in self.pp_schedules()
                for m in self.s.pp_micro if m <= self.s.pp_batch]

    def pp_virtual(self, sched: str) -> int:
        return self.s.pp_virtual if sched == "interleaved" else 1

    # -- measuring -----------------------------------------------------------
    def plan(self) -> list[tuple[int, str, Callable[[], None]]]:
        """Every measurement the selected tables need: (world, label, run), grouped by world.

        Grouped by world so each pool is started once, serves every table, and is
        closed before the next world's starts (fewer processes alive at once).
        """
        units: list[tuple[int, str, Callable[[], None]]] = []
        if self._need(1, 2, 7):
            sizes = self.coll_sizes()
            for world in self.s.coll_worlds:
                for nbytes in sizes:
                    units.append((world, f"all-reduce {R.fmt_bytes(nbytes)} world {world}",
                                  lambda w=world, n=nbytes: self.measure_allreduce(w, n, n == sizes[0])))
        for world, batch, impls in self.dp_plan():
            units.append((world, f"data parallel world {world} batch {batch}",
                          lambda w=world, b=batch, i=impls: self.measure_dp(w, b, i)))
        for kind, sched, m in self.pp_plan():
            units.append((self.s.pp_stages, f"pipeline {kind} {sched} m={m}",
                          lambda k=kind, sc=sched, mb=m: self.measure_pipeline(k, sc, mb)))
        return sorted(units, key=lambda u: u[0])  # stable: table order within a world

    def measure(self) -> None:
        units = self.plan()
        if self.progress:
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

    def coll_impls(self) -> tuple[str, ...]:
        """ring and naive (tables 1, 2), torch's gloo beside them, and for table 7 every
        all-reduce algorithm dt registers that model_terms knows."""
        from dt.collectives.registry import ALGORITHMS

        extra = ()
        if self._need(7):
            extra = tuple(a for a in MODELED_ALL_REDUCE[2:] if a in ALGORITHMS.get("all_reduce", {}))
        return ("ring", "naive", *extra, "gloo")

    def measure_allreduce(self, world: int, nbytes: int, with_gamma: bool) -> None:
        impls = self.coll_impls()
        res = self.run(world, _collectives_worker, nbytes, impls, self.s.coll_reps_for(nbytes),
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
        self.coll[(world, nbytes)] = agg

    def measure_dp(self, world: int, batch: int, impls: tuple[str, ...]) -> None:
        res = self.run(world, _dp_worker, batch, self.s.hidden, self.s.layers, impls,
                       self.s.dp_steps_for(batch), self.s.dp_warmup, self.s.dp_algorithm, world > 1)
        agg = {impl: aggregate_dp([r[impl] for r in res]) for impl in res[0]
               if impl not in ("t1", "t1_1t")}
        for k in ("t1", "t1_1t"):  # rank 0 alone ran the single-process baseline
            if res[0].get(k):
                agg[k] = aggregate_dp([res[0][k]])
        self.dp[(world, batch)] = agg

    def measure_pipeline(self, kind: str, sched: str, m: int) -> None:
        res = self.run(self.s.pp_stages, _pipeline_worker, sched, m, self.s.pp_batch,
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


# ==========================================================================
# Building the tables from the measurements.
# ==========================================================================


def _contention_notes(worlds: Sequence[int], cores: int) -> list[str]:
    over = [w for w in worlds if w > cores]
    if not over:
        return []
    return [f"world {', '.join(map(str, over))} > {cores} cores: those ranks share {cores} cores over "
            f"loopback TCP (oversubscribed); the run competes with itself, so those rows measure "
            f"contention as much as the algorithm"]


def table_allreduce_big(st: Study) -> Table:
    s, rows, data = st.s, [], []
    nbytes = s.big_bytes
    for world in s.coll_worlds:
        m = st.coll.get((world, nbytes))
        if m is None:
            rows.append([world] + ["not measured"] + ["-"] * 7)
            continue
        ring, naive, gloo = m["ring"], m["naive"], m["gloo"]
        model_ring = model_terms("ring", nbytes, world)["bytes_sent_max"]
        model_naive = model_terms("naive", nbytes, world)["bytes_sent_max"]
        speedup = naive["time"].median / ring["time"].median
        rows.append([world, R.fmt_bytes(ring["bytes_sent_max"]), R.fmt_bytes(model_ring),
                     R.fmt_bytes(naive["bytes_sent_max"]), R.fmt_bytes(model_naive),
                     R.fmt_stat_time(ring["time"]), R.fmt_stat_time(naive["time"]),
                     R.fmt_stat_time(gloo["time"]), R.fmt_ratio(speedup)])
        data.append({"world": world, "nbytes": nbytes,
                     "ring_bytes_sent_max": ring["bytes_sent_max"], "ring_bytes_model": model_ring,
                     "naive_bytes_sent_max": naive["bytes_sent_max"], "naive_bytes_model": model_naive,
                     "ring_time": ring["time"], "naive_time": naive["time"], "gloo_time": gloo["time"],
                     "ring_speedup": speedup})
    notes = [f"{R.fmt_bytes(nbytes)} = {nbytes:,} B of float32. Bytes: what the busiest rank sent, "
             f"counted by dt.traffic() on one call, next to dt.cost's arithmetic "
             f"(ring 2(p-1)/p n on every rank, naive (p-1) n from the root).",
             "Time: median over repetitions of the slowest rank (± half the min-max spread); "
             "ring speedup = naive time / ring time. gloo: torch.distributed.all_reduce on the same "
             "processes, for reference."]
    notes += _contention_notes(s.coll_worlds, st.cores)
    return Table(1, TITLES[1] if nbytes == T1_BYTES else f"Ring vs naive all-reduce, "
                 f"{nbytes / 1e6:.2f} MB float32",
                 ["world", "ring bytes/rank", "(model)", "naive bytes (root)", "(model)",
                  "ring time", "naive time", "gloo time", "ring speedup"], rows, notes, data)


def crossover_notes(st: Study) -> list[str]:
    """Per world: the largest measured size at which naive still beats the ring, and the next."""
    out = []
    for world in st.s.coll_worlds:
        sizes = sorted(n for (w, n) in st.coll if w == world)
        if len(sizes) < 3:
            continue
        faster = [st.coll[(world, n)]["naive"]["time"].median < st.coll[(world, n)]["ring"]["time"].median
                  for n in sizes]
        if all(faster):
            out.append(f"world {world}: naive is faster at every size up to {R.fmt_bytes(sizes[-1])}")
        elif not any(faster):
            out.append(f"world {world}: the ring is faster at every size from {R.fmt_bytes(sizes[0])}")
        else:
            last = max(k for k, f in enumerate(faster) if f)
            nxt = f", the ring from {R.fmt_bytes(sizes[last + 1])}" if last + 1 < len(sizes) else ""
            out.append(f"world {world}: naive up to {R.fmt_bytes(sizes[last])}{nxt}")
    return out


def table_allreduce_small(st: Study) -> Table:
    s, rows, data = st.s, [], []
    nbytes = s.small_bytes
    for world in s.coll_worlds:
        m = st.coll.get((world, nbytes))
        if m is None:
            rows.append([world] + ["not measured"] + ["-"] * 8)
            continue
        ring, naive, gloo = m["ring"], m["naive"], m["gloo"]
        tr, tn = model_terms("ring", nbytes, world), model_terms("naive", nbytes, world)
        naive_speedup = ring["time"].median / naive["time"].median
        rows.append([world, tr["steps"], tn["steps"], ring["messages_sent_max"],
                     naive["messages_sent_max"], R.fmt_stat_time(ring["time"]),
                     R.fmt_stat_time(naive["time"]), R.fmt_stat_time(gloo["time"]),
                     R.fmt_ratio(naive_speedup), "naive" if naive_speedup > 1 else "ring"])
        data.append({"world": world, "nbytes": nbytes, "ring_steps": tr["steps"],
                     "naive_steps": tn["steps"], "ring_messages_max": ring["messages_sent_max"],
                     "naive_messages_max": naive["messages_sent_max"], "ring_time": ring["time"],
                     "naive_time": naive["time"], "gloo_time": gloo["time"],
                     "naive_speedup": naive_speedup})
    notes = [f"{R.fmt_bytes(nbytes)} = {nbytes:,} B. Steps: sequential message rounds (latency "
             "terms) from dt.cost: the ring pays 2(p-1), naive 2 (reduce, then broadcast). "
             "Messages: the most any rank sent (the root's p-1 sends per phase in naive, which "
             "go out at once).",
             "naive speedup = ring time / naive time; above 1x the naive all-reduce wins."]
    cross = crossover_notes(st)
    if cross:
        notes.append("Where the ring takes over (every measured size, all-reduce sweep): " + "; ".join(cross))
    notes += _contention_notes(s.coll_worlds, st.cores)
    return Table(2, TITLES[2] if nbytes == T2_BYTES else f"Ring vs naive all-reduce, "
                 f"{nbytes / 1e6:.2f} MB float32",
                 ["world", "ring steps", "naive steps", "ring msgs", "naive msgs (root)",
                  "ring time", "naive time", "gloo time", "naive speedup", "faster"], rows, notes, data)


def _dp_t1(st: Study, batch: int, world: int = 1) -> float:
    """T1: the fastest single-process step this study measured at this global batch.

    Candidates: the world-1 run, and rank 0 alone before and after each world's
    data-parallel steps; each with all cores as threads, and once with one thread
    (on a loaded machine torch's threads can slow one process down). The fastest
    is the most conservative baseline: no speedup is flattered by a slow T1, and
    a load change between runs can only make a speedup look worse. (`world` is
    kept for callers; every row of one batch shares its T1.)
    """
    best, one_thread = math.nan, False
    for (w, b), m in st.dp.items():
        if b != batch:
            continue
        for key, single in (("compute", False), ("compute_1t", True), ("t1", False),
                            ("t1_1t", True)):
            if key == "compute" and w != 1 or key not in m:
                continue
            t = m[key]["step"].median
            if math.isnan(best) or t < best:
                best, one_thread = t, single
    if one_thread:
        st.t1_single_thread.add(batch)
    return best


def _superlinear_note(effs: Sequence[float], cores: int) -> list[str]:
    """Efficiency above 100% is not a result on a machine this size: say what it is."""
    if not any(e > 1.05 for e in effs if not math.isnan(e)):
        return []
    return ["Efficiency above 100% is not a real gain here: the one-process baseline (T1) and the "
            "row were measured minutes apart, and the machine's load changed in between (other "
            f"work on the {cores} cores), or the baseline's threads ran worse than separate "
            "processes. Compare rows of the same world with each other, not with T1, and rerun on "
            "an idle machine."]


def _t1_notes(st: Study, batches: Sequence[int]) -> list[str]:
    slowed = sorted(st.t1_single_thread & set(batches))
    if not slowed:
        return []
    return [f"At global batch {', '.join(map(str, slowed))} the single process "
            f"ran faster on one thread than on {st.cores} (the machine was loaded by other work, "
            "and torch's threads contended for the cores): T1 is the one-thread step, so speedups "
            "are not flattered by a slowed baseline."]


def table_dp(st: Study) -> Table:
    s, rows, data = st.s, [], []
    batch = s.dp_batch
    labels = {"compute": "single process", "dt_off": "dt DDP, overlap off",
              "dt_on": "dt DDP, overlap on", "torch": "torch DDP (gloo)"}
    for world in s.dp_worlds:
        m = st.dp.get((world, batch))
        if not m:
            continue
        t1 = _dp_t1(st, batch, world)
        for impl in (("compute",) if world == 1 else ("compute", "dt_off", "dt_on", "torch")):
            if impl not in m:
                continue
            a = m[impl]
            step = t1 if world == 1 else a["step"].median
            label = labels[impl] if world == 1 or impl != "compute" else "no communication (bound)"
            sc = scaling_row(t1, step, world)
            if impl.startswith("dt"):
                exposed = a["exposed"].median
                comm = a["comm"].median
                hidden = a["hidden"].median
            elif impl == "torch":
                # torch's DDP exposes no timers: exposed = its step minus the same ranks' step
                # with no communication (measured in the same run); hidden is not observable.
                exposed = max(0.0, step - m["compute"]["step"].median)
                comm, hidden = math.nan, math.nan
            else:
                exposed, comm, hidden = 0.0, math.nan, math.nan
            frac = exposed / step if step else math.nan
            mb = a["bytes_sent"].median if "bytes_sent" in a else 0.0
            shown = R.fmt_time(t1) if world == 1 and batch in st.t1_single_thread else \
                R.fmt_stat_time(a["step"])
            rows.append([world, label, batch // world, shown, R.fmt_time(t1),
                         R.fmt_ratio(sc["speedup"]), R.fmt_pct(sc["efficiency"]), R.fmt_pct(frac),
                         R.fmt_time(comm), R.fmt_time(hidden), R.fmt_bytes(mb) if mb else "-"])
            data.append({"world": world, "impl": impl, "global_batch": batch,
                         "per_worker": batch // world, "step": a["step"], **sc,
                         "comm_fraction": frac, "exposed": exposed, "comm": comm, "hidden": hidden,
                         "bytes_sent_max": mb, "t1": t1})
    params = sum(p.numel() for p in reference_model(s.hidden, s.layers).parameters())
    notes = [f"Model: {s.layers} Linear({s.hidden}, {s.hidden}) layers, GELU between: {params:,} "
             f"parameters, {R.fmt_bytes(4 * params)} of float32 gradients all-reduced per step "
             f"(buckets of 25 MB, first 1 MB, algorithm={s.dp_algorithm!r}). Global batch {batch}, "
             f"split evenly; MSE loss, SGD step.",
             "speedup = T1 / s/step, T1 = the fastest single-process step (the whole batch, all cores "
             "as threads) this study measured at the same global batch: in the world-1 run and by "
             "rank 0 alone before and after each world's data-parallel steps, so a speedup is never "
             "flattered by a slow baseline; efficiency = speedup / world. "
             "'no communication (bound)': the same ranks' step with the gradient "
             "exchange left out, all computing at once: the best any data parallel could do here. "
             "comm fraction = exposed communication / step (what the step waited "
             "for); comm = time the all-reduces ran; hidden = comm - exposed (ran under backward).",
             f"Each world size runs {os.cpu_count()} cores' worth of threads in all "
             "(torch.set_num_threads(cores // world), at least 1), so compute cannot scale past "
             "the core count: efficiency at world > cores is bounded by cores/world."]
    notes += _t1_notes(st, [batch])
    notes += _superlinear_note([d["efficiency"] for d in data], st.cores)
    notes += _contention_notes(s.dp_worlds, st.cores)
    return Table(3, f"{TITLES[3]} (global batch {batch})",
                 ["world", "implementation", "per worker", "s/step", "T1", "speedup", "efficiency",
                  "comm fraction", "comm", "hidden", "bytes sent/rank"],
                 rows, notes, data, align=["r", "l"] + ["r"] * 9)


def table_sweep(st: Study) -> Table:
    s, rows, data = st.s, [], []
    grad_bytes = 4 * sum(p.numel() for p in reference_model(s.hidden, s.layers).parameters())
    n = s.sweep_world
    for batch in s.sweep_batches:
        m = st.dp.get((n, batch))
        if not m or batch % n:
            continue
        t1 = _dp_t1(st, batch, n)
        off, on, comp = m["dt_off"], m["dt_on"], m["compute"]
        sc_off = scaling_row(t1, off["step"].median, n)
        sc_on = scaling_row(t1, on["step"].median, n)
        frac = off["exposed"].median / off["step"].median
        frac_on = on["exposed"].median / on["step"].median
        rows.append([f"{batch:,}", batch // n, R.fmt_time(t1), R.fmt_stat_time(off["step"]),
                     R.fmt_ratio(sc_off["speedup"]), R.fmt_pct(sc_off["efficiency"]),
                     R.fmt_pct(frac), R.fmt_time(comp["step"].median), R.fmt_time(off["comm"].median),
                     R.fmt_stat_time(on["step"]), R.fmt_pct(sc_on["efficiency"]), R.fmt_pct(frac_on)])
        data.append({"world": n, "global_batch": batch, "per_worker": batch // n, "t1": t1,
                     "step_off": off["step"], "speedup_off": sc_off["speedup"],
                     "efficiency_off": sc_off["efficiency"], "comm_fraction_off": frac,
                     "compute": comp["step"], "comm": off["comm"], "step_on": on["step"],
                     "speedup_on": sc_on["speedup"], "efficiency_on": sc_on["efficiency"],
                     "comm_fraction_on": frac_on})
    notes = [f"World {n}, the reference model; T1 = the fastest single-process step (all {st.cores} "
             "cores) measured at the same global batch (by rank 0 alone, before and after the run's "
             "data-parallel steps, and in the world-1 run where there is one). "
             "compute = the same ranks' step with no communication, all computing at "
             "once; comm = time the gradient all-reduces ran in the overlap-off step.",
             f"Efficiency follows compute per byte of gradient: the gradient is the same "
             f"{R.fmt_bytes(grad_bytes)} at every batch, compute grows with the batch."]
    notes += _t1_notes(st, s.sweep_batches)
    notes += _superlinear_note([d[k] for d in data for k in ("efficiency_off", "efficiency_on")],
                               st.cores)
    notes += _contention_notes([n], st.cores)
    return Table(4, f"{TITLES[4]} (world {n})",
                 ["global batch", "per worker", "T1", "s/step (off)", "speedup", "efficiency",
                  "comm fraction", "compute", "comm", "s/step (on)", "efficiency (on)",
                  "comm fraction (on)"], rows, notes, data)


def table_breakdown(st: Study) -> Table:
    s, rows, data = st.s, [], []

    def add(label: str, step: float, compute: float, exposed: float, hidden: float,
            bubble: float, efficiency: float, extra: dict[str, Any]) -> None:
        parts = breakdown(step, compute, exposed, hidden, bubble)
        rows.append([label, R.fmt_time(step)] + [R.fmt_pct(parts[k]) for k in BREAKDOWN_PARTS]
                    + [R.fmt_pct(sum(parts.values())), R.fmt_pct(efficiency)])
        data.append({"configuration": label, "step": step, **parts, "efficiency": efficiency, **extra})

    configs = [(w, s.dp_batch) for w in s.dp_worlds]
    if 4 in s.tables:
        configs += [(s.sweep_world, b) for b in s.sweep_batches if b != s.dp_batch]
    for world, batch in configs:
        m = st.dp.get((world, batch))
        if not m:
            continue
        t1 = _dp_t1(st, batch, world)
        if world == 1:
            step = t1
            add(f"DP world 1, batch {batch}", step, step, 0.0, 0.0, 0.0, 1.0, {"world": 1})
            continue
        for impl, name in (("dt_off", "overlap off"), ("dt_on", "overlap on")):
            if impl not in m:
                continue
            a = m[impl]
            step = a["step"].median
            compute = a["forward"].median + a["backward_compute"].median + a["optimizer"].median
            add(f"DP world {world}, batch {batch}, {name}", step, compute, a["exposed"].median,
                a["hidden"].median, 0.0, t1 / step / world, {"world": world, "impl": impl})
    for (kind, sched, mb), a in sorted(st.pp.items()):
        if kind != "linear":
            continue
        step = a["step"].median
        v = st.pp_virtual(sched)
        name = f"{sched} v={v}" if v > 1 else sched
        add(f"PP {s.pp_stages} stages, {name}, m={mb}", step, a["compute"].median, 0.0, 0.0,
            a["idle"].median, math.nan, {"stages": s.pp_stages, "schedule": sched, "micro": mb})
    notes = ["Each row splits one step's wall time (median over steps; per-rank figures averaged "
             "over ranks): compute = forward + backward + optimizer with nothing under it; hidden "
             "comm = backward time during which an all-reduce ran underneath (the overlap); exposed "
             "comm = time waiting for the all-reduces after backward; pipeline bubble = a stage "
             "waiting on its neighbours (includes the time its activations spent on the wire); "
             "rest = the remainder (Python, contention between ranks sharing cores, idle).",
             "efficiency (not part of the sum) = T1 / (world x step). Compute at world N includes "
             "the slowdown of ranks that share cores, so on this machine part of the lost "
             "efficiency hides inside 'compute' (compare its seconds with T1/N in table 3)."]
    notes += _contention_notes(sorted({w for w, _ in configs} | {s.pp_stages}), st.cores)
    return Table(5, TITLES[5],
                 ["configuration", "step"] + [BREAKDOWN_LABELS[k] for k in BREAKDOWN_PARTS]
                 + ["sum", "efficiency"], rows, notes, data,
                 align=["l"] + ["r"] * (len(BREAKDOWN_PARTS) + 3))


def table_pipeline(st: Study) -> Table:
    from dt.parallel.pipeline import bubble_fraction

    s, rows, data = st.s, [], []
    p = s.pp_stages
    order = {"gpipe": 0, "1f1b": 1, "interleaved": 2}
    configs = sorted({(sched, m) for _, sched, m in st.pp}, key=lambda c: (order.get(c[0], 3), c[1]))
    for sched, m in configs:
        v = st.pp_virtual(sched)
        theory = bubble_fraction(p, m, v)
        exact = simulate_bubble(sched, p, m, v)
        lin, timed = st.pp.get(("linear", sched, m)), st.pp.get(("timed", sched, m))
        name = f"{sched} (v={v})" if v > 1 else sched
        row: list[Any] = [name, m, R.fmt_pct(theory, 1), R.fmt_pct(exact, 1)]
        entry: dict[str, Any] = {"schedule": sched, "virtual": v, "stages": p, "micro_batches": m,
                                 "theory": theory, "schedule_exact": exact}
        for kind, a in (("timed", timed), ("linear", lin)):
            if a is None:
                row += ["-", "-"] if kind == "timed" else ["-", "-", "-", "-"]
                continue
            per_stage = a["bubble_per_stage"]
            spread = f"{R.fmt_pct(min(per_stage))}..{R.fmt_pct(max(per_stage))}"
            row += [R.fmt_pct(a["bubble"].median, 1), spread]
            if kind == "linear":
                row += [R.fmt_stat_time(a["step"]), max(a["peak_stash"])]
            entry[kind] = {"measured": a["bubble"], "per_stage": per_stage, "step": a["step"],
                           "peak_stash": a["peak_stash"], "bytes_sent_max": a["bytes_sent_max"]}
        entry["measured"] = (timed or lin)["bubble"]
        rows.append(row)
        data.append(entry)
    notes = ["formula: (p-1)/(m+p-1), (p-1)/(vm+p-1) interleaved. schedule: the bubble of "
             "dt.pipeline's own action order played out with free messages (simulate_bubble; "
             "backward = 2x forward); it equals the formula except interleaving with m < p, where "
             "micro-batches cannot fill the virtual stages.",
             f"{p} stages, batch {s.pp_batch} cut into m micro-batches, dt.pipeline.Pipeline."
             "train_step (forward and backward). Measured bubble: each stage's idle time (blocked "
             "receiving or on its last sends, plus waiting for the slowest stage to finish) over "
             "the pipeline's step (the slowest stage's), averaged over stages (range over stages "
             "beside it); median over steps.",
             f"timed stages: each stage's forward takes {s.pp_timed_s * 1e3:g} ms and its backward "
             f"{2 * s.pp_timed_s * 1e3:g} ms per micro-batch without holding a core (a sleep), so "
             "the bubble is the schedule's alone, free of core sharing; what it shows above the "
             "formula is message latency.",
             f"linear stages: {s.pp_blocks_per_stage} (Linear({s.pp_hidden}), GELU) blocks each, "
             "real compute. Idle time includes the wire time of activations and gradients. Peak "
             "stash: the most micro-batches whose activations any stage held (GPipe m, 1F1B at "
             "most p)."]
    if "interleaved" in st.pp_schedules():
        v = s.pp_virtual
        notes.append(f"interleaved (v={v}): each rank holds {v} chunks of 1/{v} the layers (Megatron's "
                     f"order); the formula is (p-1)/(v m + p-1), bought with {v} times the messages.")
    if p > st.cores:
        notes.append(f"{p} stages > {st.cores} cores (oversubscribed): linear stages busy at the "
                     "same time share the cores, so a full pipe computes slower per stage than a "
                     "filling one; that distorts their bubble in both directions, which is why the "
                     "timed stages are shown first.")
    return Table(6, f"{TITLES[6]} ({p} stages)",
                 ["schedule", "micro-batches", "formula", "schedule", "timed stages", "per stage",
                  "linear stages", "per stage", "s/step (linear)", "peak stash"], rows, notes, data)


def load_tuned(world: int, backend: str = "gloo") -> dict[str, Any] | None:
    """alpha, beta, gamma that `dt tune --world N` saved for exactly this backend and world."""
    from dt.cost import machine

    try:
        got = machine.figures(backend, world)
    except Exception:  # noqa: BLE001 - an unreadable cache is the same as none
        return None
    if not got or got.get("world") != world or not all(
            isinstance(got.get(k), (int, float)) for k in ("alpha", "beta", "gamma")):
        return None
    return got


def table_model(st: Study) -> Table:
    s, rows, data, notes = st.s, [], [], []
    fits: dict[int, dict[str, Any]] = {}
    any_tuned = False
    for world in s.coll_worlds:
        algos = [a for a in st.coll_impls() if a in MODELED_ALL_REDUCE]
        points = []
        sizes = [n for n in st.coll_sizes() if (world, n) in st.coll]
        if not sizes:
            notes.append(f"world {world}: not measured")
            continue
        for nbytes in sizes:
            for algo in algos:
                t = st.coll[(world, nbytes)][algo]["time"].median
                points.append((model_terms(algo, nbytes, world), t))
        gamma = st.gamma.get(world, 0.0)
        alpha_fit, beta_fit = fit_alpha_beta(points, gamma)
        fit = {"alpha": alpha_fit, "beta": beta_fit, "gamma": gamma,
               "source": f"fitted to this run's {len(points)} all-reduce timings (gamma: torch.add "
                         "on every rank at once)"}
        tuned = load_tuned(world)
        fits[world] = {"fit": fit, "tune": tuned}
        primary = fit
        if tuned is not None:
            any_tuned = True
            primary = {"alpha": tuned["alpha"], "beta": tuned["beta"], "gamma": tuned["gamma"],
                       "source": f"`dt tune --world {world}` ({tuned.get('measured_at', 'saved')})"}
        for name, f in (("dt tune", primary if tuned is not None else None), ("fit", fit)):
            if f is None:
                continue
            bw = 1 / f["beta"] / 1e9 if f["beta"] else math.inf
            gbw = 1 / f["gamma"] / 1e9 if f["gamma"] else math.inf
            notes.append(f"world {world}, {name}: alpha = {f['alpha'] * 1e6:.0f} us per step, "
                         f"beta = {f['beta'] * 1e9:.3f} ns/B ({bw:.2f} GB/s), gamma = "
                         f"{f['gamma'] * 1e9:.3f} ns/B ({gbw:.2f} GB/s); {f['source']}")
        if tuned is None:
            notes.append(f"world {world}: no `dt tune --world {world}` figures saved on this machine; "
                         "the prediction uses the fit")
        for algo in algos:
            for nbytes in sizes:
                terms = model_terms(algo, nbytes, world)
                t = st.coll[(world, nbytes)][algo]["time"]
                a, b, g = primary["alpha"], primary["beta"], primary["gamma"]
                pred = predict(terms, a, b, g)
                pred_fit = predict(terms, alpha_fit, beta_fit, gamma)
                ratio = pred / t.median if t.median else math.nan
                ratio_fit = pred_fit / t.median if t.median else math.nan
                algbw, busbw = cost.bus_bandwidth("all_reduce", nbytes, t.median, world)
                row = [world, algo, R.fmt_bytes(nbytes), terms["steps"],
                       R.fmt_time(terms["steps"] * a), R.fmt_time(terms["beta_bytes"] * b),
                       R.fmt_time(terms["gamma_bytes"] * g), R.fmt_time(pred), R.fmt_stat_time(t),
                       R.fmt_ratio(ratio)]
                if tuned is not None or any_tuned:
                    row += [R.fmt_ratio(ratio_fit) if tuned is not None else "(same)"]
                rows.append(row + [f"{busbw / 1e9:.2f}"])
                data.append({"world": world, "algorithm": algo, "nbytes": nbytes, **terms,
                             "predicted": pred, "predicted_by": "dt tune" if tuned else "fit",
                             "predicted_fit": pred_fit, "measured": t, "ratio": ratio,
                             "ratio_fit": ratio_fit, "algbw": algbw, "busbw": busbw})
    if any_tuned:  # rows of untuned worlds were built before a later world was found tuned
        width = max(len(r) for r in rows)
        rows = [r if len(r) == width else r[:-1] + ["(same)", r[-1]] for r in rows]
    notes.insert(0, "time = steps x alpha + bytes on the critical path x beta + bytes reduced x "
                    "gamma (ring: 2(p-1) steps, 2(p-1)/p n sent by each rank at once, (p-1)/p n "
                    "reduced; naive: 2 steps, the root receives (p-1) n then sends (p-1) n and "
                    "reduces (p-1) n; recursive doubling: lg p steps of n each; Rabenseifner: 2 lg p "
                    "steps, 2(p-1)/p n; +2 steps and n when p is not a power of two). The terms use "
                    + ("`dt tune`'s figures where saved, else the fit. " if any_tuned else
                       "alpha and beta fitted to this table's own timings (least squares in "
                       "relative error), so pred/meas shows how well one latency and one bandwidth "
                       "explain every algorithm and size. ")
                    + "pred/meas: 1.00x is a perfect model. busbw = n/t x 2(p-1)/p (nccl-tests).")
    notes += _contention_notes(s.coll_worlds, st.cores)
    headers = ["world", "algorithm", "size", "steps", "alpha term", "beta term", "gamma term",
               "predicted", "measured", "pred/meas"] + (["pred/meas (fit)"] if any_tuned else []) \
        + ["busbw GB/s"]
    t = Table(7, TITLES[7], headers, rows, notes, data, align=["r", "l"] + ["r"] * (len(headers) - 2))
    t.fits = fits  # type: ignore[attr-defined]
    return t


BUILDERS: dict[int, Callable[[Study], Table]] = {
    1: table_allreduce_big, 2: table_allreduce_small, 3: table_dp, 4: table_sweep,
    5: table_breakdown, 6: table_pipeline, 7: table_model,
}


# ==========================================================================
# Report: terminal, JSON, markdown, plots, README.
# ==========================================================================


def fmt_duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} minutes"


def command_line(argv: Sequence[str]) -> str:
    return "python bench/scaling.py" + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))


def report_markdown(st: Study, command: str, elapsed: float, for_readme: bool = False) -> str:
    m = st.machine
    head = [] if for_readme else ["# dt scaling study", ""]
    head += [f"Produced by `{command}` in {fmt_duration(elapsed)} on {R.machine_line(m)}.", ""]
    notes = list(st.s.shrinkage())
    notes.append("Cross-rank argument validation was off while timing "
                 "(dt.transport.set_validation(False)).")
    over = [w for w in st.s.worlds_used() if w > m["cores"]]
    if over:
        notes.append(f"World sizes {', '.join(map(str, over))} exceed the {m['cores']} cores: those "
                     "runs compete with themselves (loopback, oversubscribed).")
    notes += [f"FAILED (its rows are missing): {f}" for f in st.failures]
    head += [f"- {n}" for n in notes] + [""]
    tables = [readme_view(st, t) if for_readme else t for _, t in sorted(st.tables.items())]
    body = [t.markdown() for t in tables]
    if for_readme:
        body.append(f"Plots (time and bytes vs world size, busbw vs message size, efficiency vs "
                    f"batch, the breakdown, the bubble) and the full JSON are written to "
                    f"`{st.s.out_dir}/` by the same command.")
    return "\n".join(head) + "\n" + "\n\n".join(body) + "\n"


def readme_view(st: Study, t: Table) -> Table:
    """What the README shows of a table: table 7 cut to ring and naive at tables 1 and 2's sizes
    (the full sweep stays in results/scaling.md)."""
    if t.id != 7:
        return t
    keep_sizes = {R.fmt_bytes(st.s.big_bytes), R.fmt_bytes(st.s.small_bytes)}
    rows = [r for r in t.rows if r[1] in ("ring", "naive") and r[2] in keep_sizes]
    notes = t.notes + [f"Shown: ring and naive at {' and '.join(sorted(keep_sizes))}; every "
                       "algorithm at every size is in results/scaling.md."]
    return Table(t.id, t.title, t.headers, rows, notes, t.data, t.align)


def write_outputs(st: Study, out_dir: Path, command: str, elapsed: float) -> list[Path]:
    paths = []
    payload = {
        "command": command,
        "machine": st.machine,
        "elapsed_s": elapsed,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(st.s).items()},
        "notes": st.s.shrinkage() + ["validation off while timing (dt.transport.set_validation(False))"],
        "failures": st.failures,
        "seconds_per_measurement": st.unit_seconds,
        "tables": {str(i): {"title": t.title, "headers": t.headers, "rows": t.rows, "notes": t.notes,
                            "data": t.data, "machine": st.machine,
                            **({"fits": t.fits} if hasattr(t, "fits") else {})}
                   for i, t in sorted(st.tables.items())},
    }
    paths.append(R.write_json(out_dir / "scaling.json", payload))
    paths.append(R.write_text(out_dir / "scaling.md", report_markdown(st, command, elapsed)))
    return paths


def parse_args(argv: Sequence[str]) -> tuple[Settings, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="dt bench scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions (< 2 min)")
    ap.add_argument("--tables", default=None, help="comma-separated table numbers (default all: 1-7)")
    ap.add_argument("--worlds", default=None, help="world sizes for the collectives, e.g. 2,4,8")
    ap.add_argument("--dp-worlds", default=None, help="world sizes for data parallel, e.g. 1,2,4,8")
    ap.add_argument("--dp-batch", type=int, default=None, help="global batch of table 3")
    ap.add_argument("--batches", default=None, help="global batches of table 4, e.g. 256,1024,4096")
    ap.add_argument("--hidden", type=int, default=None, help="width of the reference model")
    ap.add_argument("--layers", type=int, default=None, help="linear layers of the reference model")
    ap.add_argument("--micro", default=None, help="pipeline micro-batch counts, e.g. 1,4,16")
    ap.add_argument("--stages", type=int, default=None, help="pipeline stages (default 4)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per collective")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per DP / pipeline config")
    ap.add_argument("--big", type=int, default=None, help="bytes of table 1's all-reduce")
    ap.add_argument("--small", type=int, default=None, help="bytes of table 2's all-reduce")
    ap.add_argument("--algorithm", default=None, help="all-reduce algorithm inside dt's DDP")
    ap.add_argument("--no-torch-ddp", action="store_true", help="skip torch's DDP in table 3")
    ap.add_argument("--out", default=None, help="output directory (default results/)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--update-readme", action="store_true",
                    help="write the tables between the README's scaling markers")
    a = ap.parse_args(list(argv))

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(v) for v in text.replace(" ", "").split(",") if v)

    s = Settings()
    if a.quick:
        quick_settings(s)
    if a.tables:
        s.tables = tuple(t for t in ints(a.tables) if t in ALL_TABLES)
    if a.worlds:
        s.coll_worlds = ints(a.worlds)
    if a.dp_worlds:
        s.dp_worlds = ints(a.dp_worlds)
    if a.dp_batch:
        s.dp_batch = a.dp_batch
    if a.batches:
        s.sweep_batches = ints(a.batches)
    if a.hidden:
        s.hidden = a.hidden
    if a.layers:
        s.layers = a.layers
    if a.micro:
        s.pp_micro = ints(a.micro)
    if a.stages:
        s.pp_stages = a.stages
    if a.reps:
        s.coll_reps = a.reps
    if a.steps:
        s.dp_steps = s.pp_steps = a.steps
    if a.big:
        s.big_bytes = a.big
    if a.small:
        s.small_bytes = a.small
    if a.algorithm:
        s.dp_algorithm = a.algorithm
    if a.no_torch_ddp:
        s.torch_ddp = False
    if a.out:
        s.out_dir = Path(a.out)
    s.plots = not a.no_plots
    s.update_readme = a.update_readme
    if 1 not in s.dp_worlds and s.tables and any(t in s.tables for t in (3, 4, 5)):
        s.dp_worlds = (1, *s.dp_worlds)  # speedup needs the single-process baseline
    return s, a


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    s, a = parse_args(argv)
    command = command_line(argv)
    st = Study(s, progress=not a.no_progress)
    print(f"dt scaling study: tables {', '.join(map(str, s.tables))} on {R.machine_line(st.machine)}")
    for n in s.shrinkage():
        print(f"  - {n}")
    print("  - cross-rank validation is off while timing (dt.transport.set_validation(False))")
    for w in s.worlds_used():
        note = R.oversubscription_note(w, st.cores)
        if note:
            print(f"  - {note}")
    t0 = time.time()
    try:
        st.measure()
    finally:
        st.close()
    elapsed = time.time() - t0
    for i in s.tables:
        try:
            st.tables[i] = BUILDERS[i](st)
        except Exception as exc:  # noqa: BLE001 - a table missing its data is reported, not fatal
            st.failures.append(f"table {i} could not be built: {type(exc).__name__}: {exc}")
            continue
        print("\n" + st.tables[i].markdown(), flush=True)
    out_dir = s.out_dir if s.out_dir.is_absolute() else Path.cwd() / s.out_dir
    paths = write_outputs(st, out_dir, command, elapsed)
    if s.plots:
        from dt.bench.scaling import plots

        try:
            paths += plots.write_all(st, out_dir)
        except Exception as exc:  # noqa: BLE001 - the tables and JSON are already on disk
            st.failures.append(f"plots: {type(exc).__name__}: {exc}")
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    if s.update_readme:
        body = report_markdown(st, command, elapsed, for_readme=True)
        readme = Path.cwd() / "README.md"  # --update-readme runs from the checkout
        if R.update_readme(readme, body):
            print(f"updated {readme} between {R.README_BEGIN} and {R.README_END}")
        else:
            print(f"README.md has no {R.README_BEGIN} ... {R.README_END} markers: not updated")
    print(f"done: {fmt_duration(elapsed)} of measurement")
    if st.failures:
        print(f"{len(st.failures)} measurement(s) failed:\n  " + "\n  ".join(st.failures))
        return 1
    return 0
