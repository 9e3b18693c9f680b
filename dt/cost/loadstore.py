"""What the load/store (shared-memory) algorithms move and cost, per rank.

These algorithms (dt.collectives.one_shot, one_shot_copy, two_shot) send no
messages: a rank publishes a buffer and its peers *read* it. dt.traffic()
counts, on the "shm" wire,

- bytes_received / messages_received: what this rank reads from its peers'
  buffers (one "message" per peer buffer read, per round, when non-empty);
- bytes_sent / messages_sent: what its peers read from its buffer;
- steps: synchronisations (every rank waits for every other once per step).

A buffer larger than a staging half (`stage_bytes`; None: unbounded) goes
in rounds, cut by the same dt.layout functions the algorithms use. Each
algorithm's record (beside it in dt/collectives/) names its `*_traffic`
function here and its formula (named after the algorithm).

Time (the formulas): steps are priced at the machine's `sync` (one
shared-memory synchronisation), bytes at `mem` (seconds per byte of memcpy:
the physical bound), reduced bytes at gamma. The bytes are what a rank
moves on its critical path: its copy into staging (a user tensor is copied
in once), every byte it reads from its peers' buffers (the ones it reduces
too: a load costs a memcpy's byte whatever is done with it, so one-shot's
(p-1) n reads are never free), the copy-out. gamma is then only the
arithmetic of the reduction. The staged path is priced: every rank must
agree on the algorithm, and only the caller knows whether its own tensor
lives in a shared allocation (zero-copy saves the copy-in and adds one sync).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from dt.cost.records import LOADSTORE, Call, Counts, RankTraffic
from dt.layout import rounds, split_sizes, table_elems

__all__ = ["LOADSTORE", "one_shot_all_gather", "one_shot_all_gather_traffic", "one_shot_all_reduce",
           "one_shot_all_reduce_traffic", "one_shot_all_to_all", "one_shot_all_to_all_traffic",
           "one_shot_barrier", "one_shot_barrier_traffic", "one_shot_broadcast", "one_shot_broadcast_traffic",
           "one_shot_gather", "one_shot_gather_traffic", "one_shot_reduce", "one_shot_reduce_scatter",
           "one_shot_reduce_scatter_traffic", "one_shot_reduce_traffic", "one_shot_scatter_traffic",
           "two_shot_all_reduce", "two_shot_all_reduce_traffic", "all_reduce_memory_floor",
           "best_busbw_of_memcpy", "two_shot_memory_traffic"]


class _Count:
    def __init__(self, itemsize: int):
        self.isz = itemsize
        self.sent = self.received = self.msgs_sent = self.msgs_received = self.steps = 0

    def peer(self, sent: int, received: int) -> None:
        """One peer buffer read each way, in elements (empty reads are not messages)."""
        if sent:
            self.sent += sent * self.isz
            self.msgs_sent += 1
        if received:
            self.received += received * self.isz
            self.msgs_received += 1


def _per(stage_bytes: int | None, itemsize: int, numel: int) -> int:
    """Elements per round: a staging half's worth (or everything, unbounded)."""
    return stage_bytes // itemsize if stage_bytes else max(1, numel)


def _counted(count: Callable[[_Count, Call, int], None]) -> Callable[[Call], RankTraffic]:
    """A record's traffic from the count of its reads: nothing on one rank; `per` (the third
    argument) is the elements of one round, a staging half's worth or the largest buffer."""

    @functools.wraps(count)
    def traffic(call: Call) -> RankTraffic:
        c = _Count(call.itemsize)
        if call.p > 1:
            most = max([call.n] + call.blocks + (call.recv_numels or []))
            count(c, call, _per(call.stage_bytes, call.itemsize, most))
        return RankTraffic(c.sent, c.received, c.msgs_sent, c.msgs_received, c.steps)

    return traffic


# The `traffic=` of each load/store algorithm's record. call.n: the tensor's elements
# (all_reduce, reduce, broadcast); call.blocks: every rank's block (all_gather,
# reduce_scatter, gather, scatter) or this rank's send blocks (all_to_all, with
# call.recv_numels its receive blocks).

@_counted
def one_shot_all_reduce_traffic(c: _Count, call: Call, per: int) -> None:
    """Each round: one sync, then every peer's whole round read and reduced."""
    for lo, hi in rounds(call.n, per):
        c.steps += 1
        for _ in range(call.p - 1):
            c.peer(hi - lo, hi - lo)


