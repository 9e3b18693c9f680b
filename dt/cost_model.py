"""What each collective costs, as arithmetic.

Every algorithm in dt.collectives has an entry here that says, for a given
rank, how many bytes it sends and receives, how many messages, and how many
sequential steps the algorithm takes. The tests hold the transport's
measured counts to these numbers exactly; the benchmark and `dt model` turn
them into time with the alpha-beta-gamma model:

    time = steps * alpha + bytes_on_the_critical_path * beta + reduced_bytes * gamma

p is the group size, n the message size in bytes (for all-gather and
reduce-scatter: the whole gathered / scattered buffer, as nccl-tests counts).
Chunk sizes are computed here, once, for the algorithms and the model alike,
so a ring never posts a receive that its neighbour's send does not match.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def split_sizes(numel: int, parts: int) -> list[int]:
    """numel elements in `parts` contiguous chunks, the first numel % parts one longer.

    33 over 5 gives [7, 7, 7, 6, 6]; 3 over 5 gives [1, 1, 1, 0, 0].
    """
    if parts <= 0:
        raise ValueError(f"parts must be positive, got {parts}")
    base, extra = divmod(numel, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def segment_count(numel: int, segment_elems: int | None) -> int:
    """Messages a chunk of `numel` elements is sent as (empty chunks are not sent)."""
    if numel == 0:
        return 0
    if not segment_elems or segment_elems >= numel:
        return 1
    return math.ceil(numel / segment_elems)


@dataclass(frozen=True)
class Traffic:
    """One rank's share of one collective call."""

    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int
    steps: int  # sequential communication steps (latency terms)


# ----------------------------------------------------------------------------
# Ring: reduce-scatter, all-gather and their composition, all-reduce.
# ----------------------------------------------------------------------------


def ring_reduce_scatter(chunk_numels: list[int], itemsize: int, rank: int,
                        segment_elems: int | None = None) -> Traffic:
    """Ring reduce-scatter: p-1 steps; rank r sends every chunk but its own.

    Bytes per rank (even chunks): (p-1)/p * n. Steps: p-1.
    """
    p = len(chunk_numels)
    if p == 1:
        return Traffic(0, 0, 0, 0, 0)
    sent = [c for i, c in enumerate(chunk_numels) if i != rank]
    recv = [c for i, c in enumerate(chunk_numels) if i != (rank + 1) % p]
    return Traffic(
        bytes_sent=sum(sent) * itemsize,
        bytes_received=sum(recv) * itemsize,
        messages_sent=sum(segment_count(c, segment_elems) for c in sent),
        messages_received=sum(segment_count(c, segment_elems) for c in recv),
        steps=p - 1,
    )


def ring_all_gather(chunk_numels: list[int], itemsize: int, rank: int,
                    segment_elems: int | None = None) -> Traffic:
    """Ring all-gather: p-1 steps; rank r forwards every chunk but its right neighbour's.

    Bytes per rank (even chunks): (p-1)/p * n. Steps: p-1.
    """
    p = len(chunk_numels)
    if p == 1:
        return Traffic(0, 0, 0, 0, 0)
    sent = [c for i, c in enumerate(chunk_numels) if i != (rank + 1) % p]
    recv = [c for i, c in enumerate(chunk_numels) if i != rank]
    return Traffic(
        bytes_sent=sum(sent) * itemsize,
        bytes_received=sum(recv) * itemsize,
        messages_sent=sum(segment_count(c, segment_elems) for c in sent),
        messages_received=sum(segment_count(c, segment_elems) for c in recv),
        steps=p - 1,
    )


def _plus(a: Traffic, b: Traffic) -> Traffic:
    return Traffic(a.bytes_sent + b.bytes_sent, a.bytes_received + b.bytes_received,
                   a.messages_sent + b.messages_sent, a.messages_received + b.messages_received,
                   a.steps + b.steps)


def ring_all_reduce(numel: int, itemsize: int, p: int, rank: int,
                    segment_elems: int | None = None) -> Traffic:
    """Ring all-reduce = ring reduce-scatter + ring all-gather.

    Bytes per rank: 2(p-1)/p * n, independent of p as p grows (bounded by 2n).
    Steps: 2(p-1).
    """
    chunks = split_sizes(numel, p)
    return _plus(ring_reduce_scatter(chunks, itemsize, rank, segment_elems),
                 ring_all_gather(chunks, itemsize, rank, segment_elems))


