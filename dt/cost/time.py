"""What each collective costs in time: the alpha-beta-gamma model.

    time = steps * alpha + bytes_on_the_critical_path * beta + reduced_bytes * gamma

alpha is the cost of one sequential message step, beta of one byte through a
rank's link, gamma of one byte reduced. `formula` gives the three counts of
each algorithm in closed form (the textbook table: dt.cost.textbook); `estimate` multiplies
them out. dt.cost.traffic has the exact per-rank byte counts these
approximate; dt.cost.machine has this machine's alpha, beta, gamma.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.cost.overheads import NO_TERMS, Overheads, Terms, terms
from dt.cost.records import record_for

__all__ = ["Estimate", "estimate", "formula"]


@dataclass(frozen=True)
class Estimate:
    """Predicted time of one collective call, term by term (seconds, bytes)."""

    steps: int  # sequential messages on the critical path
    bytes: float  # bytes on the critical path (what one rank's link carries)
    reduced: float  # bytes reduced on the critical path
    latency: float  # steps * alpha
    bandwidth: float  # bytes * beta
    reduction: float  # reduced * gamma
    terms: Terms = NO_TERMS  # what the plain model leaves out (dt.cost.overheads), when priced

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth + self.reduction + self.terms.total


def formula(collective: str, algorithm: str, n: float, p: int,
            segment_bytes: int | None = None, stage_bytes: int | None = None) -> tuple[int, float, float]:
    """(steps, critical-path bytes, reduced bytes) for n bytes on p ranks.

    The algorithm's record (dt.cost.records, declared beside the algorithm) names its
    formula: the textbook forms of the point-to-point algorithms are in dt.cost.textbook;
    the load/store ones (one_shot, two_shot: dt.cost.loadstore) count synchronisations
    and bytes copied through shared memory instead. KeyError where the flat model has
    none (hierarchical is priced on two levels only: dt.cost.levels).
    """
    if p <= 1:
        return 0, 0.0, 0.0
    priced = record_for(collective, algorithm).formula
    if priced is None:
        raise KeyError(f"no cost formula for {collective} {algorithm}")
    return priced(n, p, segment_bytes, stage_bytes)


def estimate(collective: str, algorithm: str, nbytes: float, p: int, *, alpha: float,
             beta: float, gamma: float = 0.0, segment_bytes: int | None = None,
             stage_bytes: int | None = None, overheads: Overheads | None = None) -> Estimate:
    """time = steps * alpha + bytes * beta + reduced * gamma, for one call.

    Ring all-reduce of 1 GB on 8 ranks at 450 GB/s and 5 us per step:
    14 * 5 us + 2 * 7/8 * 1 GB / 450 GB/s = 0.07 ms + 3.89 ms = 3.96 ms.
    With `overheads` (what `dt tune` measured: dt.cost.overheads) the terms
    the three figures leave out are added; oversubscription is moved out of
    the latency term, not added to it.
    """
    steps, nb, red = formula(collective, algorithm, nbytes, p, segment_bytes, stage_bytes)
    extra = (terms(collective, algorithm, nbytes, p, steps, nb, red, beta, gamma, overheads)
             if overheads is not None else NO_TERMS)
    return Estimate(steps, nb, red, steps * alpha - extra.oversubscription, nb * beta, red * gamma, extra)


