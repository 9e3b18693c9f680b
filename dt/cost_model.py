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
    """Ring reduce-scatter: p-1 steps; rank r sends every chunk but its own and
    receives every chunk but its left neighbour's.

    Bytes per rank (even chunks): (p-1)/p * n. Steps: p-1.
    """
    p = len(chunk_numels)
    if p == 1:
        return Traffic(0, 0, 0, 0, 0)
    sent = [c for i, c in enumerate(chunk_numels) if i != rank]
    recv = [c for i, c in enumerate(chunk_numels) if i != (rank - 1) % p]
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
# Recursive doubling / halving (dt/collectives/doubling.py) and the fold that
# handles group sizes that are not a power of two.
# ----------------------------------------------------------------------------


def _fold(p: int, rank: int) -> tuple[int, int, int | None, int]:
    """(p', e, virtual rank or None, partner) as dt.collectives.doubling.Fold computes them."""
    p2 = 1 << (p.bit_length() - 1)
    e = p - p2
    if rank < 2 * e:
        return p2, e, (rank // 2 if rank % 2 else None), (rank + 1 if rank % 2 == 0 else rank - 1)
    return p2, e, rank - e, -1


def _edges(sizes: list[int]) -> list[int]:
    edges = [0]
    for s in sizes:
        edges.append(edges[-1] + s)
    return edges


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

    def traffic(self, steps: int) -> Traffic:
        return Traffic(self.sent, self.received, self.msgs_sent, self.msgs_received, steps)


def _fold_steps(p: int, rounds_per_pass: int) -> int:
    p2 = 1 << (p.bit_length() - 1)
    return rounds_per_pass * (p2.bit_length() - 1) + (2 if p != p2 else 0)


def recursive_doubling_all_reduce(numel: int, itemsize: int, p: int, rank: int) -> Traffic:
    """Whole buffer exchanged in each of lg p' steps (+ fold in and out when p != p').

    Bytes per rank: n lg p' (+ n for a folding pair). Steps: lg p' (+2).
    """
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    p2, e, v, _ = _fold(p, rank)
    t = _Tally(itemsize)
    if rank < 2 * e:
        (t.send if v is None else t.recv)(numel)  # fold in
        (t.recv if v is None else t.send)(numel)  # fold out
    if v is not None:
        for _ in range(p2.bit_length() - 1):
            t.send(numel)
            t.recv(numel)
    return t.traffic(_fold_steps(p, 1))


def rabenseifner_all_reduce(numel: int, itemsize: int, p: int, rank: int) -> Traffic:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather over p' pieces.

    Bytes per rank: 2(p'-1)/p' n (+ n for a folding pair). Steps: 2 lg p' (+2).
    """
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    p2, e, v, _ = _fold(p, rank)
    t = _Tally(itemsize)
    if rank < 2 * e:
        (t.send if v is None else t.recv)(numel)
        (t.recv if v is None else t.send)(numel)
    if v is not None:
        edges = _edges(split_sizes(numel, p2))
        lo, hi, d = 0, p2, p2 // 2
        while d >= 1:
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if v & d else ((lo, mid), (mid, hi))
            t.send(edges[give[1]] - edges[give[0]])
            t.recv(edges[keep[1]] - edges[keep[0]])
            lo, hi = keep
            d //= 2
        d = 1
        while d < p2:
            pv = v ^ d
            plo = pv - pv % d
            t.send(edges[hi] - edges[lo])
            t.recv(edges[plo + d] - edges[plo])
            lo, hi = min(lo, plo), max(hi, plo + d)
            d *= 2
    return t.traffic(_fold_steps(p, 2))


def recursive_doubling_all_gather(numels: list[int], itemsize: int, rank: int) -> Traffic:
    """Each step swaps everything gathered so far with the partner at distance d.

    Bytes per rank: (p-1)/p n for a power of two (n = all blocks); a folding
    pair adds one block in and n out. Steps: lg p' (+2).
    """
    p = len(numels)
    if p == 1:
        return Traffic(0, 0, 0, 0, 0)
    p2, e, v, _ = _fold(p, rank)
    edges = _edges(numels)

    def lo(u: int) -> int:
        return 2 * u if u < e else u + e

    t = _Tally(itemsize)
    if rank < 2 * e:
        even = rank if v is None else rank - 1
        (t.send if v is None else t.recv)(numels[even])
        (t.recv if v is None else t.send)(edges[-1])
    if v is not None:
        d = 1
        while d < p2:
            base, pv = v - v % d, v ^ d
            pbase = pv - pv % d
            t.send(edges[lo(base + d)] - edges[lo(base)])
            t.recv(edges[lo(pbase + d)] - edges[lo(pbase)])
            d *= 2
    return t.traffic(_fold_steps(p, 1))


# ----------------------------------------------------------------------------
# Binomial trees (dt/collectives/tree.py).
# ----------------------------------------------------------------------------


def lowest_bit(v: int, p: int) -> int:
    """2^k for relative rank v's lowest set bit; for the root (v = 0), the power of two >= p.

    In a binomial tree rooted at 0, v's parent is v - lowest_bit(v) and it
    receives in step lg(lowest_bit(v)); the tree code and its cost share this.
    """
    if v:
        return v & -v
    top = 1
    while top < p:
        top *= 2
    return top


def children(v: int, p: int) -> list[int]:
    """Relative ranks of v's children in the binomial tree, largest subtree first."""
    out, mask = [], lowest_bit(v, p) // 2
    while mask >= 1:
        if v + mask < p:
            out.append(v + mask)
        mask //= 2
    return out


def _tree_steps(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def binomial_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int) -> Traffic:
    """Binomial tree: receive n from the parent, send n to each child.

    Critical path: ceil(lg p) steps of n bytes each (the root sends n ceil(lg p)).
    """
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    v = (rank - root) % p
    t = _Tally(itemsize)
    if v:
        t.recv(numel)
    for _ in children(v, p):
        t.send(numel)
    return t.traffic(_tree_steps(p))


def binomial_reduce(numel: int, itemsize: int, p: int, rank: int, root: int) -> Traffic:
    """Binomial tree upside down: receive and reduce n per child, send n to the parent."""
    b = binomial_broadcast(numel, itemsize, p, rank, root)
    return Traffic(b.bytes_received, b.bytes_sent, b.messages_received, b.messages_sent, b.steps)


def scatter_allgather_broadcast(numel: int, itemsize: int, p: int, rank: int, root: int,
                                segment_elems: int | None = None) -> Traffic:
    """Binomial scatter of p pieces, then ring all-gather of the pieces.

    Bytes per rank: about 2(p-1)/p n for the root's neighbours, (p-1)/p n plus
    its subtree's pieces for the others. Steps: ceil(lg p) + p - 1.
    """
    if p == 1 or numel == 0:
        return Traffic(0, 0, 0, 0, 0)
    sizes = split_sizes(numel, p)  # piece j belongs to relative rank j
    edges = _edges(sizes)
    v = (rank - root) % p
    t = _Tally(itemsize)
    if v:
        t.recv(edges[min(v + lowest_bit(v, p), p)] - edges[v])
    for c in children(v, p):
        t.send(edges[min(c + (c - v), p)] - edges[c])
    ring = ring_all_gather([sizes[(a - root) % p] for a in range(p)], itemsize, rank,
                           segment_elems)
    return Traffic(t.sent + ring.bytes_sent, t.received + ring.bytes_received,
                   t.msgs_sent + ring.messages_sent, t.msgs_received + ring.messages_received,
                   _tree_steps(p) + p - 1)


def traffic_for(collective: str, algorithm: str, numels: int | list[int], itemsize: int, p: int,
                rank: int, root: int = 0, segment_elems: int | None = None) -> Traffic:
    """The exact per-rank Traffic of any algorithm, by name (what dt.traffic() counts).

    `numels`: the tensor's element count for all_reduce / broadcast / reduce;
    every rank's block for all_gather / reduce_scatter (a list, or one int
    for equal blocks). `root` is a group rank.
    """
    blocks = [numels] * p if isinstance(numels, int) else list(numels)
    n = numels if isinstance(numels, int) else sum(numels)
    key = (collective.replace("_into_tensor", "").replace("_tensor", ""), algorithm)
    table = {
        ("all_reduce", "ring"): lambda: ring_all_reduce(n, itemsize, p, rank, segment_elems),
        ("all_reduce", "naive"): lambda: naive_all_reduce(n, itemsize, p, rank),
        ("all_reduce", "recursive_doubling"): lambda: recursive_doubling_all_reduce(n, itemsize, p, rank),
        ("all_reduce", "rabenseifner"): lambda: rabenseifner_all_reduce(n, itemsize, p, rank),
        ("reduce_scatter", "ring"): lambda: ring_reduce_scatter(blocks, itemsize, rank, segment_elems),
        ("all_gather", "ring"): lambda: ring_all_gather(blocks, itemsize, rank, segment_elems),
        ("all_gather", "recursive_doubling"): lambda: recursive_doubling_all_gather(blocks, itemsize, rank),
        ("all_gather", "bruck"): lambda: (bruck_all_gather(blocks[0], itemsize, p)
                                          if len(set(blocks)) == 1
                                          else ring_all_gather(blocks, itemsize, rank, segment_elems)),
        ("broadcast", "flat"): lambda: flat_broadcast(n, itemsize, p, rank, root),
        ("broadcast", "ring"): lambda: ring_broadcast(n, itemsize, p, rank, root, segment_elems),
        ("broadcast", "binomial"): lambda: binomial_broadcast(n, itemsize, p, rank, root),
        ("broadcast", "scatter_allgather"):
            lambda: scatter_allgather_broadcast(n, itemsize, p, rank, root, segment_elems),
        ("reduce", "flat"): lambda: flat_reduce(n, itemsize, p, rank, root),
        ("reduce", "binomial"): lambda: binomial_reduce(n, itemsize, p, rank, root),
    }
    if key not in table:
        raise KeyError(f"no per-rank traffic model for {collective} {algorithm}")
    return table[key]()


# ----------------------------------------------------------------------------
# Time: the alpha-beta-gamma model, per algorithm, in closed form.
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Predicted time of one collective call, term by term (seconds, bytes)."""

    steps: int  # sequential messages on the critical path
    bytes: float  # bytes on the critical path (what one rank's link carries)
    reduced: float  # bytes reduced on the critical path
    latency: float  # steps * alpha
    bandwidth: float  # bytes * beta
    reduction: float  # reduced * gamma

    @property
    def total(self) -> float:
        return self.latency + self.bandwidth + self.reduction


def _lg(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def formula(collective: str, algorithm: str, n: float, p: int,
            segment_bytes: int | None = None) -> tuple[int, float, float]:
    """(steps, critical-path bytes, reduced bytes) for n bytes on p ranks.

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
    key = (collective.replace("_tensor", "").replace("_into", ""), algorithm)
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
        return _lg(p), share, 0.0
    if key in (("broadcast", "flat"), ("broadcast", "naive")):
        return 1, (p - 1) * n, 0.0
    if key == ("broadcast", "ring"):
        k = max(1, math.ceil(n / segment_bytes)) if segment_bytes else 1
        return p - 2 + k, (p - 2 + k) / k * n, 0.0
    if key == ("broadcast", "binomial"):
        return _lg(p), _lg(p) * n, 0.0
    if key == ("broadcast", "scatter_allgather"):
        return _lg(p) + p - 1, 2 * share, 0.0
    if key in (("reduce", "flat"), ("reduce", "naive")):
        return 1, (p - 1) * n, (p - 1) * n
    if key == ("reduce", "binomial"):
        return _lg(p), _lg(p) * n, _lg(p) * n
    if key == ("all_to_all", "pairwise"):
        return p - 1, share, 0.0
    if key in (("gather", "flat"), ("scatter", "flat"), ("gather", "naive"), ("scatter", "naive")):
        return 1, share, 0.0
    if key == ("barrier", "dissemination"):
        return _lg(p), 0.0, 0.0
    raise KeyError(f"no cost formula for {collective} {algorithm}")


def estimate(collective: str, algorithm: str, nbytes: float, p: int, *, alpha: float,
             beta: float, gamma: float = 0.0, segment_bytes: int | None = None) -> Estimate:
    """time = steps * alpha + bytes * beta + reduced * gamma, for one call.

    Ring all-reduce of 1 GB on 8 ranks at 450 GB/s and 5 us per step:
    14 * 5 us + 2 * 7/8 * 1 GB / 450 GB/s = 0.07 ms + 3.89 ms = 3.96 ms.
    """
    steps, nb, red = formula(collective, algorithm, nbytes, p, segment_bytes)
    return Estimate(steps, nb, red, steps * alpha, nb * beta, red * gamma)


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
