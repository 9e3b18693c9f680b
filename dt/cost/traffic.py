"""What each collective moves, per rank, as arithmetic.

Every point-to-point algorithm in dt.collectives has a function here that says,
for a given rank, how many bytes it sends and receives, how many messages, and
how many sequential steps the algorithm takes; the algorithm's record
(`@algorithm(..., traffic=...)` beside it, dt.cost.records) names the function. The tests hold the transport's
measured counts (dt.traffic()) to these numbers exactly; dt.cost.time turns
them into seconds.

`traffic_for(collective, algorithm, ...)` is what everything else (the
tensor-parallel layers, ZeRO, the study, `dt model`) asks: it calls the record's function. The schedules
themselves (shards, folds, trees) come from dt.layout, the same functions the
algorithms post their messages from.

p is the group size, n the message size in bytes (for all-gather and
reduce-scatter: the whole gathered / scattered buffer, as nccl-tests counts).
"""

from __future__ import annotations

from dt.cost.records import ALIASES, FORMS, Call, RankTraffic, call_of, canonical, family, record_for
from dt.hosts import phases
from dt.layout import (
    Fold,
    ceil_log2,
    children,
    doubling_gather,
    edges,
    halving_doubling,
    lowest_bit,
    segment_count,
    split_sizes,
)

__all__ = [
    "ALIASES",
    "FORMS",
    "RankTraffic",
    "binomial_broadcast",
    "binomial_reduce",
    "bruck_all_gather",
    "call_of",
    "Call",
    "canonical",
    "dissemination_barrier",
    "family",
    "flat_broadcast",
    "flat_gather",
    "flat_reduce",
    "flat_scatter",
    "hierarchical",
    "hierarchical_traffic",
    "naive_all_reduce",
    "pairwise_all_to_all",
    "rabenseifner_all_reduce",
    "recursive_doubling_all_gather",
    "recursive_doubling_all_reduce",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_broadcast",
    "ring_reduce_scatter",
    "scatter_allgather_broadcast",
    "traffic_for",
]

_NONE = RankTraffic(0, 0, 0, 0, 0)


class _Tally:
    """Adds up one rank's messages as an algorithm's schedule posts them."""

    def __init__(self, itemsize: int):
        self.itemsize = itemsize
        self.sent = self.received = self.msgs_sent = self.msgs_received = 0

    def send(self, numel: int) -> None:
        if numel:
            self.sent += numel * self.itemsize
            self.msgs_sent += 1

    def recv(self, numel: int) -> None:
        if numel:
            self.received += numel * self.itemsize
            self.msgs_received += 1

    def traffic(self, steps: int) -> RankTraffic:
        return RankTraffic(self.sent, self.received, self.msgs_sent, self.msgs_received, steps)


# ----------------------------------------------------------------------------
# Ring: reduce-scatter, all-gather and their composition, all-reduce.
# ----------------------------------------------------------------------------


def _one_lap(sent: list[int], recv: list[int], itemsize: int, segment_elems: int | None) -> RankTraffic:
    """One lap of the ring: the chunks a rank sends and receives (p-1 of each), each cut in segments."""
    return RankTraffic(
        bytes_sent=sum(sent) * itemsize,
        bytes_received=sum(recv) * itemsize,
        messages_sent=sum(segment_count(c, segment_elems) for c in sent),
        messages_received=sum(segment_count(c, segment_elems) for c in recv),
        steps=len(sent),
    )


def ring_reduce_scatter(chunk_numels: list[int], itemsize: int, rank: int,
                        segment_elems: int | None = None) -> RankTraffic:
    """Ring reduce-scatter: p-1 steps; rank r sends every chunk but its own and
    receives every chunk but its left neighbour's.

    Bytes per rank (even chunks): (p-1)/p * n. Steps: p-1.
    """
    p = len(chunk_numels)
    if p == 1:
        return _NONE
    sent = [c for i, c in enumerate(chunk_numels) if i != rank]
    recv = [c for i, c in enumerate(chunk_numels) if i != (rank - 1) % p]
    return _one_lap(sent, recv, itemsize, segment_elems)


