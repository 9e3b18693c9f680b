"""`dt tune`'s compute figures: this machine's sustained matmul rate at layer shapes, per thread count.

A planner prices a layer's FLOPs (dt.cost.flops) at the rate this machine sustains for
that layer's shape, not at a peak: a [256 x 64] x [64 x 256] product on a CPU is bound by
the call's fixed cost, a [2048 x 768] x [768 x 3072] one by arithmetic. So `dt tune` times
a Linear layer's three training products (forward x W^T, input gradient dy W, weight
gradient dy^T x: 6 m k n FLOPs) at a grid of (tokens m, in k, out n) shapes, for every
thread count from 1 to the cores (powers of two and the core count: a rank of a world of
w gets cores / w threads) and for float32 and bfloat16, and saves the FLOP/s in the tune
cache (dt.cost.compute_rate reads them). On a GPU (--device cuda) the grid is bigger and
threads do not matter.

Each point is the median of --reps timings after one warm-up; the grid stops growing for a
(threads, dtype) once a point takes over MAX_POINT_S, so a slow dtype (bfloat16 on a CPU
without matrix units) costs seconds, not minutes. --quick (and --no-sweep) time a small
grid: a second in all.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

from dt.cost import machine
from dt.cost.compute_rate import BACKEND

__all__ = ["after_tune", "measure_compute", "thread_counts"]

FULL_CPU = [(m, h, 4 * h) for m in (256, 2048) for h in (64, 256, 768)]
FULL_GPU = [(m, h, 4 * h) for m in (2048, 8192) for h in (1024, 4096, 8192)]
QUICK = [(256, 64, 256), (512, 128, 512)]
DTYPES = ("float32", "bfloat16")
MAX_POINT_S = 1.0


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to the cores, and the core count itself."""
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return counts + [cores]


def _linear_seconds(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, reps: int) -> float:
    """Median seconds of a Linear layer's forward and two backward products at [m, k] x [k, n]."""
    x = torch.randn(m, k, dtype=dtype, device=device)
    w = torch.randn(n, k, dtype=dtype, device=device)
    dy = torch.randn(m, n, dtype=dtype, device=device)

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        x @ w.t()
        dy @ w
        dy.t() @ x
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    once()  # warm-up: first-call allocation and kernel selection
    return statistics.median(once() for _ in range(reps))


def measure_compute(device: str = "cpu", quick: bool = False, reps: int = 3) -> dict[str, Any]:
    """{threads: {dtype: [[m, k, n, FLOP/s], ...]}} for this machine's `device`."""
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    shapes = QUICK if quick else FULL_GPU if dev.type == "cuda" else FULL_CPU
    cores = os.cpu_count() or 1
    counts = [1] if dev.type == "cuda" else thread_counts(cores)
    saved_threads = torch.get_num_threads()
    rates: dict[str, dict[str, list[list[float]]]] = {}
    try:
        for threads in counts:
            torch.set_num_threads(threads)
            per: dict[str, list[list[float]]] = {}
            for name in DTYPES:
                rows = per.setdefault(name, [])
                for m, k, n in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
                    seconds = _linear_seconds(m, k, n, getattr(torch, name), dev, reps)
                    rows.append([m, k, n, 6 * m * k * n / seconds])
                    if seconds > MAX_POINT_S:
                        break  # bigger shapes of this dtype would take longer still
            rates[str(threads)] = per
    finally:
        torch.set_num_threads(saved_threads)
    return {"backend": BACKEND, "world": dev.type, "device": dev.type, "rates": rates, "cores": cores,
            "torch": torch.__version__, "load": os.getloadavg()[0], "quick": quick,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _report(entry: dict[str, Any]) -> None:
    print(f"dt tune: matmul rate ({entry['device']}, a Linear layer's 3 products, 6 m k n FLOPs), "
          f"load average {entry['load']:.2f}")
    for threads, per in entry["rates"].items():
        for name, rows in per.items():
            best = max(rows, key=lambda r: r[3])
            print(f"  {threads} thread(s) {name}: " + ", ".join(
                f"{m}x{k}x{n} {rate / 1e9:.1f}" for m, k, n, rate in rows)
                + f" GFLOP/s (best {best[3] / 1e9:.1f})")


def after_tune(args: Any, status: int) -> int:
    """`dt tune`'s last step: measure the compute figures once per host, print, save; `status` kept.

    A run whose communication figures were refused (status 1) saves nothing, these included:
    one dt tune run leaves one consistent set of figures or none."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return status
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) \
        else "cpu"
    entry = measure_compute(device, quick=args.quick or args.no_sweep)
    _report(entry)
    if status:
        print("  NOT saved either: this run's other figures were refused")
    elif not args.no_save:
        print(f"  saved to {machine.save(entry)} (key {machine.key(entry)})")
    return status
