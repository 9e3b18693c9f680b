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

`HostLink` is what a rank holds for one group on its host. dt.transport.shm.attach
makes it: `share` creates or attaches the segment on every rank of the host (and
unlinks its name once all have mapped it: segment.py), `attach_host` builds the
group's engine, wire and board on it. This file knows no Group, so a group's links
(dt.transport.group) can name HostLink's type without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt import args
from dt.layout import shm_slot_bytes
from dt.transport.shm.board import Board
from dt.transport.shm.channel import Engine, channel_bytes
from dt.transport.shm.segment import Segment
from dt.transport.shm.sync import RANK_BYTES, Sync
from dt.transport.shm.wire import ShmWire

__all__ = ["CHANNEL_BUDGET", "DEFAULT_STAGE_BYTES", "HostLink", "SegmentLayout", "channel_budget",
           "stage_bytes"]

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
class SegmentLayout:
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


@dataclass
class HostLink:
    """What a rank holds for one group on its host: the segment and what runs on it."""

    segment: Segment
    layout: SegmentLayout
    sync: Sync
    engine: Engine
    wire: ShmWire
    board: Board
