"""The study's rank workers: module-level functions every rank of a WorkerPool runs.

Each returns this rank's raw figures (seconds per repetition, bytes counted by
the transport); the Study (study.py) takes the slowest rank per repetition and
the median over repetitions. Cross-rank argument validation is off while timing
(dt.transport.set_validation(False)), as torch.distributed runs without one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dt import transport
from dt.bench.ddp import reference_model, step_worker
from dt.bench.harness import (
    TORCH,
    BenchCase,
    barrier,
    reduction_seconds_per_byte,
    slope,
    time_calls,
    wire_group,
)
from dt.device import clock

__all__ = ["TimedStage", "collectives_worker", "dp_worker", "pipeline_worker", "single_process_step"]


_WIRES: dict[str, Any] = {}  # this process's group per wire, made once (each group costs threads)


def _on_wire(impl: str) -> tuple[str, Any]:
    """'two_shot@shm' -> ('two_shot', the shm group). A plain name runs on the torch wire (the
    sockets the original design measured), so tables 1, 2 and 7 keep their meaning."""
    name, _, wire = impl.partition("@")
    wire = wire or "torch"
    if wire not in _WIRES:
        _WIRES[wire] = wire_group(wire)
    return name, _WIRES[wire]


def memcpy_seconds_per_byte(sizes: Sequence[int] = (1 << 20, 4 << 20, 16 << 20), reps: int = 5) -> float:
    """The slope of a copy's time over its bytes, every rank copying at once: the bound of any
    shared-memory step (what `dt tune` saves as the shm wire's `mem`)."""
    times = {}
    for nbytes in sizes:
        src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        dst.copy_(src)
        samples = []
        for _ in range(reps):
            barrier()
            t0 = time.perf_counter()
            dst.copy_(src)
            samples.append(time.perf_counter() - t0)
        times[nbytes] = sorted(samples)[len(samples) // 2]
    return slope(times)


def collectives_worker(nbytes: int, impls: Sequence[str], reps: int, warmup: int,
                       measure_gamma: bool = False) -> dict[str, Any]:
    """Time all-reduce of `nbytes` float32 for each impl ("ring", "naive", ..., "gloo": torch's;
    "two_shot@shm": an algorithm on the shared-memory wire, plain names on the torch wire).

    The impls take turns within each repetition, in an order that rotates
    (dt/bench/harness.py), so a change in the machine's load hits them alike.
    Returns, for this rank: seconds per repetition, and what the first
    (untimed) call of each dt algorithm moved, as the transport counted it
    (only what is charged to the all-reduce: not the barrier before it).
    """
    transport.set_validation(False)
    case = BenchCase("all_reduce", nbytes // 4)
    calls = {}
    for impl in impls:
        name, group = _on_wire(impl) if impl != "gloo" else (TORCH, None)
        calls[impl] = case.call(name, inplace=True, group=group)
    out: dict[str, Any] = {"times": {}, "traffic": {}}
    for impl in impls:  # the first call of each is a warm-up; dt's are counted
        case.reset()  # in place: keep the values from growing p-fold every call
        barrier()
        with transport.traffic() as t:
            calls[impl]()
        if impl != "gloo":
            c = t.by_collective["all_reduce"]
            out["traffic"][impl] = {"bytes_sent": c.bytes_sent, "bytes_received": c.bytes_received,
                                    "messages_sent": c.messages_sent}
    out["times"] = time_calls(calls, reps, warmup=max(1, warmup) - 1, reset=case.reset)
    if measure_gamma:
        out["gamma"] = reduction_seconds_per_byte().gamma
        out["memcpy"] = memcpy_seconds_per_byte()
    return out


def single_process_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                        y: torch.Tensor) -> float:
    """Seconds of one training step of one process on the whole batch (the T1 of a speedup)."""
    t0 = clock(x.device)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return clock(x.device) - t0


def dp_worker(global_batch: int, hidden: int, layers: int, impls: Sequence[str], steps: int,
              warmup: int, algorithm: str = "auto", baseline: bool = False
              ) -> dict[str, list[dict[str, float]]]:
    """Data-parallel training steps of the reference model; this rank's timings per step.

    impls: "compute" (the local step with no communication at all: what each rank
    computes when N ranks compute at once; at world > 1 rank 0 then also times
    its share alone, "alone", while the others wait), "dt_off" / "dt_on" (dt's
    DistributedDataParallel, overlap off / on, with its own timers: backward
    compute, comm, exposed, hidden), "torch" (torch's DDP on gloo). The step
    itself is dt.bench.ddp.step_worker, so `dt bench ddp` and this study time the
    same thing; configurations alternate within each repetition, so drifts in the
    machine's load hit them alike.

    baseline=True (world > 1): rank 0 also times the single-process step (the
    whole global batch, all the machine's cores as threads) while the other ranks
    wait at a barrier, once before and again after the data-parallel steps, so
    the speedup's numerator is measured in the same minutes as its denominator.
    At world 1 the "compute" step is the baseline; one extra step at one thread
    guards it against a loaded machine on which torch's threads slow it down.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    single: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor] | None = None
    t1: list[dict[str, float]] = []

    device = transport.default_device(transport.resolve_group(None))  # the rank's GPU under NCCL

    def whole_batch(rows: int = global_batch) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor,
                                                      torch.Tensor]:
        torch.manual_seed(0)
        net = reference_model(hidden, layers).to(device)
        gen = torch.Generator().manual_seed(1000)
        return (net, torch.optim.SGD(net.parameters(), lr=1e-6),
                torch.randn(rows, hidden, generator=gen).to(device),
                torch.randn(rows, hidden, generator=gen).to(device))

    def share_alone(n: int, warm: int) -> list[dict[str, float]]:
        """Rank 0 computes one rank's share of the batch, with a rank's threads, while the others
        wait: what no data-parallel step can beat (its share's compute, nothing in its way)."""
        out = []
        if rank == 0:
            share = whole_batch(global_batch // p)
            for k in range(warm + n):
                dt_s = single_process_step(*share)
                if k >= warm:
                    out.append({"step": dt_s})
        barrier()
        return out

    def baseline_steps(n: int, warm: int, threads_now: int | None = None,
                       out: list[dict[str, float]] = t1) -> None:
        nonlocal single
        if rank == 0:
            threads = torch.get_num_threads()
            torch.set_num_threads(threads_now or os.cpu_count() or 1)
            try:
                if single is None:
                    single = whole_batch()
                for k in range(warm + n):
                    dt_s = single_process_step(*single)
                    if k >= warm:
                        out.append({"step": dt_s})
            finally:
                torch.set_num_threads(threads)
        barrier()  # the other ranks sit here, idle, while rank 0 has the machine

    if baseline and p > 1:
        baseline_steps(1, warmup)
    names = ["single" if i == "compute" else i for i in impls]
    got = step_worker(global_batch, hidden, layers, names, steps, warmup, 25.0, 1.0, algorithm)
    records = {("compute" if k == "single" else k): v for k, v in got.items()}
    for impl in ("dt_off", "dt_on"):  # the step's compute: all of it but the wait it exposed
        for rec in records.get(impl, []):
            rec["busy"] = rec["step"] - rec["exposed"]
    if p > 1 and "compute" in impls:
        records["alone"] = share_alone(steps, warmup)
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
            records["compute_1t"] = [{"step": single_process_step(*whole_batch())}]
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


def pipeline_worker(schedule_name: str, micro_batches: int, batch: int, hidden: int,
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
    device = transport.default_device(transport.resolve_group(None))  # the rank's GPU under NCCL
    stage.to(device)
    pipe = Pipeline(stage)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(batch, hidden, generator=gen).to(device) if rank == 0 else None
    y = torch.randn(batch, hidden, generator=gen).to(device) if rank == p - 1 else None
    out = []
    for it in range(warmup + steps):
        barrier()
        pipe.train_step(x, y, nn.functional.mse_loss, micro_batches=micro_batches,
                        schedule_name=schedule_name)
        stage.zero_grad(set_to_none=True)
        if it >= warmup:
            s = pipe.stats
            out.append({"step": s.step_s, "idle": s.idle_s, "compute": s.compute_s,
                        "peak_stash": float(s.peak_stash), "bytes_sent": float(s.bytes_sent)})
    return out