def ring_all_gather(chunk_numels: list[int], itemsize: int, rank: int,
                    segment_elems: int | None = None) -> RankTraffic:
    """Ring all-gather: p-1 steps; rank r forwards every chunk but its right neighbour's.

    Bytes per rank (even chunks): (p-1)/p * n. Steps: p-1.
    """
    p = len(chunk_numels)
    if p == 1:
        return _NONE
    sent = [c for i, c in enumerate(chunk_numels) if i != (rank + 1) % p]
    recv = [c for i, c in enumerate(chunk_numels) if i != rank]
    return _one_lap(sent, recv, itemsize, segment_elems)


def ring_all_reduce(numel: int, itemsize: int, p: int, rank: int,
                    segment_elems: int | None = None) -> RankTraffic:
    """Ring all-reduce = ring reduce-scatter + ring all-gather.

    Bytes per rank: 2(p-1)/p * n, independent of p as p grows (bounded by 2n).
    Steps: 2(p-1).
    """
    chunks = split_sizes(numel, p)
    return (ring_reduce_scatter(chunks, itemsize, rank, segment_elems)
            + ring_all_gather(chunks, itemsize, rank, segment_elems))


def ring_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int,
                   segment_elems: int | None = None) -> RankTraffic:
    """Chain broadcast along the ring from the root: every rank but the last forwards n.

    Bytes per rank: n (the last rank in the chain sends nothing).
    Steps: p-1 hops, plus one per extra segment as the pipeline fills.
    """
    if p == 1 or numel == 0:
        return _NONE
    position = (rank - root) % p
    segs = segment_count(numel, segment_elems)
    n = numel * itemsize
    sends = position < p - 1
    recvs = position > 0
    return RankTraffic(n if sends else 0, n if recvs else 0, segs if sends else 0,
                   segs if recvs else 0, p - 1 + segs - 1)


# ----------------------------------------------------------------------------
# Flat ("naive") algorithms: everyone talks to one root.
# ----------------------------------------------------------------------------


def flat_reduce(numel: int, itemsize: int, p: int, rank: int, root: int) -> RankTraffic:
    """Everyone sends n to the root, which reduces p-1 messages: root receives (p-1)n."""
    if p == 1 or numel == 0:
        return _NONE
    n = numel * itemsize
    if rank == root:
        return RankTraffic(0, (p - 1) * n, 0, p - 1, 1)
    return RankTraffic(n, 0, 1, 0, 1)


def flat_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int) -> RankTraffic:
    """The root sends n to each of the p-1 others: (p-1)n from one rank."""
    if p == 1 or numel == 0:
        return _NONE
    n = numel * itemsize
    if rank == root:
        return RankTraffic((p - 1) * n, 0, p - 1, 0, 1)
    return RankTraffic(0, n, 0, 1, 1)


def naive_all_reduce(numel: int, itemsize: int, p: int, rank: int, root: int = 0) -> RankTraffic:
    """Reduce to the root, then broadcast from it: (p-1)n through the root each way.

    Two hops of latency (the ring takes 2(p-1)), but the root's bytes grow
    linearly with p.
    """
    return flat_reduce(numel, itemsize, p, rank, root) + flat_broadcast(numel, itemsize, p, rank, root)


def flat_gather(numels: list[int], itemsize: int, rank: int, root: int) -> RankTraffic:
    p = len(numels)
    if rank == root:
        others = [c for i, c in enumerate(numels) if i != root]
        return RankTraffic(0, sum(others) * itemsize, 0, sum(1 for c in others if c), 1 if p > 1 else 0)
    c = numels[rank]
    return RankTraffic(c * itemsize, 0, 1 if c else 0, 0, 1)


def flat_scatter(numels: list[int], itemsize: int, rank: int, root: int) -> RankTraffic:
    g = flat_gather(numels, itemsize, rank, root)
    return RankTraffic(g.bytes_received, g.bytes_sent, g.messages_received, g.messages_sent, g.steps)


# ----------------------------------------------------------------------------
# All-to-all, barrier, and the validation all-gather.
# ----------------------------------------------------------------------------


def pairwise_all_to_all(send_numels: list[int], recv_numels: list[int], itemsize: int,
                        rank: int) -> RankTraffic:
    """Pairwise exchange: step k sends block (r+k) and receives block (r-k); p-1 steps.

    Bytes per rank (even blocks): (p-1)/p * n.
    """
    p = len(send_numels)
    sent = [c for i, c in enumerate(send_numels) if i != rank]
    recv = [c for i, c in enumerate(recv_numels) if i != rank]
    return RankTraffic(sum(sent) * itemsize, sum(recv) * itemsize,
                       sum(1 for c in sent if c), sum(1 for c in recv if c), p - 1)


