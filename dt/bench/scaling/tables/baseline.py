"""T1, the single-process step every data-parallel speedup divides (tables 3, 4 and 5).

A speedup is only as honest as its baseline. The study measures T1 several
times, in the same minutes as the rows it divides (dt/bench/scaling/workers.py:
rank 0 alone, before and after each world's steps), and takes the fastest, so
no speedup is flattered by a slow baseline; these notes say when it was not a
plain multi-thread step, or when a row still beat it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dt.bench.scaling.tables.base import Results

__all__ = ["dp_t1", "superlinear_note", "t1_notes"]


def dp_t1(st: Results, batch: int) -> float:
    """T1: the fastest single-process step this study measured at this global batch.

    Candidates: the world-1 run, and rank 0 alone before and after each world's
    data-parallel steps; each with all cores as threads, and once with one thread
    (on a loaded machine torch's threads can slow one process down). The fastest
    is the most conservative baseline: no speedup is flattered by a slow T1, and
    a load change between runs can only make a speedup look worse. Records in
    st.t1_single_thread the batches whose T1 is a one-thread step.
    """
    best, one_thread = math.nan, False
    for (w, b), m in st.dp.items():
        if b != batch:
            continue
        for key, single in (("compute", False), ("compute_1t", True), ("t1", False),
                            ("t1_1t", True)):
            if key == "compute" and w != 1 or key not in m:
                continue
            t = m[key]["step"].median
            if math.isnan(best) or t < best:
                best, one_thread = t, single
    if one_thread:
        st.t1_single_thread.add(batch)
    return best


def superlinear_note(effs: Sequence[float], cores: int) -> list[str]:
    """Efficiency above 100% is not a result on a machine this size: say what it is."""
    if not any(e > 1.05 for e in effs if not math.isnan(e)):
        return []
    return ["Efficiency above 100% is not a real gain here: the one-process baseline (T1) and the "
            "row were measured minutes apart, and the machine's load changed in between (other "
            f"work on the {cores} cores), or the baseline's threads ran worse than separate "
            "processes. Compare rows of the same world with each other, not with T1, and rerun on "
            "an idle machine."]


def t1_notes(st: Results, batches: Sequence[int]) -> list[str]:
    """Which batches' T1 is a one-thread step (the machine was loaded), if any."""
    slowed = sorted(st.t1_single_thread & set(batches))
    if not slowed:
        return []
    return [f"At global batch {', '.join(map(str, slowed))} the single process "
            f"ran faster on one thread than on {st.cores} (the machine was loaded by other work, "
            "and torch's threads contended for the cores): T1 is the one-thread step, so speedups "
            "are not flattered by a slowed baseline."]