def ring_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int,
                   segment_elems: int | None = None) -> Traffic:
    """Chain broadcast along the ring from the root: every rank but the last forwards n.

    Bytes per rank: n (the last rank in the chain sends nothing).
    Steps: p-1 hops, plus one per extra segment as the pipeline fills.
    """
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    position = (rank - root) % p
    segs = segment_count(numel, segment_elems)
    n = numel * itemsize
    sends = position < p - 1
    recvs = position > 0
    return Traffic(n if sends else 0, n if recvs else 0, segs if sends else 0,
                   segs if recvs else 0, p - 1 + segs - 1)


# ----------------------------------------------------------------------------
# Flat ("naive") algorithms: everyone talks to one root.
# ----------------------------------------------------------------------------


def flat_reduce(numel: int, itemsize: int, p: int, rank: int, root: int) -> Traffic:
    """Everyone sends n to the root, which reduces p-1 messages: root receives (p-1)n."""
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    n = numel * itemsize
    if rank == root:
        return Traffic(0, (p - 1) * n, 0, p - 1, 1)
    return Traffic(n, 0, 1, 0, 1)


def flat_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int) -> Traffic:
    """The root sends n to each of the p-1 others: (p-1)n from one rank."""
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    n = numel * itemsize
    if rank == root:
        return Traffic((p - 1) * n, 0, p - 1, 0, 1)
    return Traffic(0, n, 0, 1, 1)


def naive_all_reduce(numel: int, itemsize: int, p: int, rank: int, root: int = 0) -> Traffic:
    """Reduce to the root, then broadcast from it: (p-1)n through the root each way.

    Two hops of latency (the ring takes 2(p-1)), but the root's bytes grow
    linearly with p.
    """
    return _plus(flat_reduce(numel, itemsize, p, rank, root),
                 flat_broadcast(numel, itemsize, p, rank, root))


def flat_gather(numels: list[int], itemsize: int, rank: int, root: int) -> Traffic:
    p = len(numels)
    if rank == root:
        others = [c for i, c in enumerate(numels) if i != root]
        return Traffic(0, sum(others) * itemsize, 0, sum(1 for c in others if c), 1 if p > 1 else 0)
    c = numels[rank]
    return Traffic(c * itemsize, 0, 1 if c else 0, 0, 1)


def flat_scatter(numels: list[int], itemsize: int, rank: int, root: int) -> Traffic:
    g = flat_gather(numels, itemsize, rank, root)
    return Traffic(g.bytes_received, g.bytes_sent, g.messages_received, g.messages_sent, g.steps)


# ----------------------------------------------------------------------------
# All-to-all, barrier, and the validation all-gather.
# ----------------------------------------------------------------------------


def pairwise_all_to_all(send_numels: list[int], recv_numels: list[int], itemsize: int,
                        rank: int) -> Traffic:
    """Pairwise exchange: step k sends block (r+k) and receives block (r-k); p-1 steps.

    Bytes per rank (even blocks): (p-1)/p * n.
    """
    p = len(send_numels)
    sent = [c for i, c in enumerate(send_numels) if i != rank]
    recv = [c for i, c in enumerate(recv_numels) if i != rank]
    return Traffic(sum(sent) * itemsize, sum(recv) * itemsize,
                   sum(1 for c in sent if c), sum(1 for c in recv if c), p - 1)


def bruck_all_gather(block_numel: int, itemsize: int, p: int) -> Traffic:
    """Bruck all-gather of equal blocks: ceil(lg p) steps, (p-1) blocks sent per rank."""
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    n = (p - 1) * block_numel * itemsize
    msgs = steps if block_numel else 0
    return Traffic(n, n, msgs, msgs, steps)


def dissemination_barrier(p: int) -> Traffic:
    """ceil(lg p) rounds of one empty message each way."""
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    return Traffic(0, 0, steps, steps, steps)


# ----------------------------------------------------------------------------
# Bandwidth reporting (nccl-tests conventions).
# ----------------------------------------------------------------------------

BUSBW_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "send_recv": lambda p: 1.0,
}


def bus_bandwidth(collective: str, nbytes: int, seconds: float, p: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s, as nccl-tests reports them."""
    algbw = nbytes / seconds if seconds > 0 else float("inf")
    return algbw, algbw * BUSBW_FACTOR[collective](p)