def bruck_all_gather(block_numel: int, itemsize: int, p: int) -> RankTraffic:
    """Bruck all-gather of equal blocks: ceil(lg p) steps, (p-1) blocks sent per rank."""
    steps = ceil_log2(p)
    n = (p - 1) * block_numel * itemsize
    msgs = steps if block_numel else 0
    return RankTraffic(n, n, msgs, msgs, steps)


def dissemination_barrier(p: int) -> RankTraffic:
    """ceil(lg p) rounds of one empty message each way."""
    steps = ceil_log2(p)
    return RankTraffic(0, 0, steps, steps, steps)


# ----------------------------------------------------------------------------
# Recursive doubling / halving (dt/collectives/doubling.py) over layout.Fold.
# ----------------------------------------------------------------------------


def _fold_traffic(t: _Tally, fold: Fold, numel_in: int, numel_out: int) -> None:
    """The fold's two messages: the even rank sends numel_in and gets numel_out back."""
    if fold.folded:
        (t.send if fold.vrank is None else t.recv)(numel_in)
        (t.recv if fold.vrank is None else t.send)(numel_out)


def recursive_doubling_all_reduce(numel: int, itemsize: int, p: int, rank: int) -> RankTraffic:
    """Whole buffer exchanged in each of lg p' steps (+ fold in and out when p != p').

    Bytes per rank: n lg p' (+ n for a folding pair). Steps: lg p' (+2).
    """
    if p == 1 or numel == 0:
        return _NONE
    fold = Fold(p, rank)
    t = _Tally(itemsize)
    _fold_traffic(t, fold, numel, numel)
    if fold.vrank is not None:
        for _ in range(fold.rounds):
            t.send(numel)
            t.recv(numel)
    return t.traffic(fold.steps(1))


