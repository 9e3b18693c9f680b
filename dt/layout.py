"""Where the pieces go: the index arithmetic every algorithm, layer and cost shares.

Nothing here moves a byte. These functions say how a buffer is cut into
shards and segments, which rank pairs with which in a doubling algorithm,
and who is whose parent in a binomial tree. The collectives call them to
post their messages, the cost model calls the same ones to count those
messages, and the tensor-parallel layers and ZeRO call `split_sizes` to
agree on shards: one definition, so a receive always matches its send.

- split_sizes / edges     shards of a buffer over p ranks (uneven allowed)
- segment_count           messages a chunk is sent as, in segments
- Fold                    MPICH's fold of p ranks onto a power of two
- halving_doubling        Rabenseifner's schedule (who, which pieces, per step)
- doubling_gather         recursive-doubling all-gather's schedule
- lowest_bit / children   the binomial tree
- ceil_log2               ceil(lg p), the step count of every lg-p algorithm
- rounds / shm_slot_bytes how shared-memory algorithms cut a buffer into rounds; channel slots
- SequenceLayout          a sequence over p context-parallel ranks (contiguous or zig-zag)
- ring_hop                which block a ring pass sends and receives at each hop
- visible                 which keys of a chunk a causal mask lets a chunk's queries see
- expert_capacity         how many assignments an expert accepts (capacity factor)
- Block, shard_block      the box of a tensor a rank holds (tensor parallel: a slice along one dim)
- flat_blocks, intersect  a flat range of a box as boxes; the overlap of two (checkpoint resharding)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Block",
    "Fold",
    "bit_reverse",
    "SequenceLayout",
    "Step",
    "ceil_log2",
    "children",
    "doubling_gather",
    "edges",
    "expert_capacity",
    "flat_blocks",
    "halving_doubling",
    "intersect",
    "lowest_bit",
    "TABLE_BYTES",
    "ring_hop",
    "ring_received",
    "rounds",
    "segment_count",
    "shard_block",
    "shm_slot_bytes",
    "split_sizes",
    "table_elems",
    "visible",
]


def split_sizes(numel: int, parts: int) -> list[int]:
    """numel elements in `parts` contiguous chunks, the first numel % parts one longer.

    33 over 5 gives [7, 7, 7, 6, 6]; 3 over 5 gives [1, 1, 1, 0, 0].
    """
    if parts <= 0:
        raise ValueError(f"parts must be positive, got {parts}")
    base, extra = divmod(numel, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def edges(sizes: list[int]) -> list[int]:
    """Offsets of consecutive chunks: edges([3, 2]) = [0, 3, 5]; chunk i is [e[i], e[i+1])."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return out


def segment_count(numel: int, segment_elems: int | None) -> int:
    """Messages a chunk of `numel` elements is sent as (empty chunks are not sent)."""
    if numel == 0:
        return 0
    if not segment_elems or segment_elems >= numel:
        return 1
    return math.ceil(numel / segment_elems)


def ring_received(rank: int, p: int, step: int, first: int) -> int:
    """The chunk rank r receives at `step` of a ring lap that starts it on chunk r + first.

    At step s rank r sends chunk (r - s + first) mod p to the right and receives
    (r - s - 1 + first) mod p from the left. first=0: all-gather (start on your
    own chunk); first=-1: reduce-scatter (finish the lap on your own chunk).
    """
    return (rank - step - 1 + first) % p


def ceil_log2(p: int) -> int:
    """ceil(lg p); 0 for p <= 1."""
    return (p - 1).bit_length() if p > 1 else 0


# ---------------------------------------------------------------------------
# The non-power-of-two fold (MPICH) and the doubling schedules on top of it.
# ---------------------------------------------------------------------------


def bit_reverse(v: int, bits: int) -> int:
    """v's lowest `bits` bits in reverse order: bit_reverse(1, 3) = 4."""
    return int(format(v, f"0{bits}b")[::-1], 2) if bits else 0


