"""Sharing one group's segment on one host, and building its wire and board on it.

`share(g, topology, name, size)` creates (the host's leader) or attaches (the others)
one segment on every rank of a host and unlinks its name once all have mapped it
(segment.py); `attach_host` lays the group out on it (host.py's SegmentLayout) and builds
the engine, the wire and the board: the HostLink dt.transport.connect keeps.
"""

from __future__ import annotations

import ctypes

import torch

from dt.transport import settings
from dt.transport.discover import post_and_wait
from dt.transport.group import Group
from dt.transport.shm.board import Board
from dt.transport.shm.channel import Channel, Engine
from dt.transport.shm.host import HostLink, SegmentLayout, channel_budget, stage_bytes
from dt.transport.shm.segment import Segment, segment_name
from dt.transport.shm.sync import RANK_BYTES, Sync
from dt.transport.shm.wire import ShmWire
from dt.transport.topology import Topology
from dt.transport.wire import RECV, SEND

__all__ = ["attach_host", "share"]


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


def attach_host(g: Group, topo: Topology) -> HostLink:
    """Share this host's segment for group `g`; build the engine, wire and board on it."""
    local = topo.local
    me = topo.local_rank
    layout = SegmentLayout(len(local), stage_bytes(), channel_budget())
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
    engine = Engine(sync, out, inn, words, lambda: settings.timeout_for(g))
    wire = ShmWire(engine, {g.ranks[q]: i for i, q in enumerate(local)})
    board = Board(seg.tensor, sync, layout.staging, layout.capacity, names, g)
    return HostLink(seg, layout, sync, engine, wire, board)
