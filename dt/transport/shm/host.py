"""One group's segment on one host: its layout, and how the host's ranks come to share it.

    [header: 1 page]
    [rank lines: L x RANK_BYTES]            sync words, descriptors, bells (sync.py)
    [channels: L(L-1) x (page + K x S)]     one per ordered pair (channel.py)
    [staging: L x 2 x capacity]             two halves per rank (board.py)

L is the number of the group's ranks on this host. Sizes: `capacity` per
staging half (DT_SHM_STAGE_BYTES, default 32 MiB: larger messages go in
rounds); the channels share DT_SHM_CHANNEL_BYTES (default CHANNEL_BUDGET,
64 MiB), K = 4 slots each. The
segment is large but costs memory only where touched (tmpfs allocates pages
on first write).

`share(g, topology, name, size)` creates or attaches a segment on every
rank of a host and unlinks its name once all have mapped it (segment.py);
`attach_host` builds the group's engine, wire and board on it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from dt import args
from dt.layout import shm_slot_bytes
from dt.transport.group import Group
from dt.transport.shm.board import Board
from dt.transport.shm.channel import Channel, Engine, channel_bytes
from dt.transport.shm.segment import Segment, segment_name
from dt.transport.shm.sync import RANK_BYTES, Sync
from dt.transport.shm.wire import ShmWire
from dt.transport.topology import Topology, post_and_wait
from dt.transport.wire import RECV, SEND

__all__ = ["CHANNEL_BUDGET", "DEFAULT_STAGE_BYTES", "HostLink", "Layout", "attach_host", "share"]

PAGE = 4096
HEADER = PAGE
SLOTS = 4
CHANNEL_BUDGET = 64 << 20
DEFAULT_STAGE_BYTES = 32 << 20


def _round_up(n: int, to: int = PAGE) -> int:
    return (n + to - 1) // to * to


def stage_bytes() -> int:
    return _round_up(args.env_value("DT_SHM_STAGE_BYTES", DEFAULT_STAGE_BYTES))


def channel_budget() -> int:
    return args.env_value("DT_SHM_CHANNEL_BYTES", CHANNEL_BUDGET)


@dataclass(frozen=True)
class Layout:
    """Where everything sits in a segment for L local ranks."""

    ranks: int
    capacity: int
    budget: int = CHANNEL_BUDGET
    slots: int = SLOTS

    @property
    def slot_bytes(self) -> int:
        return shm_slot_bytes(self.ranks, self.budget, self.slots)

    @property
    def lines(self) -> int:
        return HEADER

    @property
    def channels(self) -> int:
        return self.lines + _round_up(self.ranks * RANK_BYTES)

    def channel(self, src: int, dst: int) -> int:
        index = src * (self.ranks - 1) + (dst if dst < src else dst - 1)
        return self.channels + index * channel_bytes(self.slots, self.slot_bytes)

    @property
    def staging(self) -> int:
        return self.channels + self.ranks * (self.ranks - 1) * channel_bytes(self.slots, self.slot_bytes)

    @property
    def size(self) -> int:
        return self.staging + self.ranks * 2 * self.capacity


def share(g: Group, topo: Topology, what: str, size: int) -> Segment:
    """Create (host leader) or attach (the others) one segment per host; unlink once all have it.

    Collective over the group's ranks on this host, through the torch wire:
    the leader creates and tells each peer, each peer attaches and answers,
    the leader unlinks. Ranks alone on their host get a private mapping.
    """
    local = topo.local
    leader = local[0]
    name = segment_name(topo.pids[leader], topo.token, f"g{g.name}-h{topo.host}-{what}")
    flag = torch.zeros(1, dtype=torch.int64)  # host: shm groups are CPU groups
    if len(local) == 1:
        seg = Segment.create(name, size)
        seg.unlink()
        return seg
    if topo.rank == leader:
        seg = Segment.create(name, size)
        try:
            post_and_wait(g, [(SEND, flag, q) for q in local[1:]], f"sharing segment {name}")
            acks = [torch.zeros(1, dtype=torch.int64) for _ in local[1:]]  # host: CPU groups
            post_and_wait(g, [(RECV, a, q) for a, q in zip(acks, local[1:])], f"sharing segment {name}")
        finally:
            seg.unlink()
        failed = [q for a, q in zip(acks, local[1:]) if int(a)]
        if failed:
            raise RuntimeError(f"ranks {[g.ranks[q] for q in failed]} could not map shared segment {name}")
        return seg
    post_and_wait(g, [(RECV, flag, leader)], f"sharing segment {name}")
    try:
        seg = Segment.attach(name, size)
    except BaseException:
        nack = torch.ones(1, dtype=torch.int64)  # host: CPU groups
        post_and_wait(g, [(SEND, nack, leader)], f"sharing segment {name}")
        raise
    post_and_wait(g, [(SEND, flag, leader)], f"sharing segment {name}")
    return seg


@dataclass
class HostLink:
    """What a rank holds for one group on its host: the segment and what runs on it."""

    segment: Segment
    layout: Layout
    sync: Sync
    engine: Engine
    wire: ShmWire
    board: Board


def attach_host(g: Group, topo: Topology) -> HostLink:
    """Share this host's segment for group `g`; build the engine, wire and board on it."""
    local = topo.local
    me = topo.local_rank
    layout = Layout(len(local), stage_bytes(), channel_budget())
    seg = share(g, topo, "wire", layout.size)
    buf = memoryview(seg.mm)
    address = ctypes.addressof(ctypes.c_char.from_buffer(seg.mm))
    names = [g.ranks[q] for q in local]
    lines = buf[layout.lines:layout.lines + layout.ranks * RANK_BYTES]
    sync = Sync(lines, address + layout.lines, me, names)
    words = buf.cast("q")
    out = {j: Channel(seg.tensor, layout.channel(me, j), layout.slots, layout.slot_bytes)
           for j in range(len(local)) if j != me}
    inn = {j: Channel(seg.tensor, layout.channel(j, me), layout.slots, layout.slot_bytes)
           for j in range(len(local)) if j != me}
    engine = Engine(sync, out, inn, words)
    wire = ShmWire(engine, {g.ranks[q]: i for i, q in enumerate(local)})
    board = Board(seg.tensor, sync, layout.staging, layout.capacity, names, g)
    return HostLink(seg, layout, sync, engine, wire, board)
