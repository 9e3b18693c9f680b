"""`dt plan --check`: run the top layouts and a spread of the rest with dt train; predicted beside measured.

On a catalogue cluster (`--device h200`) the runs go on this host's GPUs
(dt train --device cuda over NCCL, the cluster's precision as autocast) and
the peak is the caching allocator's (torch.cuda.max_memory_allocated).

Each chosen layout becomes dt train's own options (dt.train.cli.parse_args:
the run is one dt train accepts) and runs in a fresh world on this machine:
dt train's model, optimizer and step (dt.train.loop.make_model: build.py's
TrainStep, which runs the optimizer inside), `steps` steps of which the first is
warm-up (groups connect, buffers are made); the measured step is the median
of the rest on the slowest rank. Beside it, the busiest rank's process CPU
time per step (time.process_time: its threads and spin-waits), against the
predicted step less its bubble: with a core per rank that is the same
figure, and other programs' turns on the cores add to wall time, not to it.
Memory: a second, two-step run of the same
layout inside dt.device_memory.LiveBytes (the peak of live tensor bytes,
what dt counts on the CPU; the counting slows it, so it is not timed), plus the
shared-memory buffers the parameters and gradients live in (shared_bytes: made by
torch.frombuffer, outside the counter's sight).

The measured timeline (trace.py): each step's span on every rank, every
synchronous collective's wait inside it (the transport's `blocking` wrapper,
where dt charges a step's unhidden communication), the optimizer's span,
and the gaps between collectives inside train_step as compute (pipeline
sends and receives included there: they are waited on inside the pipeline's
own wire, not through `blocking`).

Across hosts (a `dt cluster` topology: the plan's Cluster has hosts > 1) each
run, timing and memory alike, goes to a fresh simulated cluster of the planned
shape instead (dt.launcher.cluster.launch: the same worker under torchrun on
every host, each rank's result back through a temporary directory), its links
capped at dt plan's --link (the rate the cluster's `dt tune` figures were
measured at, 1Gbit by default); tp inside or across hosts as the layout was
priced (dt train's --layout).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from dt.parallel.recompute import recompute_kind
from dt.plan.cluster import TRAIN_PRECISION, Cluster
from dt.plan.compute import TimedShape, rank_threads
from dt.plan.layouts import CLIP, Layout
from dt.plan.memory import counted
from dt.plan.model import ModelShape
from dt.plan.search import Row

__all__ = ["busy_seconds", "check", "chosen", "comparison", "launcher", "measure_worker", "train_argv"]

Launch = Callable[..., list[Any]]  # launch(worker, world, *args): every rank's result, in rank order
FIRST_RUNS = 3  # the first-ranked layouts every --check runs: whether the ranking's top holds


def chosen(rows: list[Row], runs: int) -> list[Row]:
    """The first FIRST_RUNS and an even spread of the rest, `runs` in all."""
    if len(rows) <= runs:
        return list(rows)
    top = rows[:min(FIRST_RUNS, runs)]
    rest = rows[len(top):]
    spread = runs - len(top)
    picks = [rest[round(i * (len(rest) - 1) / max(1, spread - 1))] for i in range(spread)] if spread else []
    return top + [row for i, row in enumerate(picks) if row not in picks[:i]]


def on_gpu(cluster: Cluster) -> bool:
    """A catalogue cluster is checked on this host's GPUs (dt train --device cuda, NCCL); this
    machine's own cluster on its CPU (gloo)."""
    return cluster.flops > 0


def train_argv(layout: Layout, model: ModelShape, batch: int, seq: int, steps: int,
               precision: str | None = None) -> list[str]:
    """dt train's options for this layout (and its threads: the rest are its defaults).

    precision: a catalogue precision (bf16, ...): the run goes on this host's GPUs with that
    autocast; None: on the CPU, as dt train runs by default here."""
    # On the CPU the threads the planner timed a rank with (dt.plan.compute.rank_threads), not
    # dt train's own rule (dt.train.threads): the check measures what was priced.
    device = ["--device", "cuda", "--precision", TRAIN_PRECISION[precision]] if precision else [
        "--device", "cpu", "--threads", str(rank_threads(layout.world))]
    argv = ["--dp", str(layout.dp), "--tp", str(layout.tp), "--pp", str(layout.pp), "--cp", str(layout.cp),
            "--ep", str(layout.ep), "--zero", str(layout.zero), "--schedule", layout.schedule,
            "--virtual", str(layout.virtual), "--micro-batches", str(layout.micro_batches),
            "--cp-attention", layout.cp_attention, "--batch-size", str(batch), "--block-size", str(seq),
            "--n-layer", str(model.n_layer), "--n-head", str(model.n_head), "--n-embd", str(model.n_embd),
            "--experts", str(model.experts), "--top-k", str(model.top_k), "--steps", str(steps),
            "--no-progress", *device, "--model", model.family,
            "--layout", "tp-across" if layout.tp_across else "tp-inside"]  # where the planner put tp
    if layout.clip:
        argv += ["--clip", str(CLIP)]
    recompute = recompute_kind(layout.recompute)  # a bool (True: full) or the kind's name
    if recompute != "none":
        argv += ["--recompute", recompute]
    if layout.sequence_parallel:
        argv.append("--sequence-parallel")
    if model.n_kv_head:
        argv += ["--n-kv-head", str(model.n_kv_head)]
    return argv + (["--untied"] if not model.tied else [])