class Fold:
    """p ranks folded onto p' = 2^floor(lg p) virtual ranks, as every rank computes it alike.

    With e = p - p' extra ranks, the first 2e ranks pair up (0,1), (2,3), ...:
    the even one hands its data to the odd one and sits out (vrank None); the
    odd one plays virtual rank rank // 2. Ranks from 2e on play rank - e.
    That costs two extra steps (fold in, fold out) and about 2n bytes.
    """

    def __init__(self, p: int, rank: int, reverse: bool = False):
        self.p = p
        self.p2 = 1 << (p.bit_length() - 1)  # largest power of two <= p
        self.extra = p - self.p2
        self.rank = rank
        self.rounds = self.p2.bit_length() - 1  # lg p'
        self.reverse = reverse
        if rank < 2 * self.extra:
            self.vrank: int | None = rank // 2 if rank % 2 else None
            self.partner = rank + 1 if rank % 2 == 0 else rank - 1
        else:
            self.vrank = rank - self.extra
            self.partner = -1
        if reverse and self.vrank is not None:
            self.vrank = bit_reverse(self.vrank, self.rounds)

    def real(self, v: int) -> int:
        """The original rank that plays virtual rank v.

        reverse (the all-reduces on a group spanning hosts): virtual ranks are
        the bit-reversed ones, so the first, largest halving step (distance p'/2
        in v) pairs neighbouring ranks, inside a host when each host's ranks are
        contiguous, and the last, smallest one crosses hosts. Any relabelling is
        correct for an all-reduce: every rank ends with the whole buffer.
        """
        if self.reverse:
            v = bit_reverse(v, self.rounds)
        return 2 * v + 1 if v < self.extra else v + self.extra

    def lo(self, v: int) -> int:
        """First original rank that virtual rank v stands for (lo(p') = p)."""
        return 2 * v if v < self.extra else v + self.extra

    @property
    def folded(self) -> bool:
        """This rank takes part in the fold (sends in or receives in)."""
        return self.extra > 0 and self.rank < 2 * self.extra

    def steps(self, rounds_per_pass: int) -> int:
        """Sequential steps of an algorithm doing `rounds_per_pass` passes of lg p' rounds."""
        return rounds_per_pass * self.rounds + (2 if self.extra else 0)


@dataclass(frozen=True)
class Step:
    """One round of a doubling schedule from virtual rank v's side.

    peer: the partner's virtual rank; mine / theirs: [first, end) ranges of
    pieces (halving_doubling) or of virtual ranks (doubling_gather) that this
    rank sends and receives in the round.
    """

    peer: int
    mine: tuple[int, int]
    theirs: tuple[int, int]


def halving_doubling(v: int, p2: int) -> tuple[list[Step], list[Step]]:
    """Rabenseifner's schedule for virtual rank v of p2 (a power of two), over p2 pieces.

    Recursive halving (distance p2/2 .. 1): send the half of the current range
    the partner keeps (`mine` = what is given), receive the partner's copy of
    the half this rank keeps (`theirs` = what is kept). After it, v holds
    piece v reduced. Recursive doubling (distance 1 .. p2/2): send every
    piece held (`mine`), receive the partner's (`theirs`).
    """
    halving: list[Step] = []
    lo, hi, d = 0, p2, p2 // 2
    while d >= 1:
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if v & d else ((lo, mid), (mid, hi))
        halving.append(Step(v ^ d, give, keep))
        lo, hi = keep
        d //= 2
    doubling: list[Step] = []
    d = 1
    while d < p2:
        pv = v ^ d
        plo = pv - pv % d
        doubling.append(Step(pv, (lo, hi), (plo, plo + d)))
        lo, hi = min(lo, plo), max(hi, plo + d)
        d *= 2
    return halving, doubling


def doubling_gather(v: int, p2: int) -> list[Step]:
    """Recursive-doubling all-gather for virtual rank v: at distance d, swap aligned runs of d.

    `mine` and `theirs` are ranges of virtual ranks whose blocks are sent and received.
    """
    out: list[Step] = []
    d = 1
    while d < p2:
        base, pv = v - v % d, v ^ d
        pbase = pv - pv % d
        out.append(Step(pv, (base, base + d), (pbase, pbase + d)))
        d *= 2
    return out


