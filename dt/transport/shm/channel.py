"""Point-to-point through shared memory: one channel per ordered pair, a progress engine per rank.

A channel carries one direction between two local ranks: K slots of S
bytes, a `sent` count (written by the sender) and a `taken` count (written
by the receiver). A message is cut into chunks of at most S bytes, at least
one (an empty message still takes a slot: a barrier's token); chunk c goes
to slot c mod K, and the sender may run at most K chunks ahead of the
receiver. Each slot's header holds the whole message's length, so a receive
whose size differs from its send fails with both sizes instead of
desynchronising the stream.

    layout of a channel: [sent | taken | K slot headers] (one page) [slot 0] ... [slot K-1]

Messages between two ranks match in posting order, as on gloo. Nothing
moves by itself: every rank's `Engine` keeps its pending sends and receives
per peer and advances all of them (as far as the slots allow) whenever the
rank posts or waits on anything. So a receive may be posted long before its
send, and a send of any size posted ahead of everything: whichever rank
waits drives every pending transfer, its own and the ones its peers wait on.

Cost: each byte is copied twice (into the slot, out of it), against a
socket's two copies through the kernel but without a system call per
message; the sender rings the receiver's bell only when it sleeps, the receiver rings the
sender's only when it sleeps having filled the channel (it waits for slots).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from datetime import timedelta

import torch

from dt.transport.shm.sync import PeerGone, Sync

__all__ = ["CTRL_BYTES", "Channel", "Engine", "ShmWork", "channel_bytes"]

CTRL_BYTES = 4096  # sent, taken, slot headers: one page, so the slots start page-aligned


def channel_bytes(slots: int, slot_bytes: int) -> int:
    return CTRL_BYTES + slots * slot_bytes


class Channel:
    """One direction between two local ranks, at `offset` in the segment."""

    def __init__(self, seg: torch.Tensor, offset: int, slots: int, slot_bytes: int):
        assert offset % 64 == 0 and slots * 8 <= CTRL_BYTES - 128
        self.k, self.s = slots, slot_bytes
        self.sent_i = offset // 8
        self.taken_i = offset // 8 + 8
        self.head_i = offset // 8 + 16
        data = offset + CTRL_BYTES
        self.slots = [seg[data + i * slot_bytes: data + (i + 1) * slot_bytes] for i in range(slots)]
        self.mine = 0  # this rank's own count (sent, or taken): it is the only writer


class _Op:
    __slots__ = ("data", "nbytes", "pos", "done", "error", "back", "peer")

    def __init__(self, data: torch.Tensor, peer: int,
                 back: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.data, self.nbytes, self.pos = data, data.numel(), 0
        self.done, self.error, self.back, self.peer = False, None, back, peer


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class ShmWork:
    """One posted send or receive: wait(timedelta) / is_completed(), as torch's Work."""

    __slots__ = ("engine", "op", "kind")

    def __init__(self, engine: Engine, op: _Op, kind: str):
        self.engine, self.op, self.kind = engine, op, kind

    def is_completed(self) -> bool:
        if not self.op.done:
            self.engine.progress()
        return self.op.done

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.engine.wait(self, None if timeout is None else timeout.total_seconds())
        return True


