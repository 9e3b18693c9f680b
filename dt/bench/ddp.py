"""dt bench ddp: dt's DistributedDataParallel against torch's, and what overlap hides.

    dt bench ddp                     # world 2, reference model, table
    dt bench ddp --json out.json     # also write the figures

On the reference model (6 Linear(1024, 1024), GELU between: 6.3M parameters,
25.2 MB of fp32 gradients per step), every configuration runs in the same
worker processes, interleaved step by step (dt overlap on, dt overlap off,
torch DDP), so a change in the machine's load hits them alike. Two figures:

1. dt step time / torch DDP step time, same buckets (target: at most 1.0);
2. exposed communication per step, overlap on / overlap off (target: at most 0.5).

With torch's default buckets (25 MB cap, 1 MB first) this model packs into two
buckets, the last layer (4.2 MB) and the other five (21 MB); the big one can
only start when backward is done, so overlap can hide at most ~1/6 of the
bytes and figure 2 cannot reach 0.5 there. With one bucket per layer (4 MB
cap) only the first layer's 4 MB is left after backward. Both are measured
(`--buckets 25,4`), dt and torch always with the same cap.

dt's cross-rank argument validation is OFF while timing (torch.distributed
runs no such check). Times are the slowest rank's per step; median and
spread over the timed steps.

`measure_data_parallel(...)` is the reusable piece: one configuration, one dict
of seconds per step and its breakdown; `step_worker` is the step itself, which
the scaling study (dt/bench/scaling) times too.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dt import args as args_
from dt import transport
from dt.bench import report as R
from dt.bench.harness import barrier, group_wires
from dt.collectives import ALGORITHMS
from dt.device import DEVICES, backend_for, clock, gpu_free
from dt.launcher import LaunchedWorld, WorkerPool, open_world, resolve_world

__all__ = ["STEP_RECORD_BYTES", "main", "measure_data_parallel", "reference_model", "step_bytes",
           "step_worker"]

IMPLS = ("dt_on", "dt_off", "torch", "single")


def reference_model(hidden: int = 1024, layers: int = 6) -> nn.Sequential:
    """The original design's model: `layers` Linear(hidden, hidden), GELU between them."""
    mods: list[nn.Module] = []
    for i in range(layers):
        mods.append(nn.Linear(hidden, hidden))
        if i < layers - 1:
            mods.append(nn.GELU())
    return nn.Sequential(*mods)


STEP_RECORD_BYTES = 768  # one timed step's record in step_worker: a dict of up to nine floats


def step_bytes(hidden: int, layers: int, batch_per_rank: int, models: int) -> int:
    """Bytes one rank of `step_worker` certainly holds (float32): `models` reference models'
    weights and gradients, its batch's input and target, and one step's kept activations
    (each Linear's output and each GELU's)."""
    weights = layers * (hidden * hidden + hidden)
    activations = batch_per_rank * hidden * (2 + 2 * layers - 1)
    return 4 * (2 * models * weights + activations)