# ---------------------------------------------------------------------------
# Binomial trees.
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Shared memory: rounds through a staging area, channel slots.
# ---------------------------------------------------------------------------


def rounds(numel: int, per_round: int) -> list[tuple[int, int]]:
    """[lo, hi) element ranges of the rounds a buffer takes through a staging area of
    `per_round` elements: one round per full area, none for an empty buffer.

    rounds(10, 4) = [(0, 4), (4, 8), (8, 10)].
    """
    per_round = max(1, per_round)
    return [(lo, min(lo + per_round, numel)) for lo in range(0, numel, per_round)]


def shm_slot_bytes(ranks: int, budget: int, slots: int) -> int:
    """Slot size of a shared-memory channel: `budget` bytes shared by the L(L-1) channels of
    `ranks` local ranks, `slots` slots each, as a power of two from 64 KiB to 2 MiB."""
    pairs = max(1, ranks * (ranks - 1))
    per_slot = budget // (pairs * slots)
    size = 64 << 10
    while size * 2 <= min(per_slot, 2 << 20):
        size *= 2
    return size


TABLE_BYTES = 8 * 64  # a table exchange's header: elements per peer (int64), up to 64 local ranks


def table_elems(stage_bytes: int, p: int, itemsize: int) -> int:
    """Elements per peer per round of a shared-memory table exchange (all-to-all, gather,
    scatter): a staging half holds the table, then one piece for each of the p peers."""
    return max(1, (stage_bytes - TABLE_BYTES) // (p * max(1, itemsize)))
# Context parallel: a sequence over p ranks, and the ring that passes its blocks.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceLayout:
    """Which positions of a sequence of `seq_len` tokens each of `parts` ranks holds.

    contiguous (zigzag=False): rank r holds chunk r of split_sizes(seq_len, parts).
    zig-zag (zigzag=True): the sequence is cut into 2*parts chunks and rank r
    holds chunks r and 2*parts-1-r. Under a causal mask a token attends to the
    tokens before it, so early chunks have little work and late chunks much;
    pairing the r-th chunk from the front with the r-th from the back gives
    every rank the same amount (picotron's and Megatron's load balancing).

    Lengths that do not divide evenly follow split_sizes (the first chunks
    one longer); a rank may hold no tokens at all when seq_len < 2 * parts.
    A rank's local tokens are its chunks concatenated, each in position order.
    """

    seq_len: int
    parts: int
    zigzag: bool = True

    def __post_init__(self) -> None:
        if self.parts < 1 or self.seq_len < 0:
            raise ValueError(f"a sequence of {self.seq_len} tokens over {self.parts} ranks")

    def chunks(self, rank: int) -> list[tuple[int, int]]:
        """[start, stop) position ranges of rank's tokens, in local order."""
        if not 0 <= rank < self.parts:
            raise ValueError(f"rank {rank} is not one of {self.parts}")
        if not self.zigzag:
            e = edges(split_sizes(self.seq_len, self.parts))
            return [(e[rank], e[rank + 1])]
        e = edges(split_sizes(self.seq_len, 2 * self.parts))
        back = 2 * self.parts - 1 - rank
        return [(e[rank], e[rank + 1]), (e[back], e[back + 1])]

    def size(self, rank: int) -> int:
        """Tokens rank holds."""
        return sum(b - a for a, b in self.chunks(rank))

    def sizes(self) -> list[int]:
        """Tokens every rank holds, in rank order."""
        return [self.size(r) for r in range(self.parts)]

    def positions(self, rank: int) -> list[int]:
        """Positions of rank's tokens, in local order."""
        return [i for a, b in self.chunks(rank) for i in range(a, b)]


def ring_hop(rank: int, p: int, hop: int) -> tuple[int, int]:
    """(block rank sends to rank+1, block it receives from rank-1) at `hop` of a ring pass.

    Every rank starts holding its own block (block r on rank r) and forwards
    what it holds: at hop h it sends block r-h and receives block r-h-1
    (ring_received's lap that starts on one's own chunk), so after p-1 hops
    every block has visited every rank. Ring attention's forward runs hops
    0..p-2 with the key/value blocks; its backward sends the key/value blocks
    the same way and their gradients one hop behind (hops 1..p-1, the last
    hop bringing each block's gradient home).
    """
    return ring_received(rank, p, hop - 1, 0), ring_received(rank, p, hop, 0)


def visible(q: tuple[int, int], k: tuple[int, int], causal: bool) -> str:
    """'all', 'some' or 'none': which keys of the chunk of positions k ([start, stop)) the
    queries of chunk q may see (ring attention's and Ulysses' blocks, and their cost)."""
    if q[0] == q[1] or k[0] == k[1]:
        return "none"
    if not causal or k[1] - 1 <= q[0]:
        return "all"
    if k[0] > q[1] - 1:
        return "none"
    return "some"


def expert_capacity(capacity_factor: float | None, top_k: int, tokens: int, experts: int) -> int | None:
    """Most assignments one expert accepts from one group of `tokens` tokens (GShard, Switch).

    capacity = ceil(capacity_factor * top_k * tokens / experts): with perfectly
    even routing every expert gets top_k * tokens / experts assignments, and
    the factor is the headroom for uneven routing. None means no limit
    (dropless, as Megatron's default MoE).
    """
    if capacity_factor is None:
        return None
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be positive (or None for no drops), got {capacity_factor}")
    return math.ceil(capacity_factor * top_k * tokens / experts)


# ---------------------------------------------------------------------------
# Blocks of a tensor: what a sharded checkpoint records and reshards.
# ---------------------------------------------------------------------------

Block = tuple[tuple[int, ...], tuple[int, ...]]
"""A box in an n-dimensional tensor: (offsets, lengths), one of each per dimension."""


def shard_block(shape: tuple[int, ...], dim: int | None, sizes: list[int], rank: int) -> Block:
    """The box `rank` holds when `shape` is cut along `dim` into `sizes` (dim None: the whole).

    A column-parallel weight [out, in] over 4 ranks, out = 10: dim 0,
    sizes split_sizes(10, 4) = [3, 3, 2, 2]; rank 2 holds ((6, 0), (2, in)).
    """
    offsets, lengths = [0] * len(shape), list(shape)
    if dim is not None:
        offsets[dim], lengths[dim] = edges(sizes)[rank], sizes[rank]
    return tuple(offsets), tuple(lengths)


def flat_blocks(lo: int, hi: int, lengths: tuple[int, ...]) -> list[Block]:
    """Elements [lo, hi) of a row-major box of `lengths`, as boxes relative to it, in order.

    Each box is a contiguous run of the flat range, so it is also a slice
    of the flattened data: the boxes of [lo, hi) follow one another from lo.
    A ZeRO shard is a flat range; this turns it into boxes that can be
    intersected with another rank's boxes. In 2-D at most three: a partial
    first row, whole rows, a partial last row (in n-D at most 2n - 1).
    """
    if lo >= hi:
        return []
    if not lengths:  # a scalar: one element, the empty box
        return [((), ())]
    inner = math.prod(lengths[1:])
    rest = tuple(lengths[1:])
    zeros = (0,) * len(rest)
    first, r0 = divmod(lo, inner)
    last, r1 = divmod(hi, inner)
    if first == last:  # inside one slice along dim 0
        return [((first, *o), (1, *n)) for o, n in flat_blocks(r0, r1, rest)]
    out: list[Block] = []
    if r0:
        out += [((first, *o), (1, *n)) for o, n in flat_blocks(r0, inner, rest)]
        first += 1
    if last > first:
        out.append(((first, *zeros), (last - first, *rest)))
    if r1:
        out += [((last, *o), (1, *n)) for o, n in flat_blocks(0, r1, rest)]
    return out


def intersect(a: Block, b: Block) -> Block | None:
    """The box where a and b overlap (same tensor coordinates), or None if they do not."""
    offsets, lengths = [], []
    for ao, al, bo, bl in zip(a[0], a[1], b[0], b[1]):
        lo, hi = max(ao, bo), min(ao + al, bo + bl)
        if hi <= lo:
            return None
        offsets.append(lo)
        lengths.append(hi - lo)
    return tuple(offsets), tuple(lengths)
