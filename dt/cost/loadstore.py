"""What the load/store (shared-memory) algorithms move and cost, per rank.

These algorithms (dt.collectives.one_shot, one_shot_copy, two_shot) send no
messages: a rank publishes a buffer and its peers *read* it. dt.traffic()
counts, on the "shm" wire,

- bytes_received / messages_received: what this rank reads from its peers'
  buffers (one "message" per peer buffer read, per round, when non-empty);
- bytes_sent / messages_sent: what its peers read from its buffer;
- steps: synchronisations (every rank waits for every other once per step).

A buffer larger than a staging half (`stage_bytes`; None: unbounded) goes
in rounds, cut by the same dt.layout functions the algorithms use.

Time (the formulas below, each its record's `formula`): steps are priced at the machine's `sync` (one
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

import math

from dt.cost.records import Call, Counts, RankTraffic
from dt.layout import rounds, split_sizes, table_elems

__all__ = ["loadstore_traffic", "one_shot_all_gather", "one_shot_all_reduce", "one_shot_all_to_all",
           "one_shot_barrier", "one_shot_broadcast", "one_shot_gather", "one_shot_reduce",
           "one_shot_reduce_scatter", "two_shot_all_reduce"]


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


def _all_reduce(c: _Count, algorithm: str, n: int, p: int, rank: int, per: int) -> None:
    for lo, hi in rounds(n, per):
        if algorithm == "one_shot":
            c.steps += 1
            for _ in range(p - 1):
                c.peer(hi - lo, hi - lo)
            continue
        c.steps += 2
        sizes = split_sizes(hi - lo, p)
        for j in range(p):
            if j != rank:
                c.peer(sizes[j], sizes[rank])  # reduce: j reads my slice j, I read its slice r
                c.peer(sizes[rank], sizes[j])  # gather: the reduced slices


def _rooted(c: _Count, n: int, p: int, rank: int, root: int, per: int, to_root: bool) -> None:
    """reduce (every rank read by the root) or broadcast (the root read by every rank)."""
    for lo, hi in rounds(n, per):
        c.steps += 1
        k = hi - lo
        if rank == root:
            for _ in range(p - 1):
                c.peer(0, k) if to_root else c.peer(k, 0)
        else:
            c.peer(k, 0) if to_root else c.peer(0, k)


def _blocks(c: _Count, blocks: list[int], rank: int, per: int, reduce: bool) -> None:
    """reduce_scatter (rank r reads block r of everyone) or all_gather (everyone reads r's)."""
    p = len(blocks)
    for lo, hi in rounds(max(blocks), per):
        c.steps += 1
        pieces = [min(hi, s) - min(lo, s) for s in blocks]
        for j in range(p):
            if j != rank:
                c.peer(pieces[j], pieces[rank]) if reduce else c.peer(pieces[rank], pieces[j])


def _exchange(c: _Count, send: list[int], recv: list[int], rank: int, per: int) -> None:
    """all_to_all / gather / scatter: pieces of at most `per` elements per peer per round."""
    c.steps += max(1, math.ceil(max([0] + send + recv) / per))
    for j in range(len(send)):
        if j != rank:
            for lo in range(0, max(send[j], recv[j]), per):
                c.peer(max(0, min(per, send[j] - lo)), max(0, min(per, recv[j] - lo)))


def loadstore_traffic(call: Call) -> RankTraffic:
    """The traffic record of every load/store algorithm: one call's reads, as dt.traffic() counts.

    call.n: the tensor's elements (all_reduce, reduce, broadcast); call.blocks: every rank's
    block (all_gather, reduce_scatter, gather, scatter) or this rank's send blocks
    (all_to_all, with call.recv_numels its receive blocks).
    """
    base, n, blocks, p, rank, root = call.collective, call.n, call.blocks, call.p, call.rank, call.root
    stage_bytes, recv = call.stage_bytes, call.recv_numels
    c = _Count(call.itemsize)
    if p == 1:
        return RankTraffic(0, 0, 0, 0, 0)
    key = (base, call.algorithm)
    most = max([n] + blocks + (recv or []))
    per = _per(stage_bytes, call.itemsize, most)
    if base == "all_reduce" and n:
        _all_reduce(c, call.algorithm, n, p, rank, per)
    elif key == ("reduce", "one_shot") and n:
        _rooted(c, n, p, rank, root, per, to_root=True)
    elif key == ("broadcast", "one_shot") and n:
        _rooted(c, n, p, rank, root, per, to_root=False)
    elif key == ("reduce_scatter", "one_shot") and max(blocks):
        _blocks(c, blocks, rank, max(1, per // p) if stage_bytes else per, reduce=True)
    elif key == ("all_gather", "one_shot") and max(blocks):
        _blocks(c, blocks, rank, per, reduce=False)
    elif base in ("all_to_all", "gather", "scatter"):
        if base == "all_to_all":
            send, got = blocks, call.received_blocks
        elif base == "gather":
            send = [blocks[rank] if j == root else 0 for j in range(p)]
            got = blocks if rank == root else [0] * p
        else:
            send = blocks if rank == root else [0] * p
            got = [blocks[rank] if j == root else 0 for j in range(p)]
        per = table_elems(stage_bytes, p, call.itemsize) if stage_bytes else max(1, most)
        _exchange(c, send, got, rank, per)
    elif key == ("barrier", "one_shot"):
        c.steps = 1
    return RankTraffic(c.sent, c.received, c.msgs_sent, c.msgs_received, c.steps)


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
