"""What each collective costs in time: the alpha-beta-gamma model.

    time = steps * alpha + bytes_on_the_critical_path * beta + reduced_bytes * gamma

alpha is the cost of one sequential message step, beta of one byte through a
rank's link, gamma of one byte reduced. `formula` gives the three counts of
each algorithm in closed form (the textbook table); `estimate` multiplies
them out. dt.cost.traffic has the exact per-rank byte counts these
approximate; dt.cost.machine has this machine's alpha, beta, gamma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dt.cost.loadstore import LOADSTORE, loadstore_formula
from dt.cost.overheads import NO_TERMS, Overheads, Terms, terms
from dt.cost.traffic import canonical, family
from dt.layout import ceil_log2

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

    Load/store algorithms (one_shot, two_shot: dt.cost.loadstore) count
    synchronisations and bytes copied through shared memory instead.

    The textbook forms (the reference table), with the fold's extra two steps
    and about 2n bytes when p is not a power of two (p' = 2^floor(lg p)):

        all_reduce ring                2(p-1)      2(p-1)/p n    (p-1)/p n
        all_reduce naive               2           2(p-1) n      (p-1) n
        all_reduce recursive_doubling  lg p'       n lg p'       n lg p'
        all_reduce rabenseifner        2 lg p'     2(p'-1)/p' n  (p'-1)/p' n
        reduce_scatter ring            p-1         (p-1)/p n     (p-1)/p n
        all_gather ring                p-1         (p-1)/p n
        all_gather recursive_doubling  lg p'       (p-1)/p n
        all_gather bruck               ceil(lg p)  (p-1)/p n
        broadcast flat                 1           (p-1) n
        broadcast ring (k segments)    p-2+k       (p-2+k)/k n
        broadcast binomial             ceil(lg p)  ceil(lg p) n
        broadcast scatter_allgather    lg p + p-1  2(p-1)/p n
        reduce flat                    1           (p-1) n       (p-1) n
        reduce binomial                ceil(lg p)  ceil(lg p) n  ceil(lg p) n
        all_to_all pairwise            p-1         (p-1)/p n
        gather / scatter flat          1           (p-1)/p n
        barrier dissemination          ceil(lg p)  0
    """
    if p <= 1:
        return 0, 0.0, 0.0
    p2 = 1 << (p.bit_length() - 1)
    fold = 0 if p == p2 else 1
    lg2 = p2.bit_length() - 1
    share = (p - 1) / p * n
    base = family(collective)
    key = (base, canonical(base, algorithm))
    if key in LOADSTORE:
        return loadstore_formula(base, key[1], n, p, stage_bytes)
    if key == ("all_reduce", "ring"):
        return 2 * (p - 1), 2 * share, share
    if key == ("all_reduce", "naive"):
        return 2, 2 * (p - 1) * n, (p - 1) * n
    if key == ("all_reduce", "recursive_doubling"):
        return lg2 + 2 * fold, n * (lg2 + 2 * fold), n * (lg2 + fold)
    if key == ("all_reduce", "rabenseifner"):
        half = (p2 - 1) / p2 * n
        return 2 * lg2 + 2 * fold, 2 * half + 2 * fold * n, half + fold * n
    if key == ("reduce_scatter", "ring"):
        return p - 1, share, share
    if key == ("all_gather", "ring"):
        return p - 1, share, 0.0
    if key == ("all_gather", "recursive_doubling"):
        return lg2 + 2 * fold, share + fold * (n + n / p), 0.0
    if key == ("all_gather", "bruck"):
        return ceil_log2(p), share, 0.0
    if key == ("broadcast", "flat"):
        return 1, (p - 1) * n, 0.0
    if key == ("broadcast", "ring"):
        k = max(1, math.ceil(n / segment_bytes)) if segment_bytes else 1
        return p - 2 + k, (p - 2 + k) / k * n, 0.0
    if key == ("broadcast", "binomial"):
        return ceil_log2(p), ceil_log2(p) * n, 0.0
    if key == ("broadcast", "scatter_allgather"):
        return ceil_log2(p) + p - 1, 2 * share, 0.0
    if key == ("reduce", "flat"):
        return 1, (p - 1) * n, (p - 1) * n
    if key == ("reduce", "binomial"):
        return ceil_log2(p), ceil_log2(p) * n, ceil_log2(p) * n
    if key == ("all_to_all", "pairwise"):
        return p - 1, share, 0.0
    if key in (("gather", "flat"), ("scatter", "flat")):
        return 1, share, 0.0
    if key == ("barrier", "dissemination"):
        return ceil_log2(p), 0.0, 0.0
    raise KeyError(f"no cost formula for {collective} {algorithm}")


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