def measure_worker(args: Any, steps: int, memory: bool, shapes: list[Any] | None = None) -> dict[str, Any]:
    """On each rank: per-step seconds and spans (timing run), or the peak live bytes (memory run);
    after the timing run's steps, the planner's own stage module timed in this process at this
    rank's stage's shape (`shapes[stage]`, dt.plan.compute.timed_shape; None: not timed here).

    The run is dt train's own: dt.train.build's model, optimizer and step (TrainStep, experts
    included), called as dt.train.loop calls it, on the same data.
    """
    import torch

    from dt import transport
    from dt.device import backend_for, local_device
    from dt.device_memory import LiveBytes
    from dt.plan.trace import TimelineRecorder
    from dt.train.dataset import open_data
    from dt.train.loop import make_model

    torch.manual_seed(args.seed)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    transport.set_validation(args.validate)  # as dt train's worker does
    data = open_data(args)
    device = local_device(backend_for(args.device))
    # on a GPU the caching allocator's peak (max_memory_allocated), on the CPU dt's own count
    live = LiveBytes(device) if memory else None
    recorder = TimelineRecorder()
    try:
        if live is not None:
            live.__enter__()
        run = make_model(args, data.vocab_size)
        cpu = _run_steps(run, data, args, steps, device, recorder)
    finally:
        if live is not None:
            live.__exit__(None, None, None)
        torch.set_num_threads(threads)
    _, _, stage, _, _ = run.coords  # (dp, tp, pp, cp, ep)
    out: dict[str, Any] = {"rank": run.rank, "stage": stage, "steps": recorder.step_seconds(),
                           "cpu": cpu, "spans": recorder.spans}
    shape = shapes[stage] if shapes else None
    if shape is not None and not memory:
        from dt.plan.timed import time_stage

        out["stage_s"] = statistics.median(time_stage(*shape))
    if live is not None:
        out.update(_peak(live, device, run))
    return out


def _run_steps(run: Any, data: Any, args: Any, steps: int, device: Any, recorder: Any) -> list[float]:
    """`steps` of dt train's step as dt.train.loop calls it on this rank's share of the batch, each
    recorded; every step's CPU seconds."""
    from dt.device import synchronize

    _mark_optimizer(run.optimizer, recorder)
    per_rank = args.batch_size // args.dp
    dp_rank, *_ = run.coords
    mine = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    cpu = []
    with recorder.hooked():
        for step in range(steps):
            inputs, targets = data.batch(step, args.batch_size, args.block_size)
            recorder.begin(step)
            c0 = time.process_time()
            run.step(inputs[mine], targets[mine])  # forward, backward, sync, clip, optimizer: the whole step
            synchronize(device)  # a GPU step ends when its kernels do, not when they are queued
            cpu.append(time.process_time() - c0)
            recorder.end()
    return cpu


def _peak(live: Any, device: Any, run: Any) -> dict[str, int]:
    """The memory run's peak bytes per rank (and, on the CPU, the shared buffers' part of it)."""
    if device.type == "cuda":
        return {"peak_bytes": live.peak}  # the allocator saw every thread's and buffer's bytes
    # the collectives' scratch other threads keep (dt's gradient thread: ZeRO 2's
    # reduce-scatters), made outside LiveBytes' thread-local sight, held from the first step on
    from dt.collectives.scratch import held_bytes

    shared = shared_bytes(run.parameters)
    return {"peak_bytes": live.peak + shared + held_bytes(other_threads_only=True), "shared_bytes": shared}


