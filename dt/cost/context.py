"""What context-parallel attention moves: Ulysses' all-to-alls and ring attention's passes.

A sequence of S tokens is split over cp ranks (dt.layout.SequenceLayout:
seq_sizes[r] tokens on rank r). q, k and v are [b, H, s_r, d] on rank r.
Write n = b * (S/cp) * H * d * itemsize, the bytes of one of them on one rank
(even split).

Ulysses (DeepSpeed-Ulysses): one all-to-all turns q, k, v from
sequence-sharded to head-sharded (each rank keeps H/cp heads of the whole
sequence; dt moves q, k and v in one all-to-all: the bytes of three, the
messages of one), attention runs on whole sequences, and one all-to-all
turns the output back. Backward: the same two, reversed.
    per rank: forward 4 (cp-1)/cp n, backward the same; it FALLS as cp grows
    (n is 1/cp of the sequence), so the all-to-all scales.

Ring attention: the key/value blocks travel around the ring while each rank
keeps its queries: cp-1 hops of one k/v block (2n) forward. Backward sends
the k/v blocks around again and their gradients one hop behind them (cp-1
hops each, the last bringing every block's gradient home).
    per rank: forward 2 (cp-1) n, backward 4 (cp-1) n; with n = 1/cp of the
    sequence that tends to 6 b S H d itemsize: it does NOT fall with cp, but
    each hop hides behind a block of attention compute.
"""

from __future__ import annotations

from dt.cost.traffic import RankTraffic, pairwise_all_to_all
from dt.layout import ring_hop

__all__ = ["ring_attention_traffic", "ulysses_traffic"]


def _check(seq_sizes: list[int], rank: int) -> int:
    p = len(seq_sizes)
    if not 0 <= rank < p:
        raise ValueError(f"rank {rank} is not one of {p}")
    return p


def ulysses_traffic(seq_sizes: list[int], batch: int, heads: int, head_dim: int, itemsize: int,
                    rank: int) -> tuple[RankTraffic, RankTraffic]:
    """(forward, backward) per-rank traffic of Ulysses attention, exactly.

    Forward: the q/k/v all-to-all (rank r sends rank j the heads of j for its
    s_r tokens: 3 b s_r (H/cp) d numbers) and the output all-to-all (rank r
    sends rank j the output of r's heads for j's s_j tokens). Backward: the two
    reversed. heads must divide by cp.
    """
    p = _check(seq_sizes, rank)
    if heads % p:
        raise ValueError(f"{heads} heads do not split over {p} ranks")
    hp = heads // p
    row = batch * hp * head_dim  # numbers per token per rank's head block
    qkv_send = [3 * row * seq_sizes[rank]] * p
    qkv_recv = [3 * row * s for s in seq_sizes]
    out_send = [row * s for s in seq_sizes]
    out_recv = [row * seq_sizes[rank]] * p
    qkv = pairwise_all_to_all(qkv_send, qkv_recv, itemsize, rank)
    out = pairwise_all_to_all(out_send, out_recv, itemsize, rank)
    out_back = pairwise_all_to_all(out_recv, out_send, itemsize, rank)
    qkv_back = pairwise_all_to_all(qkv_recv, qkv_send, itemsize, rank)
    return qkv + out, out_back + qkv_back


def ring_attention_traffic(seq_sizes: list[int], batch: int, heads: int, head_dim: int,
                           itemsize: int, rank: int) -> tuple[RankTraffic, RankTraffic]:
    """(forward, backward) per-rank traffic of ring attention, exactly.

    One block = k and v of one rank's tokens: 2 b H s_j d numbers. Forward:
    hops 0..cp-2 (dt.layout.ring_hop) each send the block held and receive the
    next, one message each way. Backward: hops 0..cp-1, hop h carrying the k/v
    block if h <= cp-2 and the block's dk/dv if h >= 1, as one message.
    """
    p = _check(seq_sizes, rank)
    block = [2 * batch * heads * s * head_dim * itemsize for s in seq_sizes]

    def hops(count: int, parts: list[tuple[int, int]]) -> RankTraffic:
        sent = received = msgs_sent = msgs_received = 0
        for h in range(count):
            out_block, in_block = ring_hop(rank, p, h)
            copies = sum(1 for lo, hi in parts if lo <= h <= hi)
            nbytes_out, nbytes_in = copies * block[out_block], copies * block[in_block]
            sent, msgs_sent = sent + nbytes_out, msgs_sent + (1 if nbytes_out else 0)
            received, msgs_received = received + nbytes_in, msgs_received + (1 if nbytes_in else 0)
        return RankTraffic(sent, received, msgs_sent, msgs_received, count)

    forward = hops(p - 1, [(0, p - 2)])
    backward = hops(p if p > 1 else 0, [(0, p - 2), (1, p - 1)])
    return forward, backward
