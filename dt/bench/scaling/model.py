"""The arithmetic the study's tables are made of: pure functions, tested directly.

- model_terms / predict / fit_alpha_beta: the alpha-beta-gamma model of an
  all-reduce (dt.cost's formula and per-rank traffic), and alpha and beta
  fitted to measured times (table 7);
- breakdown: one step's wall time split into parts that sum to 100% (table 5);
- simulate_bubble: the bubble of dt.parallel.pipeline's own schedules (table 6);
- scaling_row: speedup and efficiency (tables 3, 4);
- share_bound: the lower bound of a data-parallel step (table 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dt import cost

__all__ = ["BREAKDOWN_LABELS", "BREAKDOWN_PARTS", "MODELED_ALL_REDUCE", "breakdown", "fit_alpha_beta",
           "model_terms", "predict", "scaling_row", "schedules_offered", "share_bound", "simulate_bubble"]

SHARE_SOURCES = ("alone", "compute", "dt_off", "dt_on")  # where share_bound finds one rank's compute

MODELED_ALL_REDUCE = ("ring", "naive", "recursive_doubling", "rabenseifner", "one_shot", "two_shot")


def model_terms(algorithm: str, nbytes: int, p: int) -> dict[str, float]:
    """What the alpha-beta-gamma model charges an all-reduce of `nbytes` float32 on p ranks.

    steps (alpha), bytes on the critical path (beta) and bytes reduced on it
    (gamma), as dt.cost.formula counts them (its docstring has the table, with
    why: the ring's ranks send and receive at once, the naive root receives
    then sends, a folded rank of a non-power-of-two group adds n each way);
    and bytes_sent_max, the most any rank sends, from dt.cost's exact per-rank
    traffic (what dt.traffic() measures, byte for byte). "ring@shm": the same
    algorithm on another wire (same counts; the wire changes alpha and beta).
    The load/store algorithms (one_shot, two_shot) count synchronisations as
    steps and bytes copied as beta bytes (dt.cost.loadstore).
    """
    algorithm = algorithm.partition("@")[0]
    if algorithm not in MODELED_ALL_REDUCE:
        raise ValueError(f"no cost model for all-reduce algorithm {algorithm!r}")
    steps, beta_bytes, gamma_bytes = cost.formula("all_reduce", algorithm, nbytes, p)
    sent = max(cost.traffic_for("all_reduce", algorithm, nbytes // 4, 4, p, r).bytes_sent
               for r in range(p))
    return {"steps": steps, "beta_bytes": beta_bytes, "gamma_bytes": gamma_bytes,
            "bytes_sent_max": sent}


def predict(terms: dict[str, float], alpha: float, beta: float, gamma: float) -> float:
    """time = steps x alpha + critical-path bytes x beta + reduced bytes x gamma."""
    return terms["steps"] * alpha + terms["beta_bytes"] * beta + terms["gamma_bytes"] * gamma


def fit_alpha_beta(points: Sequence[tuple[dict[str, float], float]], gamma: float) -> tuple[float, float]:
    """Least squares in relative error: alpha, beta >= 0 with steps*a + bytes*b ~ t - gamma term.

    Relative error, so a 4 KB message (tens of microseconds) weighs as much as
    a 33 MB one (a second); non-negative, so a noisy point cannot make latency
    or bandwidth negative.
    """
    import numpy as np

    rows, rhs = [], []
    for terms, t in points:
        if t <= 0:
            continue
        rows.append([terms["steps"] / t, terms["beta_bytes"] / t])
        rhs.append(1.0 - terms["gamma_bytes"] * gamma / t)
    if not rows:
        return math.nan, math.nan
    a = np.array(rows, dtype=float)
    b = np.array(rhs, dtype=float)
    sol, *_ = np.linalg.lstsq(a, b, rcond=None)
    alpha, beta = float(sol[0]), float(sol[1])
    if alpha < 0 or beta < 0:  # the constrained optimum lies on an axis: refit one term
        alpha_only = max(0.0, float(np.dot(a[:, 0], b) / np.dot(a[:, 0], a[:, 0])))
        beta_only = max(0.0, float(np.dot(a[:, 1], b) / np.dot(a[:, 1], a[:, 1])))
        err_a = float(np.sum((a[:, 0] * alpha_only - b) ** 2))
        err_b = float(np.sum((a[:, 1] * beta_only - b) ** 2))
        alpha, beta = (alpha_only, 0.0) if err_a <= err_b else (0.0, beta_only)
    return alpha, beta


BREAKDOWN_PARTS = ("compute", "hidden_comm", "exposed_comm", "bubble", "rest")
BREAKDOWN_LABELS = {
    "compute": "compute",
    "hidden_comm": "hidden comm",
    "exposed_comm": "exposed comm",
    "bubble": "pipeline bubble",
    "rest": "rest (contention, idle)",
}


def breakdown(step: float, compute: float, exposed: float = 0.0, hidden: float = 0.0,
              bubble: float = 0.0) -> dict[str, float]:
    """Split one step's wall time into parts that sum to exactly 1.

    - compute: time computing with no communication under it;
    - hidden comm: time computing *while* communication ran underneath (the
      overlap that bought something; carved out of the compute time);
    - exposed comm: time the step waited for communication;
    - bubble: time a pipeline stage waited for its neighbours;
    - rest: what is left of the step (Python, the optimizer's bookkeeping,
      ranks slowed by others sharing their cores, idle).

    When noise makes the measured parts exceed the step, they are scaled down
    together and the rest is 0.
    """
    if step <= 0:
        raise ValueError(f"step time must be positive, got {step}")
    compute, exposed, hidden, bubble = (max(0.0, v) for v in (compute, exposed, hidden, bubble))
    hidden = min(hidden, compute)
    parts = {"compute": compute - hidden, "hidden_comm": hidden, "exposed_comm": exposed,
             "bubble": bubble}
    total = sum(parts.values())
    if total > step:
        parts = {k: v / total for k, v in parts.items()}
        parts["rest"] = 0.0
    else:
        parts = {k: v / step for k, v in parts.items()}
        parts["rest"] = 1.0 - sum(parts.values())
    return {k: parts[k] for k in BREAKDOWN_PARTS}


def schedules_offered(virtual: int) -> tuple[str, ...]:
    """GPipe and 1F1B, and the interleaved schedule where dt.parallel.pipeline offers it (virtual > 1)."""
    from dt.parallel import pipeline

    try:
        pipeline.schedule("interleaved", 2, 0, 2, 2)
    except (ValueError, TypeError):
        return ("gpipe", "1f1b")
    return ("gpipe", "1f1b", "interleaved") if virtual > 1 else ("gpipe", "1f1b")


def simulate_bubble(schedule_name: str, p: int, m: int, virtual: int = 1, forward: float = 1.0,
                    backward: float = 2.0) -> float:
    """The bubble a schedule leaves with free messages: dt.pipeline's own action order, played out.

    Each stage runs its actions (dt.pipeline.schedule) in order; a forward of
    micro-batch i on virtual stage q waits for q-1's forward of i, a backward for
    q+1's backward of i (the last virtual stage: its own forward). A chunk's
    forward costs forward/v, its backward backward/v. Returns the mean over
    stages of idle time / makespan: (p-1)/(m+p-1) for GPipe and 1F1B, and for
    interleaving (p-1)/(vm+p-1) when m is a multiple of p (more when not).
    """
    from dt.parallel.pipeline.timeline import play

    fwd, bwd = (forward / virtual,) * p, (backward / virtual,) * p
    played = play(schedule_name, p, m, virtual, fwd, bwd)
    busy = [sum(action.end - action.start for action in stage) for stage in played]
    span = max(stage[-1].end for stage in played if stage)
    return sum(1 - b / span for b in busy) / p


def scaling_row(t1: float, tn: float, world: int) -> dict[str, float]:
    """speedup T1/TN and efficiency speedup/N."""
    speedup = t1 / tn if tn > 0 else math.nan
    return {"speedup": speedup, "efficiency": speedup / world}


def share_bound(m: dict[str, Any]) -> float:
    """A data-parallel step's lower bound at one (world, batch): the fastest one rank's share of
    the batch was computed in this run (a Stat's `lo`: the fastest repetition).

    No data-parallel step takes less than its own share's compute. Its candidates: the share
    computed by rank 0 alone while the others wait ("alone": nothing in its way), the step
    with no communication ("compute": all ranks computing at once), and each dt DDP step less
    the wait it exposed ("busy", by dt's own timers). So by its arithmetic the bound is at
    most the fastest of each of these steps, whatever the machine's noise; torch's DDP has no
    timers to take its compute from, so only the physics holds its step above the bound.
    nan when none was measured.
    """
    lows = [m[k]["busy" if k.startswith("dt") else "step"].lo for k in SHARE_SOURCES
            if k in m and ("busy" in m[k] if k.startswith("dt") else True)]
    return min(lows) if lows else math.nan
