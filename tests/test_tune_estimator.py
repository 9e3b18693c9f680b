"""`dt tune`'s latency estimator (dt.tools.tune_curves.latency_of) on synthetic samples.

A shared machine's latencies have heavy tails: slow bursts, and whole repeats
slowed by a passing load. The estimator keeps the figure and its spread steady
under them, and still refuses a figure whose repeats do not agree; the spread
between runs is printed beside the saved figures.
"""

from __future__ import annotations

import io
import random

from dt.tools import tune_saved
from dt.tools.tune_curves import MAX_SPREAD, REPEATS, between_runs, inconsistent, latency_of

BASE = 200e-6  # seconds: the latency the samples are drawn around


def _repeat(rng: random.Random, level: float, bursts: int = 20) -> list[float]:
    """One repeat's per-call seconds per burst: a little jitter, and a heavy (Pareto) tail."""
    out = []
    for _ in range(bursts):
        t = level * (1 + abs(rng.gauss(0, 0.05)))
        if rng.random() < 0.15:  # a burst that met another process's time slice
            t *= 1 + rng.paretovariate(1.2)
        out.append(t)
    return out


def _figure(spread: float) -> dict:
    return {"alpha": BASE, "spread": {"alpha": spread}, "whole": {}}


def test_heavy_tails_and_slow_repeats_keep_the_figure_and_pass():
    refused_by_range = 0
    for seed in range(300):
        rng = random.Random(seed)
        slowed = rng.sample(range(REPEATS), k=rng.choice([0, 1, 2]))  # a passing load on up to 2 of 5
        bursts = [_repeat(rng, BASE * (rng.uniform(2.5, 4) if r in slowed else 1)) for r in range(REPEATS)]
        fig = latency_of(bursts)
        assert BASE <= fig.seconds <= 1.25 * BASE, (seed, fig)
        assert fig.spread <= MAX_SPREAD and inconsistent(_figure(fig.spread)) == [], (seed, fig)
        refused_by_range += fig.range > MAX_SPREAD
    assert refused_by_range > 100  # what the slowest-over-fastest rule would have refused


def test_a_figure_that_does_not_repeat_is_still_refused():
    rng = random.Random(1)
    for levels in ([1, 2.5, 3, 3.5, 4], [1, 1, 3, 3, 3], [1, 3, 3, 3, 3]):  # drifting, mostly slow
        fig = latency_of([_repeat(rng, BASE * level) for level in levels])
        why = inconsistent(_figure(fig.spread))
        assert fig.spread > MAX_SPREAD and len(why) == 1 and "alpha does not repeat: its middle repeat" \
            in why[0], (levels, fig)


def test_one_repeat_has_no_spread():
    fig = latency_of([[3e-4, 1e-4, 2e-4]])
    assert fig.seconds == 2e-4 and fig.spread == 1.0 == fig.range


def test_the_spreads_over_repeats_and_between_runs_are_printed():
    saved = {"alpha": 150e-6, "sync": 20e-6, "measured_at": "2026-01-01T00:00:00Z", "load": 0.4}
    line = between_runs({"alpha": 210e-6, "sync": 21e-6}, saved)
    assert line == "between runs: alpha 1.40x, sync 1.05x the figures saved 2026-01-01T00:00:00Z (load 0.4)"
    assert between_runs({"alpha": 210e-6}, None) is None
    fig = {"wire": "torch", "backend": "gloo", "world": 2, "cores": 2, "torch": "x", "load": 0.1,
           "pingpong_one_way": 1e-4, "alpha": 2e-4, "beta": 1e-9, "gamma": 1e-10, "exchange": {},
           "spread": {"alpha": 1.1}, "range": {"alpha": 2.8}}
    out = io.StringIO()
    tune_saved.report(fig, out)
    assert "spread 1.10x: the middle repeat, the slowest 2.80x" in out.getvalue(), out.getvalue()