@_counted
def two_shot_all_reduce_traffic(c: _Count, call: Call, per: int) -> None:
    """Each round: two syncs; rank r reduces slice r of every peer, then reads the reduced slices."""
    p, rank = call.p, call.rank
    for lo, hi in rounds(call.n, per):
        c.steps += 2
        sizes = split_sizes(hi - lo, p)
        for j in range(p):
            if j != rank:
                c.peer(sizes[j], sizes[rank])  # reduce: j reads my slice j, I read its slice r
                c.peer(sizes[rank], sizes[j])  # gather: the reduced slices


def _rooted(c: _Count, call: Call, per: int, to_root: bool) -> None:
    """reduce (every rank read by the root) or broadcast (the root read by every rank)."""
    for lo, hi in rounds(call.n, per):
        c.steps += 1
        k = hi - lo
        if call.rank == call.root:
            for _ in range(call.p - 1):
                c.peer(0, k) if to_root else c.peer(k, 0)
        else:
            c.peer(k, 0) if to_root else c.peer(0, k)


@_counted
def one_shot_reduce_traffic(c: _Count, call: Call, per: int) -> None:
    _rooted(c, call, per, to_root=True)


@_counted
def one_shot_broadcast_traffic(c: _Count, call: Call, per: int) -> None:
    _rooted(c, call, per, to_root=False)


def _blocks(c: _Count, blocks: list[int], rank: int, per: int, reduce: bool) -> None:
    """reduce_scatter (rank r reads block r of everyone) or all_gather (everyone reads r's)."""
    p = len(blocks)
    for lo, hi in rounds(max(blocks), per):
        c.steps += 1
        pieces = [min(hi, s) - min(lo, s) for s in blocks]
        for j in range(p):
            if j != rank:
                c.peer(pieces[j], pieces[rank]) if reduce else c.peer(pieces[rank], pieces[j])