def shared_bytes(params: list[Any]) -> int:
    """Bytes of the shared-memory buffers the parameters and gradients live in (dt.shm_empty:
    DDP's buckets, ZeRO's flat parameters and gradients). torch.frombuffer makes them outside any
    op, so LiveBytes' dispatch counter never sees them; they are made when the model is built and
    held to the end, so they add to the peak whole. Such a storage is this rank's part exactly
    (dt.transport.shm.alloc) and, unlike torch's own, not resizable."""
    seen: dict[int, int] = {}
    for param in params:
        for tensor in (param, param.grad):
            if tensor is not None and not tensor.untyped_storage().resizable():
                seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def _mark_optimizer(optimizer: Any, recorder: Any) -> None:
    """The step calls the optimizer inside it: mark where its span starts (ZeRO's collectives in it)."""
    inner = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        recorder.mark("optimizer")
        return inner(*args, **kwargs)

    optimizer.step = step


def launcher(cluster: Cluster, link_bits: float | None = None) -> Launch:
    """Where a run goes: fresh local processes on one host (on its GPUs, over NCCL, for a catalogue
    cluster); across hosts, a fresh simulated cluster of the planned shape (each run its own: the
    memory run must not inherit the timing run's scratch), its links capped at link_bits per
    second (None: uncapped)."""
    if cluster.hosts == 1:
        from dt.launcher import launch

        return functools.partial(launch, backend="nccl" if on_gpu(cluster) else "gloo")
    from dt.launcher.cluster.launch import cluster_launch

    def on_cluster(worker: Callable[..., Any], world: int, *args: Any) -> list[Any]:
        if world != cluster.world:
            raise ValueError(f"a layout of {world} ranks on a cluster of {cluster.world}")
        return cluster_launch(worker, cluster.hosts, cluster.per_host, *args, link_bits=link_bits)

    return on_cluster


def _run(row: Row, model: ModelShape, batch: int, seq: int, steps: int, cluster: Cluster,
         launch: Launch) -> dict[str, Any]:
    from dt.train.cli import parse_args

    gpu = on_gpu(cluster)
    args = parse_args(train_argv(row.layout, model, batch, seq, steps, cluster.precision if gpu else None))
    shapes = stage_shapes(cluster, model, row.layout, batch, seq)
    timed = launch(measure_worker, row.layout.world, args, steps, False, shapes)
    mem = launch(measure_worker, row.layout.world, args, 2, True)
    per_step = [max(r["steps"][i] for r in timed) for i in range(1, steps)]  # the slowest rank's
    cpu = [max(r["cpu"][i] for r in timed) for i in range(1, steps)]  # the busiest rank's CPU
    out = {"step_s": statistics.median(per_step), "steps_s": per_step, "cpu_s": statistics.median(cpu),
           "peak_bytes_per_rank": max(r["peak_bytes"] for r in mem), "ranks": timed}
    if all(shape is not None for shape in shapes):
        from dt.plan.timed import stage_seconds

        # the run's slowest rank's stage against the planner's timing of the same module
        out["stage_ratio"] = max(r["stage_s"] / stage_seconds(*shapes[r["stage"]]) for r in timed)
    return out


def stage_shapes(cluster: Cluster, model: ModelShape, layout: Layout, batch: int,
                 seq: int) -> list[TimedShape | None]:
    """Per pipeline stage, the shape its compute was timed at (dt.plan.compute.timed_shape)."""
    from dt.plan.compute import timed_shape
    from dt.plan.stage import stage_tensors

    shapes = []
    for stage in range(layout.pp):
        tensors = stage_tensors(model, layout, seq, stage)
        shapes.append(timed_shape(cluster, model, sequences=batch // layout.dp // layout.micro_batches,
                                  tokens=seq // layout.cp, keys=seq, tp=layout.tp, world=layout.world,
                                  blocks=tensors.blocks, head=tensors.head, embed=tensors.embed,
                                  cp_kind=layout.cp_attention))
    return shapes


def check(rows: list[Row], runs: int, steps: int, trace: str | None, batch: int, seq: int,
          model: ModelShape, cluster: Cluster, link_bits: float | None = None
          ) -> tuple[dict[str, dict[str, Any]], str]:
    """Measure the chosen layouts; (measured figures by layout name, the comparison table).
    link_bits: across hosts, each simulated host's link rate (bits/s; None: uncapped)."""
    from dt.plan.trace import write_trace

    if steps < 2:
        raise ValueError("--check needs --steps >= 2: the first is warm-up")
    picked = chosen(rows, runs)
    launch = launcher(cluster, link_bits)
    measured: dict[str, dict[str, Any]] = {}
    for row in picked:
        measured[row.layout.name()] = _run(row, model, batch, seq, steps, cluster, launch)
    if trace and picked:
        from dt.plan.step_model import predict

        first = picked[0]
        prediction = predict(cluster, model, first.layout, batch, seq, timelines=True)
        write_trace(trace, measured[first.layout.name()]["ranks"], prediction)
    text = comparison(picked, measured) + (f"\ntrace: {trace} (Perfetto, chrome://tracing)" if trace else "")
    if on_gpu(cluster):
        import torch

        text = (f"measured on {torch.cuda.get_device_name(0)} (torch {torch.__version__}), dt train --device "
                f"cuda --precision {TRAIN_PRECISION[cluster.precision]}; predicted on {cluster.source}; "
                "peak: torch.cuda.max_memory_allocated\n" + text)
    return {k: {kk: vv for kk, vv in v.items() if kk != "ranks"} for k, v in measured.items()}, text


