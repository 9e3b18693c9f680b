"""The textbook cost of each point-to-point algorithm, in closed form.

Each function gives (steps, critical-path bytes, reduced bytes) for n bytes on
p > 1 ranks, and is the `formula=` of its algorithm's record (declared beside the
algorithm in dt/collectives/; dt.cost.time.formula looks it up). The reference
table, with the fold's extra two steps and about 2n bytes when p is not a power
of two (p' = 2^floor(lg p)):

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

Every function takes (n, p, segment_bytes, stage_bytes); only the ring
broadcast reads segment_bytes (the load/store formulas in dt.cost.loadstore
read stage_bytes).
"""

from __future__ import annotations

import math

from dt.cost.records import Counts
from dt.layout import ceil_log2


def _folded(p: int) -> tuple[int, int, int]:
    """(p', 1 if p folds onto p' else 0, lg p') for p' = 2^floor(lg p)."""
    p2 = 1 << (p.bit_length() - 1)
    return p2, 0 if p == p2 else 1, p2.bit_length() - 1


def _share(n: float, p: int) -> float:
    return (p - 1) / p * n


def ring_all_reduce(n: float, p: int, *_: int | None) -> Counts:
    return 2 * (p - 1), 2 * _share(n, p), _share(n, p)


def naive_all_reduce(n: float, p: int, *_: int | None) -> Counts:
    return 2, 2 * (p - 1) * n, (p - 1) * n


def recursive_doubling_all_reduce(n: float, p: int, *_: int | None) -> Counts:
    _, fold, lg2 = _folded(p)
    return lg2 + 2 * fold, n * (lg2 + 2 * fold), n * (lg2 + fold)


def rabenseifner_all_reduce(n: float, p: int, *_: int | None) -> Counts:
    p2, fold, lg2 = _folded(p)
    half = (p2 - 1) / p2 * n
    return 2 * lg2 + 2 * fold, 2 * half + 2 * fold * n, half + fold * n


def ring_reduce_scatter(n: float, p: int, *_: int | None) -> Counts:
    return p - 1, _share(n, p), _share(n, p)


def ring_all_gather(n: float, p: int, *_: int | None) -> Counts:
    return p - 1, _share(n, p), 0.0


def recursive_doubling_all_gather(n: float, p: int, *_: int | None) -> Counts:
    _, fold, lg2 = _folded(p)
    return lg2 + 2 * fold, _share(n, p) + fold * (n + n / p), 0.0


def bruck_all_gather(n: float, p: int, *_: int | None) -> Counts:
    return ceil_log2(p), _share(n, p), 0.0


def flat_broadcast(n: float, p: int, *_: int | None) -> Counts:
    return 1, (p - 1) * n, 0.0


def ring_broadcast(n: float, p: int, segment_bytes: int | None = None, *_: int | None) -> Counts:
    k = max(1, math.ceil(n / segment_bytes)) if segment_bytes else 1
    return p - 2 + k, (p - 2 + k) / k * n, 0.0


def binomial_broadcast(n: float, p: int, *_: int | None) -> Counts:
    return ceil_log2(p), ceil_log2(p) * n, 0.0


def scatter_allgather_broadcast(n: float, p: int, *_: int | None) -> Counts:
    return ceil_log2(p) + p - 1, 2 * _share(n, p), 0.0


def flat_reduce(n: float, p: int, *_: int | None) -> Counts:
    return 1, (p - 1) * n, (p - 1) * n


def binomial_reduce(n: float, p: int, *_: int | None) -> Counts:
    return ceil_log2(p), ceil_log2(p) * n, ceil_log2(p) * n


def pairwise_all_to_all(n: float, p: int, *_: int | None) -> Counts:
    return p - 1, _share(n, p), 0.0


def flat_gather(n: float, p: int, *_: int | None) -> Counts:
    """Gather or scatter through one root: (p-1)/p n on the root's link."""
    return 1, _share(n, p), 0.0


def dissemination_barrier(n: float, p: int, *_: int | None) -> Counts:
    return ceil_log2(p), 0.0, 0.0