@_counted
def one_shot_reduce_scatter_traffic(c: _Count, call: Call, per: int) -> None:
    # each round stages every rank's piece of all p blocks: a p-th of a half per block
    _blocks(c, call.blocks, call.rank, max(1, per // call.p) if call.stage_bytes else per, reduce=True)


@_counted
def one_shot_all_gather_traffic(c: _Count, call: Call, per: int) -> None:
    _blocks(c, call.blocks, call.rank, per, reduce=False)


def _exchange(c: _Count, call: Call, send: list[int], recv: list[int]) -> None:
    """all_to_all / gather / scatter: pieces of at most a table's share per peer per round."""
    most = max([call.n] + call.blocks + (call.recv_numels or []))
    per = table_elems(call.stage_bytes, call.p, call.itemsize) if call.stage_bytes else max(1, most)
    c.steps += max(1, math.ceil(max([0] + send + recv) / per))
    for j in range(len(send)):
        if j != call.rank:
            for lo in range(0, max(send[j], recv[j]), per):
                c.peer(max(0, min(per, send[j] - lo)), max(0, min(per, recv[j] - lo)))


@_counted
def one_shot_all_to_all_traffic(c: _Count, call: Call, per: int) -> None:
    _exchange(c, call, call.blocks, call.received_blocks)


@_counted
def one_shot_gather_traffic(c: _Count, call: Call, per: int) -> None:
    p, rank, root, blocks = call.p, call.rank, call.root, call.blocks
    _exchange(c, call, [blocks[rank] if j == root else 0 for j in range(p)],
              blocks if rank == root else [0] * p)


@_counted
def one_shot_scatter_traffic(c: _Count, call: Call, per: int) -> None:
    p, rank, root, blocks = call.p, call.rank, call.root, call.blocks
    _exchange(c, call, blocks if rank == root else [0] * p,
              [blocks[rank] if j == root else 0 for j in range(p)])


@_counted
def one_shot_barrier_traffic(c: _Count, call: Call, per: int) -> None:
    c.steps = 1


def _staged(syncs: int, copied: float, reduced: float, n: float, stage_bytes: int | None) -> Counts:
    """(syncs, bytes moved on the critical path, bytes reduced) of one call: syncs times the
    rounds when n exceeds a staging half.

    Bytes moved = bytes copied (into staging, out of a peer's) + bytes read from
    peers to reduce them (the reduced column: every reduced byte is loaded from
    a peer's buffer). For n bytes on p ranks, the formulas below:

                                 syncs  copied                       read and reduced
        all_reduce one_shot      1      n (copy in)                  (p-1) n
        all_reduce two_shot      2      (2p-1)/p n (in, own, out)    (p-1)/p n
        reduce one_shot          1      n                            (p-1) n
        reduce_scatter one_shot  1      n (copy in)                  (p-1)/p n
        all_gather one_shot      1      (p+1)/p n (in + all out)
        broadcast one_shot       1      2n (root's copy in, a copy out)
        all_to_all one_shot      1      (2p-1)/p n
        gather / scatter         1      n
        barrier one_shot         1      0

    so one-shot all-reduce moves p n bytes (n in, (p-1) n read), two-shot
    (3p-2)/p n.
    """
    if stage_bytes and n > stage_bytes:
        syncs *= math.ceil(n / stage_bytes)
    return syncs, copied + reduced, reduced


# The formula of each load/store algorithm's record: (n, p, segment_bytes, stage_bytes).

def one_shot_all_reduce(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    return _staged(1, n, (p - 1) * n, n, stage)


def two_shot_all_reduce(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    share = (p - 1) / p * n
    return _staged(2, share + n / p + share, share, n, stage)


def all_reduce_memory_floor(p: int, zero_copy: bool = False) -> float:
    """The least memory traffic (bytes read + bytes written, in units of the message n) one rank's
    all-reduce needs on shared memory, each byte counted once per pass (no cache reuse assumed).

    A plain (private) tensor: read it once (n); write the (p-1)/p that peers reduce into
    shared memory (a peer cannot load a private page); read the peers' (p-1)/p of its own
    slice; write its reduced 1/p twice, into its output and into shared memory for the peers;
    read the peers' reduced (p-1)/p and write it into the output. Reads n (1 + 2(p-1)/p),
    writes 2n: 4n at p = 2, 4.5n at p = 4. A tensor of dt.shm_empty's (zero_copy): read the p
    slices of its own part (n), write the reduced slice in place (n/p), read and write the
    peers' reduced (p-1)/p: 2.5n at p = 2."""
    share = (p - 1) / p
    if zero_copy:
        return 1 + 1 / p + 2 * share
    return 1 + 2 * share + 2


def two_shot_memory_traffic(p: int) -> float:
    """What the staged two-shot (dt.collectives.two_shot) moves per rank, in units of n:
    staging (p = 2: the peer's half, read and written; p > 2: all of it, one strided
    reduction then), the reduction (its inputs read, its slice written), the reduced slice
    copied into staging (read + write: 2/p, where the floor writes it once), the gather
    (read + write). 4.5n at p = 2, 5.25n at p = 4."""
    share = (p - 1) / p
    staged = 2 * share if p == 2 else 2.0
    reduced = (2 / p if p == 2 else 1.0) + 1 / p
    return staged + reduced + 2 / p + 2 * share


def best_busbw_of_memcpy(p: int, traffic: float) -> float:
    """busbw / memcpy bandwidth when an all-reduce moves `traffic` n bytes per rank at memcpy's
    bytes per second: memcpy moves 2n (read + write) and busbw is n/t * 2(p-1)/p."""
    return 2 * (2 * (p - 1) / p) / traffic


def one_shot_reduce(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    return _staged(1, n, (p - 1) * n, n, stage)


def one_shot_reduce_scatter(n: float, p: int, _segment: int | None = None,
                            stage: int | None = None) -> Counts:
    return _staged(1, n, (p - 1) / p * n, n, stage)


def one_shot_all_gather(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    return _staged(1, n / p + n, 0.0, n, stage)


def one_shot_broadcast(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    return _staged(1, 2 * n, 0.0, n, stage)


def one_shot_all_to_all(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    return _staged(1, n / p + 2 * (p - 1) / p * n, 0.0, n, stage)


def one_shot_gather(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    """Gather or scatter by loads: n through the root's staging."""
    return _staged(1, n, 0.0, n, stage)


def one_shot_barrier(n: float, p: int, _segment: int | None = None, stage: int | None = None) -> Counts:
    return _staged(1, 0.0, 0.0, n, stage)