def rabenseifner_all_reduce(numel: int, itemsize: int, p: int, rank: int,
                            reverse: bool = False) -> RankTraffic:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather over p' pieces.

    Bytes per rank: 2(p'-1)/p' n (+ n for a folding pair). Steps: 2 lg p' (+2).
    """
    if p == 1 or numel == 0:
        return _NONE
    fold = Fold(p, rank, reverse)  # reverse: a group spanning hosts
    t = _Tally(itemsize)
    _fold_traffic(t, fold, numel, numel)
    if fold.vrank is not None:
        e = edges(split_sizes(numel, fold.p2))
        halving, doubling = halving_doubling(fold.vrank, fold.p2)
        for s in halving + doubling:
            t.send(e[s.mine[1]] - e[s.mine[0]])
            t.recv(e[s.theirs[1]] - e[s.theirs[0]])
    return t.traffic(fold.steps(2))


def recursive_doubling_all_gather(numels: list[int], itemsize: int, rank: int) -> RankTraffic:
    """Each step swaps everything gathered so far with the partner at distance d.

    Bytes per rank: (p-1)/p n for a power of two (n = all blocks); a folding
    pair adds one block in and n out. Steps: lg p' (+2).
    """
    p = len(numels)
    if p == 1:
        return _NONE
    fold = Fold(p, rank)
    e = edges(numels)
    t = _Tally(itemsize)
    even = rank if fold.vrank is None else rank - 1
    _fold_traffic(t, fold, numels[even] if fold.folded else 0, e[-1])
    if fold.vrank is not None:
        for s in doubling_gather(fold.vrank, fold.p2):
            t.send(e[fold.lo(s.mine[1])] - e[fold.lo(s.mine[0])])
            t.recv(e[fold.lo(s.theirs[1])] - e[fold.lo(s.theirs[0])])
    return t.traffic(fold.steps(1))


# ----------------------------------------------------------------------------
# Binomial trees (dt/collectives/tree.py) over layout.lowest_bit / children.
# ----------------------------------------------------------------------------


def binomial_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int) -> RankTraffic:
    """Binomial tree: receive n from the parent, send n to each child.

    Critical path: ceil(lg p) steps of n bytes each (the root sends n ceil(lg p)).
    """
    if p == 1 or numel == 0:
        return _NONE
    v = (rank - root) % p
    t = _Tally(itemsize)
    if v:
        t.recv(numel)
    for _ in children(v, p):
        t.send(numel)
    return t.traffic(ceil_log2(p))


def binomial_reduce(numel: int, itemsize: int, p: int, rank: int, root: int) -> RankTraffic:
    """Binomial tree upside down: receive and reduce n per child, send n to the parent."""
    b = binomial_broadcast(numel, itemsize, p, rank, root)
    return RankTraffic(b.bytes_received, b.bytes_sent, b.messages_received, b.messages_sent, b.steps)


def scatter_allgather_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int,
                                segment_elems: int | None = None) -> RankTraffic:
    """Binomial scatter of p pieces, then ring all-gather of the pieces.

    Bytes per rank: about 2(p-1)/p n for the root's neighbours, (p-1)/p n plus
    its subtree's pieces for the others. Steps: ceil(lg p) + p - 1.
    """
    if p == 1 or numel == 0:
        return _NONE
    sizes = split_sizes(numel, p)  # piece j belongs to relative rank j
    e = edges(sizes)
    v = (rank - root) % p
    t = _Tally(itemsize)
    if v:
        t.recv(e[min(v + lowest_bit(v, p), p)] - e[v])
    for c in children(v, p):
        t.send(e[min(c + (c - v), p)] - e[c])
    ring = ring_all_gather([sizes[(a - root) % p] for a in range(p)], itemsize, rank,
                           segment_elems)
    return RankTraffic(t.sent + ring.bytes_sent, t.received + ring.bytes_received,
                       t.msgs_sent + ring.messages_sent, t.msgs_received + ring.messages_received,
                       ceil_log2(p) + p - 1)


# ----------------------------------------------------------------------------
# Hierarchical (dt/collectives/hierarchical.py): rings inside hosts and on rails (dt.hosts.phases).
# ----------------------------------------------------------------------------


def hierarchical(collective: str, numels: list[int], itemsize: int, hosts: tuple[int, ...], rank: int,
                 segment_elems: int | None = None) -> RankTraffic:
    """The rank's rings, one after another: each phase is a ring reduce-scatter, all-gather or both.

    H hosts of G ranks, n bytes: all-reduce 2(G-1)/G n inside the host and
    2(H-1)/H n/G across it, 2(G-1) + 2(H-1) steps; reduce-scatter and all-gather half of each.
    """
    total = _NONE
    for ph in phases(collective, hosts, rank, numels):
        chunks = list(ph.chunks)
        if ph.kind in ("reduce_scatter", "all_reduce"):
            total += ring_reduce_scatter(chunks, itemsize, ph.position, segment_elems)
        if ph.kind in ("all_gather", "all_reduce"):
            total += ring_all_gather(chunks, itemsize, ph.position, segment_elems)
    return total


def hierarchical_traffic(c: Call) -> RankTraffic:
    """The hierarchical algorithms' record: `hierarchical` on the call's blocks and hosts."""
    numels = [c.n] if c.collective == "all_reduce" else c.blocks
    return hierarchical(c.collective, numels, c.itemsize, c.placed, c.rank, c.segment_elems)


def traffic_for(collective: str, algorithm: str, numels: int | list[int], itemsize: int, p: int,
                rank: int, root: int = 0, segment_elems: int | None = None,
                recv_numels: list[int] | None = None, stage_bytes: int | None = None,
                hosts: tuple[int, ...] | None = None) -> RankTraffic:
    """The exact per-rank traffic of any algorithm, by name (what dt.traffic() counts).

    `numels`: the tensor's element count for all_reduce / broadcast / reduce;
    every rank's block for all_gather / reduce_scatter / gather / scatter (a
    list, or one int for equal blocks); for all_to_all the blocks this rank
    sends, with `recv_numels` the blocks it receives (default: the same).
    `root` is a group rank. Aliases ("naive" broadcast) resolve to their algorithm.
    Load/store algorithms (dt.cost.loadstore) count peer reads on the shared-memory
    wire, in rounds of `stage_bytes` (the group's staging half; None: one round).
    `hosts` (hosts[r]: group rank r's host; default: one host) places the ranks for the
    hierarchical algorithms. The function that counts is the algorithm's record's
    (dt.cost.records, declared beside the algorithm).
    """
    counted = record_for(collective, algorithm).traffic
    if counted is None:
        raise KeyError(f"no per-rank traffic model for {collective} {algorithm}")
    return counted(call_of(collective, algorithm, numels, itemsize, p, rank, root=root,
                           segment_elems=segment_elems, recv_numels=recv_numels,
                           stage_bytes=stage_bytes, hosts=hosts))
