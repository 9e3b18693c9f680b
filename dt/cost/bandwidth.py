"""Bandwidth as nccl-tests reports it: algbw and busbw.

algbw = S / t. busbw = algbw * factor, the factor chosen so that busbw is
comparable with the link's speed whatever the collective and p: all-reduce
2(p-1)/p; all-gather, reduce-scatter, all-to-all, gather, scatter (p-1)/p
(S is the whole gathered buffer: the root's p-1 blocks cross its link);
broadcast, reduce, send/recv 1; a barrier moves no data (0).
"""

from __future__ import annotations

__all__ = ["BUSBW_FACTOR", "bus_bandwidth"]

BUSBW_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "barrier": lambda p: 0.0,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "send_recv": lambda p: 1.0,
}


def bus_bandwidth(collective: str, nbytes: int, seconds: float, p: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s, as nccl-tests reports them."""
    algbw = nbytes / seconds if seconds > 0 else float("inf")
    return algbw, algbw * BUSBW_FACTOR[collective](p)
