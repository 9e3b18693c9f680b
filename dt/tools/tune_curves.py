"""The figures `dt tune` fits, and the rules that decide whether they may be saved.

Shared by the whole-group figures (dt/tools/tune.py) and the per-level pairs
(dt/tools/tune_levels.py):

- a curve (bytes -> seconds) is a median time per size, held to one noise
  rule: time grows with size (`unsteady`);
- a latency (alpha, sync, the ping-pong) is timed as bursts of back-to-back
  calls (`latencies`): the barrier that lines the ranks up lets them go a
  message apart, and a single timed call charges that skew to the figure (a
  one-shot barrier once measured 878 us where a whole one-shot all-reduce took
  170 us). Noise only ever adds to a latency, so of `repeats` medians the
  figure is the smallest; its spread is the middle repeat over it, and its
  range the slowest over it (`latency_of` says why the middle one);
- `inconsistent` holds the figures to what they must satisfy: one step no
  slower than a whole 4-byte all-reduce, one sync no slower than a whole
  one-shot all-reduce, a spread that says the figure repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dt.bench.harness import barrier, rotated

__all__ = ["BURST", "EXCHANGE_SIZES", "MAX_SPREAD", "REPEATS", "TOLERANCE", "Latency", "between_runs",
           "drifted", "inconsistent", "latencies", "latency_of", "median_time", "steady_curve", "unsteady"]

EXCHANGE_SIZES = (4, 1 << 18, 1 << 20, 4 << 20, 16 << 20)
BURST = 10  # back-to-back calls per timed burst: the line-up's skew counts once, not per call
REPEATS = 5  # medians per latency figure: the fastest is its figure, the middle one its spread
MAX_SPREAD = 2.0  # a latency whose middle repeat took more than twice its fastest does not repeat
TOLERANCE = 0.25  # what noise may move a point (a curve's step down, a step above its whole call)


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


@dataclass(frozen=True)
class Latency:
    """A latency figure: the fastest of its repeats' medians, the middle one over it (spread),
    and every repeat's median."""

    seconds: float
    spread: float
    repeats: tuple[float, ...]

    @property
    def range(self) -> float:
        """The slowest repeat over the fastest: what the worst passing load did (reported, not judged)."""
        return max(self.repeats) / self.seconds if self.seconds > 0 else 1.0


def latency_of(bursts: Sequence[Sequence[float]]) -> Latency:
    """The estimator: `bursts[r]` holds repeat r's per-call seconds, one per burst.

    Per repeat the median burst; the figure is the fastest repeat, its spread the middle
    repeat (the median of the repeats) over it. On a shared machine the times have heavy
    tails: a burst that met another process's time slice, a whole repeat or two under a
    passing load. The medians drop the slow bursts, the fastest repeat drops the slow
    repeats, and while fewer than half the repeats are slowed the middle one is an
    unslowed one, so the spread stays near 1 (the slowest over the fastest, the range,
    once refused the torch wire's alpha at 2.8x and 3.4x on a quiet machine: one slow
    repeat of three). A figure that does not repeat (most repeats far from the fastest,
    or spread all over) has a middle repeat far from its fastest, and is refused
    (`inconsistent`).
    """
    medians = tuple(statistics.median(b) for b in bursts)
    best = min(medians)
    return Latency(best, statistics.median(medians) / best if best > 0 else 1.0, medians)


def latencies(calls: dict[str, Any], reps: int, repeats: int = REPEATS,
              burst: int = BURST) -> dict[str, Latency]:
    """Seconds per call of each call: `repeats` times, `reps` bursts of `burst` back-to-back calls
    (the figure from them: latency_of).

    The calls take turns burst by burst (in a rotated order), so a figure and
    the whole call it is checked against (alpha and an all-reduce, sync and a
    one-shot all-reduce) see the same load: on a shared machine the load
    drifts between one second and the next.
    """
    names = list(calls)
    for name in names:  # warm-up: connections made, buffers touched
        calls[name]()
        calls[name]()
    bursts: dict[str, list[list[float]]] = {name: [] for name in names}
    for _ in range(repeats):
        per_call: dict[str, list[float]] = {name: [] for name in names}
        for i in range(max(1, reps)):
            for name in rotated(names, i):
                fn = calls[name]
                barrier()
                t0 = time.perf_counter()
                for _ in range(burst):
                    fn()
                per_call[name].append((time.perf_counter() - t0) / burst)
        for name in names:
            bursts[name].append(per_call[name])
    return {name: latency_of(b) for name, b in bursts.items()}