def step_worker(global_batch: int, hidden: int, layers: int, impls: Sequence[str], steps: int,
                 warmup: int, bucket_cap_mb: float, first_bucket_mb: float,
                 algorithm: str) -> dict[str, list[dict[str, float]]]:
    """Train steps of each impl, interleaved; this rank's timings per timed step.

    Runs on every rank of a process group (WorkerPool.run / run_workers): each
    rank trains the reference model on global_batch // p samples of its own.
    impls: "dt_on" / "dt_off" (dt DDP, overlap on / off), "torch" (torch DDP on
    the same gloo group, same bucket cap), "single" (the model alone: no
    communication at all). The impls take turns step by step (after a barrier),
    so a change in the machine's load hits them alike; `warmup` steps of each
    are not recorded.

    Returns {impl: [one dict per timed step]}, seconds: step, forward, backward,
    optimizer; for dt's DDP also its own timers (backward_compute, comm,
    exposed, hidden) and bytes_sent. `dt bench ddp` and the scaling study
    (dt/bench/scaling/workers.py) both time this same step.
    """
    from dt.parallel.data_parallel import DistributedDataParallel

    transport.set_validation(False)  # timing: no cross-rank argument check
    rank, p = dist.get_rank(), dist.get_world_size()
    device = transport.default_device(transport.resolve_group(None))  # the rank's GPU under NCCL
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(global_batch // p, hidden, generator=gen).to(device)
    y = torch.randn(global_batch // p, hidden, generator=gen).to(device)
    setups = {}
    for impl in impls:
        torch.manual_seed(0)
        net = reference_model(hidden, layers).to(device)
        if impl in ("dt_on", "dt_off"):
            model: nn.Module = DistributedDataParallel(
                net, bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb,
                algorithm=algorithm, overlap=impl == "dt_on")
        elif impl == "torch":
            model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_cap_mb)
        elif impl == "single":
            model = net
        else:
            raise ValueError(f"unknown impl {impl!r}; one of {IMPLS}")
        setups[impl] = (model, torch.optim.SGD(net.parameters(), lr=1e-6))
    loss_fn = nn.MSELoss()
    records: dict[str, list[dict[str, float]]] = {impl: [] for impl in impls}
    for it in range(warmup + steps):
        for impl in impls:
            model, opt = setups[impl]
            if p > 1:
                barrier()
            t0 = clock(device)  # on a GPU: once the stream's queued work is done
            loss = loss_fn(model(x), y)
            t1 = clock(device)
            loss.backward()
            t2 = clock(device)
            opt.step()
            opt.zero_grad(set_to_none=True)
            t3 = clock(device)
            if it < warmup:
                continue
            rec = {"step": t3 - t0, "forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2}
            if impl.startswith("dt"):
                s = model.stats
                rec.update(backward_compute=s.compute_s, comm=s.comm_s, exposed=s.exposed_s,
                           hidden=s.hidden_s, bytes_sent=float(s.bytes_sent))
            records[impl].append(rec)
    return records


def _summary(per_rank: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Per step the slowest rank's figure, then median / min / max over steps."""
    out: dict[str, Any] = {}
    for key in per_rank[0][0]:
        st = R.Stat.of(R.per_rep_max([[rec[key] for rec in recs] for recs in per_rank]))
        out[key] = st
    return out


def _as_result(impl: str, world: int, global_batch: int, hidden: int, layers: int,
               stats: dict[str, Any], bucket_cap_mb: float) -> dict[str, Any]:
    step = stats["step"]

    def med(key: str) -> float | None:
        return stats[key].median if key in stats else None

    return {
        "impl": impl, "world_size": world, "global_batch": global_batch, "hidden": hidden,
        "layers": layers, "bucket_cap_mb": bucket_cap_mb, "steps": step.n,
        "params": sum(p.numel() for p in reference_model(hidden, layers).parameters()),
        "step_s": step.median, "step_s_min": step.lo, "step_s_max": step.hi,
        "step_spread": step.spread,
        "forward_s": med("forward"), "backward_s": med("backward"),
        "backward_compute_s": med("backward_compute"), "optimizer_s": med("optimizer"),
        "comm_s": med("comm"), "exposed_comm_s": med("exposed"), "hidden_comm_s": med("hidden"),
        "bytes_sent_per_step": med("bytes_sent"), "validation": False,
    }


def measure_data_parallel(world_size: int, global_batch: int, impl: str = "dt",
                          overlap: bool = True, steps: int = 10, warmup: int = 3,
                          hidden: int = 1024, layers: int = 6, bucket_cap_mb: float = 25,
                          first_bucket_mb: float = 1, algorithm: str = "auto",
                          pool: WorkerPool | None = None) -> dict[str, Any]:
    """Seconds per data-parallel step of the reference model, and where they go.

    impl: "dt" (dt DDP, `overlap` on or off), "torch" (torch DDP, gloo), or
    "single" (one process, the whole global batch, no wrapper; world_size must be 1).
    Each rank computes on global_batch // world_size samples. `pool`: a WorkerPool
    of world_size processes to reuse (else one is started and closed here).

    Returns: step_s (median over steps of the slowest rank), step_s_min/max,
    step_spread ((max-min)/median), forward_s, backward_s (wall), and for dt:
    backward_compute_s, comm_s (time the collectives ran), exposed_comm_s (time
    backward waited for them after its compute), hidden_comm_s, bytes_sent_per_step.
    Validation is off while timing.
    """
    if impl == "single" and world_size != 1:
        raise ValueError("impl='single' is one process: pass world_size=1")
    name = {"dt": "dt_on" if overlap else "dt_off", "torch": "torch", "single": "single"}[impl]
    args = (global_batch, hidden, layers, [name], steps, warmup, bucket_cap_mb, first_bucket_mb,
            algorithm)
    if pool is not None:
        per_rank = pool.run(step_worker, *args, timeout=1800)
    else:
        with open_world(world_size) as own:
            per_rank = own.run(step_worker, *args, timeout=1800)
    stats = _summary([r[name] for r in per_rank])
    result = _as_result(impl, world_size, global_batch, hidden, layers, stats, bucket_cap_mb)
    result["overlap"] = overlap if impl == "dt" else None
    return result


def _paired(per_rank: list[dict[str, list[dict[str, float]]]], a: str, b: str,
            key: str) -> R.Stat:
    """Median (and spread) over steps of a's figure / b's, each the slowest rank's.

    Impls run interleaved, so step i of a and of b saw the same machine load:
    the ratio per step cancels most of a loaded machine's drift."""
    xa = R.per_rep_max([[rec[key] for rec in r[a]] for r in per_rank])
    xb = R.per_rep_max([[rec[key] for rec in r[b]] for r in per_rank])
    return R.Stat.of([u / v for u, v in zip(xa, xb) if v > 0])


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None, pool: WorkerPool | LaunchedWorld | None = None) -> int:
    """`dt bench ddp`; `pool`: reuse a WorkerPool of --world processes (tests do)."""
    ap = args_.Parser(prog="dt bench ddp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=args_.world, default=None,
                    help="ranks (default 2; under torchrun: the launched ones)")
    ap.add_argument("--device", choices=DEVICES, default="auto",
                    help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    ap.add_argument("--batch", type=args_.at_least(1), default=1024, help="global batch (default 1024)")
    ap.add_argument("--steps", type=args_.at_least(1), default=20)
    ap.add_argument("--warmup", type=args_.at_least(0), default=3)
    ap.add_argument("--hidden", type=args_.at_least(1), default=1024)
    ap.add_argument("--layers", type=args_.at_least(1), default=6)
    ap.add_argument("--buckets", type=args_.listed(args_.positive), default="25,4",
                    help="bucket caps in MB to compare, comma-separated (default 25,4: torch's "
                         "default, and one bucket per 4 MB layer)")
    ap.add_argument("--algorithm", default="auto")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    a = ap.parse_args(argv)
    a.world = resolve_world(a.world, 2)
    if a.batch < a.world:
        ap.error(f"--batch {a.batch} gives some of the {a.world} ranks no sample")
    impls = ["dt_on", "dt_off", "torch"]
    ap.check_memory(f"--hidden {a.hidden:,} --layers {a.layers:,} --batch {a.batch:,}",
                    step_bytes(a.hidden, a.layers, -(-a.batch // a.world), len(impls)),
                    args_.ranks_on_this_host(a.world),
                    f"the weights and gradients of {len(impls)} models, and a step's activations",
                    gpu_free(a.device))
    records = a.world * len(impls) * a.steps * STEP_RECORD_BYTES
    ap.check_memory(f"--steps {a.steps:,}", records, 1, f"{a.world} ranks' step records, gathered")
    known = ALGORITHMS["all_reduce"]
    if a.algorithm != "auto" and a.algorithm not in known:
        ap.error(f"--algorithm {a.algorithm!r}: all_reduce has {sorted(known)} (and auto)")

    caps = list(a.buckets)
    backend = backend_for(a.device)
    m = R.machine(backend)
    print(f"dt bench ddp: world {a.world}, reference model {a.layers} x Linear({a.hidden}), "
          f"global batch {a.batch}, {a.steps} timed steps after {a.warmup} warm-up, "
          f"impls interleaved step by step")
    print(f"machine: {R.machine_line(m)}")
    print("dt validation: OFF while timing")
    note = R.oversubscription_note(a.world, m["cores"])
    if note:
        print(f"note: {note}")
    rows, results, figures = [], [], []
    with contextlib.nullcontext(pool) if pool is not None else open_world(a.world, backend) as pool:
        for cap in caps:
            per_rank = pool.run(step_worker, a.batch, a.hidden, a.layers, impls, a.steps,
                                a.warmup, cap, 1.0, a.algorithm, timeout=1800)
            by_impl = {}
            for impl in impls:
                stats = _summary([r[impl] for r in per_rank])
                res = _as_result(impl, a.world, a.batch, a.hidden, a.layers, stats, cap)
                res["overlap"] = {"dt_on": True, "dt_off": False}.get(impl)
                by_impl[impl] = res
                results.append(res)
                rows.append([f"{cap:g} MB", impl, R.fmt_stat_time(stats["step"]),
                             R.fmt_time(res["forward_s"]), R.fmt_time(res["backward_s"]),
                             R.fmt_time(res["backward_compute_s"]), R.fmt_time(res["comm_s"]),
                             R.fmt_time(res["exposed_comm_s"]), R.fmt_time(res["hidden_comm_s"]),
                             R.fmt_bytes(res["bytes_sent_per_step"])])
            figures.append({
                "bucket_cap_mb": cap,
                # paired: step i of each impl ran back to back, under the same load
                "dt_over_torch_step": _paired(per_rank, "dt_on", "torch", "step"),
                "dt_no_overlap_over_torch_step": _paired(per_rank, "dt_off", "torch", "step"),
                "exposed_on_over_off": _paired(per_rank, "dt_on", "dt_off", "exposed"),
                "ratio_of_medians": {
                    "dt_over_torch_step": by_impl["dt_on"]["step_s"] / by_impl["torch"]["step_s"],
                    "exposed_on_over_off": by_impl["dt_on"]["exposed_comm_s"]
                    / by_impl["dt_off"]["exposed_comm_s"]},
            })
        # named from the world group's connected wires (dt's DDP runs on it), not assumed
        wires = sorted(set().union(*pool.run(group_wires, timeout=60)))
    print(f"wires: dt DDP over {' + '.join(R.wire_label(w, backend) for w in wires)} (its group's "
          f"connected wires); torch DDP over torch.distributed ({backend}) itself")
    print()
    print(R.markdown_table(["buckets", "impl", "s/step (±half spread)", "forward", "backward",
                            "bwd compute", "comm", "exposed", "hidden", "sent/step"], rows,
                           align=["l", "l"] + ["r"] * 8))
    print()
    print("ratios: median over steps of the per-step ratio (impls interleaved), min..max")
    for f in figures:
        r1, r0, r2 = f["dt_over_torch_step"], f["dt_no_overlap_over_torch_step"], \
            f["exposed_on_over_off"]
        ok1 = "meets" if r1.median <= 1.0 else "MISSES"
        ok2 = "meets" if r2.median <= 0.5 else "MISSES"
        print(f"buckets {f['bucket_cap_mb']:g} MB: dt DDP / torch DDP step time {r1.median:.2f} "
              f"({r1.lo:.2f}..{r1.hi:.2f}; {ok1} target <= 1.0; overlap off: {r0.median:.2f}); "
              f"exposed comm overlap on / off {r2.median:.2f} ({r2.lo:.2f}..{r2.hi:.2f}; "
              f"{ok2} target <= 0.5)")
    if a.json:
        payload = {"machine": m, "dt_wires": wires, "args": vars(a), "validation": False, "results": results,
                   "figures": [{k: (v.as_dict() if isinstance(v, R.Stat) else v)
                                for k, v in f.items()} for f in figures]}
        Path(a.json).write_text(json.dumps(payload, indent=2, default=str))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    from dt.bench import ddp as _self  # workers must find the functions by module name

    sys.exit(_self.main(sys.argv[1:]))
