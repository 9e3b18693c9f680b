"""Where one rank's training step goes on a GPU: device time by kind of kernel, against the wall.

    python -m dt.bench.step_profile --device cuda --precision bfloat16 --n-layer 12 --n-head 12 \\
        --n-embd 768 --block-size 1024 --batch-size 16        # any dt train options, one rank

Builds dt train's own model and step (dt.train.loop.make_model, as `dt plan --check` runs it),
runs --warmup steps, then profiles --steps steps with torch.profiler and prints, per step:
the wall time, the time the device spent in kernels (the sum of every kernel's duration:
what a GPU step costs if nothing waited on the host), and that time split by kind of kernel
(matmuls, attention, elementwise and norms, the optimizer's, copies). A wall far above the
kernels' sum means the step is bound by the host launching them, not by the device: the part
a FLOP count cannot see. On the CPU the same table is the operators' CPU time.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch

from dt import args as args_

__all__ = ["kernel_kind", "main", "profile_worker"]

KINDS = (  # first match wins: a kernel's name -> what it does
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("matmul", ("gemm", "matmul", "cutlass", "xmma", "addmm", "cublas", "nvjet", "aten::mm", "mmbackward",
                "aten::linear")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("norm", ("layer_norm", "layernorm", "rms")),
    ("copy", ("memcpy", "memset", "copy", "cat", "to_copy")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "gelu", "softmax", "loss", "nll")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


def profile_worker(args: Any, warmup: int, steps: int) -> dict[str, Any]:
    """On each rank: per-step wall seconds and the profiled device (or CPU) time by kernel kind."""
    from torch.profiler import ProfilerActivity, profile

    from dt.device import backend_for, local_device, synchronize
    from dt.train.dataset import open_data
    from dt.train.loop import make_model

    torch.manual_seed(args.seed)
    data = open_data(args)
    device = local_device(backend_for(args.device))
    run = make_model(args, data.vocab_size)
    per_rank = args.batch_size // args.dp
    sl = slice(run.coords[0] * per_rank, (run.coords[0] + 1) * per_rank)

    def step(i: int) -> float:
        x, y = data.batch(i, args.batch_size, args.block_size)
        t0 = time.perf_counter()
        run.step(x[sl], y[sl])
        synchronize(device)
        return time.perf_counter() - t0

    for i in range(warmup):
        step(i)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        walls = [step(warmup + i) for i in range(steps)]
    kinds: dict[str, float] = {}
    top: dict[str, float] = {}
    for name, us in _timed_events(prof.events(), device.type == "cuda"):
        kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + us / 1e6 / steps
        top[name] = top.get(name, 0.0) + us / 1e6 / steps
    return {"wall": statistics.median(walls), "kinds": kinds,
            "top": sorted(top.items(), key=lambda kv: -kv[1])[:12], "device": str(device)}


def _timed_events(events: Any, gpu: bool) -> list[tuple[str, float]]:
    """(name, microseconds) of what the step spent: on a GPU every kernel's device time; on the
    CPU every top-level operator's CPU time (its children run inside it)."""
    if gpu:
        return [(e.name, e.device_time) for e in events if e.device_type.name == "CUDA"]
    return [(e.name, e.cpu_time) for e in events if e.cpu_parent is None]


def main(argv: list[str] | None = None) -> int:
    from dt.launcher import launch
    from dt.train.cli import parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    own = args_.Parser(prog="dt.bench.step_profile", add_help=False)
    own.add_argument("--warmup", type=args_.at_least(1), default=5)
    own.add_argument("--profile-steps", type=args_.at_least(1), default=5)
    mine, rest = own.parse_known_args(argv)
    args = parse_args(rest + ["--no-progress"])
    from dt.device import backend_for
    from dt.train.cli import world

    out = launch(profile_worker, world(args), args, mine.warmup, mine.profile_steps,
                 backend=backend_for(args.device))
    r = out[0]
    busy = sum(r["kinds"].values())
    print(f"rank 0 on {r['device']}: step {r['wall'] * 1e3:.2f} ms wall (median of {mine.profile_steps}), "
          f"{busy * 1e3:.2f} ms in kernels ({100 * busy / r['wall']:.0f}% of the wall)")
    for kind, s in sorted(r["kinds"].items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<12} {s * 1e3:8.2f} ms  {100 * s / max(busy, 1e-12):5.1f}%")
    print("the longest kernels per step:")
    for name, s in r["top"]:
        print(f"  {s * 1e3:8.3f} ms  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