def unsteady(points: dict[int, float], tolerance: float = TOLERANCE) -> str | None:
    """Why a (bytes -> seconds) curve is too noisy to fit, or None: time must grow with size."""
    xs = sorted(points)
    for a, b in zip(xs, xs[1:]):
        if points[b] < (1 - tolerance) * points[a]:
            return (f"{b:,} B took {points[b] * 1e6:.0f} us, less than {a:,} B's "
                    f"{points[a] * 1e6:.0f} us")
    return None


def inconsistent(fig: dict[str, Any], tolerance: float = TOLERANCE,
                 max_spread: float = MAX_SPREAD) -> list[str]:
    """Why a group's figures (as `dt tune` combines them) may not be saved; [] when they may.

    fig["whole"] holds whole 4-byte collectives timed as the latencies are:
    "step" (the all-reduce with the fewest steps on this wire, fig["whole"]
    ["steps"] of them) and, on shared memory, "one_shot" (one sync, then
    4-byte reads). One exchange step cannot take longer than that whole
    all-reduce, nor one synchronisation longer than a one-shot all-reduce.
    fig["spread"] has each latency's middle-repeat / fastest-repeat ratio (latency_of).
    """
    why = []
    whole = fig.get("whole", {})
    bound = 1 + tolerance
    if "step" in whole and fig["alpha"] > bound * whole["step"]:
        why.append(f"alpha {fig['alpha'] * 1e6:.0f} us exceeds a whole 4-byte all-reduce of "
                   f"{whole['steps']} step(s) ({whole['step'] * 1e6:.0f} us, {whole['algorithm']})")
    if "sync" in fig and "one_shot" in whole and fig["sync"] > bound * whole["one_shot"]:
        why.append(f"sync {fig['sync'] * 1e6:.0f} us exceeds a whole 4-byte one-shot all-reduce "
                   f"({whole['one_shot'] * 1e6:.0f} us), which synchronises once")
    for name, spread in sorted(fig.get("spread", {}).items()):
        if spread > max_spread:
            why.append(f"{name} does not repeat: its middle repeat took {spread:.1f}x its fastest "
                       f"(at most {max_spread:g}x)")
    return why


def drifted(fig: dict[str, Any], saved: dict[str, Any] | None, max_spread: float = MAX_SPREAD) -> list[str]:
    """How the latencies moved since the figures saved under the same key (warnings, not refusals).

    A loaded machine can hold one level for a whole run and another a minute
    later (the torch wire's alpha once went 3670 / 203 / 289 us over three
    runs): each run is steady on its own, so only the runs side by side show
    it. Which one is right the figures cannot say; the person can (--show).
    """
    if not saved:
        return []
    why = []
    for name in ("alpha", "sync"):
        new, old = fig.get(name), saved.get(name)
        if not new or not isinstance(old, (int, float)) or old <= 0:
            continue
        ratio = max(new / old, old / new)
        if ratio > max_spread:
            load = saved.get("load")
            when = f"{saved.get('measured_at', '?')}" + (f", load {load:.1f}" if load is not None else "")
            why.append(f"{name} {new * 1e6:.0f} us differs {ratio:.1f}x from the {old * 1e6:.0f} us saved "
                       f"({when}): the machine's load moved between the runs")
    return why


def between_runs(fig: dict[str, Any], saved: dict[str, Any] | None) -> str | None:
    """The latencies of this run over those saved under the same key, in one line (None: none saved):
    the spread between runs, printed whether or not it is large (drifted warns when it is)."""
    if not saved:
        return None
    parts = [f"{name} {fig[name] / saved[name]:.2f}x" for name in ("alpha", "sync")
             if fig.get(name) and isinstance(saved.get(name), (int, float)) and saved[name] > 0]
    if not parts:
        return None
    return (f"between runs: {', '.join(parts)} the figures saved {saved.get('measured_at', '?')}"
            + (f" (load {saved['load']:.1f})" if isinstance(saved.get("load"), (int, float)) else ""))


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