def _ratio(ratio: float | None) -> str:
    return f"{ratio:12.2f}x" if ratio else f"{'-':>13}"


def busy_seconds(prediction: Any) -> float:
    """The predicted step less its idle (bubble): what a rank's core is busy with, on this
    machine's one core per rank the CPU time its process spends (threads and spin-waits included).
    With more ranks than cores it is not scaled down: a rank taking turns on a core spends CPU on
    the turns themselves (caches refilled, every wait a sleep and a wake), so its CPU time comes to
    its busy wall (the busy ms beside cpu ms of the records --check writes)."""
    return prediction.step - prediction.parts.get("bubble", 0.0)


def comparison(picked: list[Row], measured: dict[str, dict[str, Any]]) -> str:
    """Predicted beside measured for each run, both rankings, and the errors' summary."""
    by_meas = sorted(picked, key=lambda row: measured[row.layout.name()]["step_s"])
    meas_rank = {r.layout.name(): i + 1 for i, r in enumerate(by_meas)}
    lines = [f"{'layout':<42} {'pred ms':>9} {'meas ms':>9} {'err':>7} {'busy ms':>8} {'cpu ms':>8} "
             f"{'err':>7} {'pred peak':>10} {'meas peak':>10} {'err':>7}  rank pred/meas  stage run/plan"]
    t_err, c_err, m_err, ratios = [], [], [], []
    for i, row in enumerate(picked, 1):
        run = measured[row.layout.name()]
        step_error = (row.prediction.step - run["step_s"]) / run["step_s"]
        busy = busy_seconds(row.prediction)
        cpu_error = (busy - run["cpu_s"]) / run["cpu_s"] if run.get("cpu_s") else 0.0
        predicted_peak = max(counted(stage, "allocated") for stage in row.memory)  # what the run measures
        peak_error = (predicted_peak - run["peak_bytes_per_rank"]) / run["peak_bytes_per_rank"]
        t_err.append(abs(step_error))
        c_err.append(abs(cpu_error))
        m_err.append(abs(peak_error))
        lines.append(f"{row.layout.name():<42} {row.prediction.step * 1e3:9.2f} {run['step_s'] * 1e3:9.2f} "
                     f"{100 * step_error:+6.1f}% {busy * 1e3:8.2f} {run.get('cpu_s', 0.0) * 1e3:8.2f} "
                     f"{100 * cpu_error:+6.1f}% "
                     f"{predicted_peak / 1e6:9.2f}M {run['peak_bytes_per_rank'] / 1e6:9.2f}M "
                     f"{100 * peak_error:+6.1f}%  {i}/{meas_rank[row.layout.name()]:<13}"
                     f"{_ratio(run.get('stage_ratio'))}")
        if run.get("stage_ratio"):
            ratios.append(run["stage_ratio"])
    fastest = measured[by_meas[0].layout.name()]["step_s"]
    first = measured[picked[0].layout.name()]["step_s"]
    lines.append(f"step: median |pred - meas| / meas {100 * statistics.median(t_err):.1f}%, worst "
                 f"{100 * max(t_err):.1f}%; busy vs CPU: median {100 * statistics.median(c_err):.1f}%, worst "
                 f"{100 * max(c_err):.1f}%; memory: median {100 * statistics.median(m_err):.1f}%, worst "
                 f"{100 * max(m_err):.1f}%")
    if ratios:
        lines.append(f"stage run/plan: the planner's own stage module timed again in the run's processes "
                     f"after its steps (the slowest rank) over its time in the planner: median "
                     f"{statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x (this "
                     "machine's per-process speed, part of every step error above)")
    if len(picked) > 1:  # one layout (--explain): no order to compare
        behind = 100 * (first / fastest - 1)
        lines.append(f"first ranked {picked[0].layout.name()}: measured {first * 1e3:.2f} ms, the measured "
                     f"fastest {by_meas[0].layout.name()} {fastest * 1e3:.2f} ms ({behind:+.1f}%)")
    return "\n".join(lines)
