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
"""

from __future__ import annotations

import math
from typing import Any

from dt.cost import machine

__all__ = ["BACKEND", "compute_entry", "matmul_rate", "nearest"]

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
