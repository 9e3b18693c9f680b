"""The ring's engine: one pass's schedule, and the two drivers that run it.

`ring_pass` moves p chunks around the ring, lap after lap, reducing on the
first lap if asked (reduce-scatter), storing on the others (all-gather);
all-reduce is one pass of two laps, 2(p-1) steps. dt.collectives.ring shows
the same algorithm first as the textbook loop (`reference_ring_all_reduce`);
this is that loop made fast, in two pieces:

- `RingSchedule`: what happens at each step (which chunk arrives, whether it
  is reduced, where it lands, whether it is forwarded): arithmetic only;
- the drivers that post it: `_drive_ahead` posts receives ahead of need and
  forwards each segment the moment it is reduced (gloo and the shared-memory
  wire, where a receive posted early lets data flow at once); `_drive_stepwise`
  posts each step as one batch (NCCL, where nothing may be posted ahead).

Within a step a chunk is cut into segments (`segment_bytes`): the reduction
of segment j overlaps the arrival of segment j+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dt.collectives.ops import combine, finish
from dt.collectives.scratch import scratch as scratch_buffer
from dt.layout import ring_received
from dt.transport import RECV, SEND, Comm, Handle

__all__ = ["DEFAULT_SEGMENT_BYTES", "RingSchedule", "ring_pass", "segments"]

# Segments no larger than this overlap reduction with transfer. Gloo uses at
# most 1 MiB; here, where every message costs a handshake and a wake-up of
# 100 us to a few ms (more on a loaded machine), 4 MiB measured faster than
# 256 KiB and 1 MiB at 4 and 32 MB, world 2 to 4 (dt bench collectives).
DEFAULT_SEGMENT_BYTES = 4 << 20


def segments(t: torch.Tensor, segment_elems: int) -> list[torch.Tensor]:
    """`t` cut into pieces of at most `segment_elems` (none for an empty t; 0: whole)."""
    if t.numel() == 0:
        return []
    if segment_elems <= 0 or segment_elems >= t.numel():
        return [t]
    return list(t.split(segment_elems))


@dataclass(frozen=True)
class RingSchedule:
    """One rank's steps of a ring pass: `laps` laps of p-1 steps, the first reducing if asked.

    At step s rank r receives chunk (r - s - 1 + first) mod p from the left and
    sends to the right what it received at step s-1 (at step 0: chunk
    (r + first) mod p). first=0 starts each rank on its own chunk (all-gather);
    first=-1 makes it finish the lap on its own chunk (reduce-scatter).
    """

    p: int
    rank: int
    first: int
    laps: int
    reduce: bool

    @property
    def steps(self) -> int:
        return self.laps * (self.p - 1)

    @property
    def reducing(self) -> int:
        """Steps whose arrivals are reduced (the first lap's, with an op)."""
        return self.p - 1 if self.reduce else 0

    def received(self, step: int) -> int:
        """The chunk that arrives at `step` (step -1: the one this rank sends first)."""
        return ring_received(self.rank, self.p, step, self.first)

    def reduces(self, step: int) -> bool:
        return step < self.reducing

    def finishes(self, step: int) -> bool:
        """The lap's last reducing step: AVG divides here, once."""
        return step == self.reducing - 1

    def forwards(self, step: int) -> bool:
        """Whether what arrives at `step` goes on to the right (all but the last step)."""
        return step < self.steps - 1

    def landing_elems(self, chunks: list[torch.Tensor]) -> int:
        """The largest chunk a reducing step receives (its landing buffer's size)."""
        return max((chunks[self.received(s)].numel() for s in range(self.reducing)), default=0)


def ring_pass(
    comm: Comm,
    chunks: list[torch.Tensor],
    *,
    first: int,
    op: str | None = None,
    sources: list[torch.Tensor] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    laps: int = 1,
) -> None:
    """Move every chunk `laps` times (p-1 steps each) around the ring, in place.

    With `op`, the first lap reduces: a received chunk is combined with
    `sources[i]` (default: the chunk itself) into `chunks[i]` (divided by p
    for AVG at the lap's last step), and the first step sends from `sources`,
    so a reduce-scatter can read an input it must not modify. A second lap
    (all-reduce) carries the reduced chunks on round, each segment forwarded
    as soon as it is final.

    Cost: laps * (p-1) steps; bytes sent = the chunks this rank forwards
    (dt.cost.ring_reduce_scatter / ring_all_gather give the exact figure).
    """
    if comm.size == 1 or not chunks:
        return
    schedule = RingSchedule(comm.size, comm.rank, first, laps, op is not None)
    seg = max(1, segment_bytes // chunks[0].element_size()) if segment_bytes else 0
    src = sources if sources is not None else chunks
    drive = _drive_ahead if comm.ahead else _drive_stepwise
    drive(comm, schedule, chunks, src, op, seg)


class _Receives:
    """The pipelined driver's posted receives: reducing steps land in two scratch buffers
    used alternately, the others straight in their chunk; posted in step order (gloo
    matches one peer's receives in posting order)."""

    def __init__(self, comm: Comm, schedule: RingSchedule, chunks: list[torch.Tensor], seg: int):
        self.comm, self.schedule, self.chunks, self.seg = comm, schedule, chunks, seg
        n, like = schedule.landing_elems(chunks), chunks[0]
        self.scratch = [scratch_buffer(n, like.dtype, like.device, slot)
                        for slot in range(min(2, schedule.reducing))]
        self.posted: dict[int, list[tuple[Handle, torch.Tensor]]] = {}
        self.next = 0  # the first step not posted yet

    def post_through(self, last: int) -> None:
        """Post the receives of every step up to `last` (capped at the pass's last step)."""
        s, left = self.schedule, (self.comm.rank - 1) % self.comm.size
        while self.next <= min(last, s.steps - 1):
            step = self.next
            self.comm.step = step
            target = self.chunks[s.received(step)]
            landing = self.scratch[step % 2][:target.numel()] if s.reduces(step) else target
            self.posted[step] = [(self.comm.irecv(x, left), x) for x in segments(landing, self.seg)]
            self.next += 1

    def take(self, step: int) -> list[tuple[Handle, torch.Tensor]]:
        return self.posted.pop(step)


def _drive_ahead(comm: Comm, schedule: RingSchedule, chunks: list[torch.Tensor],
                 src: list[torch.Tensor], op: str | None, seg: int) -> None:
    """Post receives ahead of need; reduce and forward each segment as it lands.

    A reducing step's scratch buffer is free again once it is reduced, so step
    s+2's receive is posted then; once every reducing receive is posted, every
    later one is (they land in their final chunk).
    """
    p, right = schedule.p, (schedule.rank + 1) % schedule.p
    receives = _Receives(comm, schedule, chunks, seg)
    receives.post_through(1 if schedule.reducing else schedule.steps - 1)
    comm.step = 0
    sends = [comm.isend(x, right) for x in segments(src[schedule.received(-1)], seg)]
    for step in range(schedule.steps):
        comm.step = step
        ri = schedule.received(step)
        target, offset = chunks[ri], 0
        for handle, landed in receives.take(step):
            handle.wait()
            k = landed.numel()
            out = target[offset:offset + k]
            if schedule.reduces(step):
                combine(out, src[ri][offset:offset + k], landed, op)  # type: ignore[arg-type]
                if schedule.finishes(step):
                    finish(out, op, p)  # type: ignore[arg-type]
            if schedule.forwards(step):
                sends.append(comm.isend(out, right))  # this segment is final: forward it now
            offset += k
        receives.post_through(step + 2 if step + 2 < schedule.reducing else schedule.steps - 1)
    for h in sends:
        h.wait()


def _drive_stepwise(comm: Comm, schedule: RingSchedule, chunks: list[torch.Tensor],
                    src: list[torch.Tensor], op: str | None, seg: int) -> None:
    """The same schedule as NCCL wants it: each step's sends and receives as one batch.

    Step s sends what step s-1 received (step 0: this rank's first chunk, from
    `src`); nothing is posted ahead, so every rank's operations with each
    neighbour stay in one order on its stream.
    """
    p, r = schedule.p, schedule.rank
    right, left = (r + 1) % p, (r - 1) % p
    landing = None
    if schedule.reducing:
        landing = scratch_buffer(schedule.landing_elems(chunks), chunks[0].dtype, chunks[0].device, 0)
    outgoing = src[schedule.received(-1)]
    for step in range(schedule.steps):
        comm.step = step
        ri = schedule.received(step)
        target = chunks[ri]
        into = landing[:target.numel()] if schedule.reduces(step) else target  # type: ignore[index]
        ops = [(RECV, x, left) for x in segments(into, seg)]
        ops += [(SEND, x, right) for x in segments(outgoing.reshape(-1), seg)]
        for h in comm.batch(ops):
            h.wait()
        if schedule.reduces(step):
            combine(target, src[ri], into, op)  # type: ignore[arg-type]
            if schedule.finishes(step):
                finish(target, op, p)  # type: ignore[arg-type]
        outgoing = target
