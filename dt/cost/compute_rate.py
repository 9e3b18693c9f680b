"""This machine's measured matmul rate, as `dt tune` saved it: what a layer's FLOPs cost here.

    rate = matmul_rate(m=2048, k=256, n=1024, threads=1)     # FLOP/s, or None if never tuned
    seconds = flops / rate

`dt tune` (dt/tools/tune_compute.py) times a Linear layer's three products (forward
x W^T, the input gradient dy W, the weight gradient dy^T x: 6 m k n FLOPs) at a grid of
shapes, per thread count and dtype, and saves the FLOP/s with the other figures in the
tune cache (dt.cost.machine) under the key "compute:<device>" ("compute:cpu",
"compute:cuda"). A small GEMM is bound by its fixed costs, a big one by arithmetic,
so the rate depends on the shape: matmul_rate takes the measured shape nearest the one
asked for (by the logarithm of each dimension: a rate changes with ratios, not
differences), at the nearest measured thread count.

MFU's peak (dt/train/peak.py) is a rate per core times the cores a job computes on:

    peak = per-core float32 matmul rate x cores_used(threads per rank, ranks per host, cores, hosts)

tuned_core_rate is `dt tune`'s part of the per-core rate: its fastest one-thread
product. Only one thread's figure is a core's: a many-thread figure on a busy
machine measures the contention (one was saved at 0.6 GFLOP/s on 2 threads
beside 69.7 on 1).
"""

from __future__ import annotations

import math
from typing import Any

from dt.cost import machine

__all__ = ["BACKEND", "compute_entry", "cores_used", "matmul_rate", "nearest", "tuned_core_rate"]

BACKEND = "compute"  # the tune cache's entries of this kind are keyed compute:<device>


def compute_entry(device: str = "cpu") -> dict[str, Any] | None:
    """The saved matmul rates of `device` ("cpu" or "cuda"), or None."""
    entry = machine.entries().get(f"{BACKEND}:{device}")
    return entry if isinstance(entry, dict) and "rates" in entry else None


def nearest(rows: list[list[float]], m: int, k: int, n: int) -> list[float]:
    """The measured [m, k, n, flops_per_s] row whose shape is nearest (m, k, n) in log space."""
    def distance(row: list[float]) -> float:
        return sum(abs(math.log(a / b)) for a, b in zip(row[:3], (m, k, n)))
    return min(rows, key=distance)


def matmul_rate(m: int, k: int, n: int, threads: int = 1, dtype: str = "float32", device: str = "cpu",
                entry: dict[str, Any] | None = None) -> float | None:
    """FLOP/s of a Linear layer's products at shape [m, k] x [k, n] here, from the saved figures
    (or `entry`); None when `dt tune` has not measured that device and dtype."""
    entry = compute_entry(device) if entry is None else entry
    if entry is None or min(m, k, n) < 1:
        return None
    by_threads = entry["rates"]
    usable = [int(t) for t, per in by_threads.items() if per.get(dtype)]
    if not usable:
        return None
    t = min(usable, key=lambda c: (abs(math.log(c / max(threads, 1))), c))
    return nearest(by_threads[str(t)][dtype], m, k, n)[3]


def tuned_core_rate(entry: dict[str, Any] | None = None, cores: int | None = None) -> float | None:
    """The fastest float32 rate `dt tune` measured on ONE thread (its best shape), in FLOP/s; None
    when it has not run, or ran where the core count was not `cores` (another machine's figure)."""
    entry = compute_entry("cpu") if entry is None else entry
    if entry is None or (cores is not None and entry.get("cores") != cores):
        return None
    rows = entry["rates"].get("1", {}).get("float32") or []
    rates = [row[3] for row in rows if isinstance(row[3], (int, float)) and math.isfinite(row[3])]
    return max(rates) if rates and max(rates) > 0 else None


def cores_used(threads_per_rank: int, ranks_per_host: int, cores: int, hosts: int = 1) -> int:
    """The cores a job computes on: each host's ranks x their threads, at most the host's cores,
    times the hosts. (Ranks share a host's cores: 4 ranks of 2 threads on 2 cores use 2.)"""
    return min(max(1, threads_per_rank) * max(1, ranks_per_host), max(1, cores)) * max(1, hosts)
