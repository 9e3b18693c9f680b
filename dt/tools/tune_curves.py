"""The curves `dt tune` fits: a median time per size, held to one noise rule (time grows with size).

Shared by the whole-group figures (dt/tools/tune.py) and the per-level pairs
(dt/tools/tune_levels.py).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from dt.bench.harness import barrier

__all__ = ["EXCHANGE_SIZES", "median_time", "steady_curve", "unsteady"]

EXCHANGE_SIZES = (4, 1 << 18, 1 << 20, 4 << 20, 16 << 20)


def median_time(fn: Any, reps: int, warmup: int = 2) -> float:
    """Median seconds of fn() over reps calls, each started together (after a barrier)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def unsteady(points: dict[int, float], tolerance: float = 0.25) -> str | None:
    """Why a (bytes -> seconds) curve is too noisy to fit, or None: time must grow with size."""
    xs = sorted(points)
    for a, b in zip(xs, xs[1:]):
        if points[b] < (1 - tolerance) * points[a]:
            return (f"{b:,} B took {points[b] * 1e6:.0f} us, less than {a:,} B's "
                    f"{points[a] * 1e6:.0f} us")
    return None


def steady_curve(measure_once: Any, attempts: int) -> tuple[dict[int, float], str | None]:
    """Measure a curve until it is steady (every rank agrees: the worst rank's verdict)."""
    import torch

    import dt

    why = None
    for _ in range(attempts):
        points = measure_once()
        why = unsteady(points)
        bad = torch.tensor([1.0 if why else 0.0])
        dt.all_reduce(bad, op=dt.ReduceOp.MAX, algorithm="naive")
        if not bad.item():
            return points, None
        why = why or "another rank's curve was noisy"
    return points, why