class Engine:
    """This rank's pending point-to-point operations over its channels, and their progress."""

    def __init__(self, sync: Sync, out: dict[int, Channel], inn: dict[int, Channel],
                 words: memoryview, timeout: Callable[[], float]):
        self.sync, self.out, self.inn, self.words = sync, out, inn, words
        self.timeout = timeout  # a wait given none: its group's (settings.timeout_for)
        self.sends: dict[int, deque[_Op]] = {j: deque() for j in out}
        self.recvs: dict[int, deque[_Op]] = {j: deque() for j in inn}
        self.lock = threading.RLock()
        self.broken: str | None = None

    @property
    def pending(self) -> bool:
        return any(self.sends.values()) or any(self.recvs.values())

    def post(self, kind: str, tensor: torch.Tensor, peer: int) -> ShmWork:
        if self.broken:
            raise PeerGone(f"the shared-memory wire is unusable after an earlier error: {self.broken}")
        if kind == "send":
            src = tensor if tensor.is_contiguous() else tensor.contiguous()
            op = _Op(_bytes(src), peer)
            queue = self.sends[peer]
        else:
            # A strided receive lands in a contiguous buffer and is copied back when complete.
            landing = tensor
            if not tensor.is_contiguous():
                landing = torch.empty(tensor.shape, dtype=tensor.dtype)  # host: shm carries CPU tensors
            op = _Op(_bytes(landing), peer, None if landing is tensor else (tensor, landing))
            queue = self.recvs[peer]
        with self.lock:
            queue.append(op)
            self.progress()
        return ShmWork(self, op, kind)

    # -- progress -------------------------------------------------------------
    def progress(self) -> bool:
        """Move every pending transfer as far as the slots allow; True if anything moved."""
        moved = False
        with self.lock:
            for j, q in self.recvs.items():
                if q and self._receive(j, q):
                    moved = True
            for j, q in self.sends.items():
                if q and self._send(j, q):
                    moved = True
        return moved

    def _send(self, j: int, q: deque[_Op]) -> bool:
        ch, words = self.out[j], self.words
        sent, taken = ch.mine, words[ch.taken_i]
        start = sent
        while q and sent - taken < ch.k:
            op = q[0]
            slot = sent % ch.k
            n = min(ch.s, op.nbytes - op.pos)
            if n:
                ch.slots[slot][:n].copy_(op.data[op.pos:op.pos + n])
            words[ch.head_i + slot] = op.nbytes
            op.pos += n
            sent += 1
            if op.pos >= op.nbytes:
                op.done = True
                q.popleft()
        if sent == start:
            return False
        words[ch.sent_i] = ch.mine = sent  # after the data: x86 keeps the order
        self.sync.ring(j)
        return True

    def _receive(self, j: int, q: deque[_Op]) -> bool:
        ch, words = self.inn[j], self.words
        taken, sent = ch.mine, words[ch.sent_i]
        start = taken
        while q and taken < sent:
            op = q[0]
            slot = taken % ch.k
            if op.pos == 0 and words[ch.head_i + slot] != op.nbytes:
                msg = (f"rank {self.sync.names[j]} sent a message of {words[ch.head_i + slot]} bytes "
                       f"where this receive expects {op.nbytes}")
                self.break_(msg)
                op.error = msg
                q.popleft()
                break
            n = min(ch.s, op.nbytes - op.pos)
            if n:
                op.data[op.pos:op.pos + n].copy_(ch.slots[slot][:n])
            op.pos += n
            taken += 1
            if op.pos >= op.nbytes:
                if op.back is not None:
                    op.back[0].copy_(op.back[1])
                op.done = True
                q.popleft()
        if taken == start:
            return False
        words[ch.taken_i] = ch.mine = taken
        # Only a sender that found the channel full waits for these slots: ring it then, and
        # not otherwise (a barrier's token would wake a peer already asleep in its next call,
        # for nothing). `sent` is read again after `taken` is written: a sender that filled the
        # channel after the first read is seen here, or sees this `taken` when it checks.
        if words[ch.sent_i] - start >= ch.k:
            self.sync.ring(j)
        return True

    # -- waiting --------------------------------------------------------------
    def blockers(self) -> list[int]:
        return [j for j, q in self.sends.items() if q] + [j for j, q in self.recvs.items() if q]

    def wait(self, work: ShmWork, timeout: float | None) -> None:
        op = work.op
        if not op.done and op.error is None:
            self.progress()
        if not op.done and op.error is None:
            name = self.sync.names[op.peer]
            try:
                self.sync.wait(lambda: op.done or op.error is not None, self.blockers,
                               lambda: f"a {work.kind} of {op.nbytes} bytes with rank {name}",
                               progress=self.progress,
                               timeout=self.timeout if timeout is None else timeout)
            except Exception as exc:  # dead or failed peer, timeout: peers waiting on us stop too
                self.break_(str(exc))
                raise
        if op.error is not None:
            raise PeerGone(op.error)

    def break_(self, why: str) -> None:
        """Give up on this wire: peers waiting on this rank are told at once."""
        if self.broken is None:
            self.broken = why
            self.sync.fail()
