"""The collective side of shared memory: every rank publishes a buffer, every rank reads its peers'.

Load/store algorithms (dt.collectives.one_shot, two_shot) run in *rounds*.
In a round each rank publishes one region of bytes, either

- a copy in its *staging* area (two halves per rank, `capacity` bytes each,
  used alternately round by round: double buffering), or
- the caller's own tensor, when it lives in one of the group's shared
  allocations (dt.shm_empty): zero-copy, peers read it where it is,

by writing a descriptor (where, offset, bytes, more) in its line of words;
then it synchronises (sync.Sync) and reads what it needs of its peers'
regions through their descriptors. Descriptors are double-buffered too.

Why two halves suffice: round k+2 reuses round k's half, and a rank reaches
round k+2's writes only after round k+1's first synchronisation, which no
peer passes before it has finished reading round k. So a staged round needs
no closing synchronisation; DeepSpeed's shared-memory all-reduce uses the
same trick. A zero-copy round does: the caller may overwrite its tensor as
soon as the call returns, so the algorithm ends with one more sync when any
rank published in place (`BoardCall.zero_copy`, `BoardCall.finish`).

Uniform layouts (every rank staged, or every rank in the same allocation at
the same offset) give `rows()`: one strided (p, n) view of all ranks'
regions, which a single reduction kernel reads in one pass.

Copies into and out of staging (the planned calls' copy-in, published
slice and gather: contiguous CPU spans of one dtype) are one `memmove` (glibc's, through ctypes:
no Python frame, the GIL released) on addresses the plan computed, where torch runs one intra-op
thread (torch.get_num_threads() == 1): it took 0.6-0.8x the CPU time of torch's own copy loop on
this machine (16 MiB: 2.5 against 3.1 ms per copy inside a world-2 two-shot all-reduce, both
ranks copying at once; 1 MiB alone: 63 against 100 us), and skips building a slice per copy.
With more threads torch splits a large copy across them, which memmove cannot: `copy_` there.
"""

from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass

import torch

from dt.transport import accounting, liveness, settings
from dt.transport.errors import CollectiveError, CollectiveTimeout
from dt.transport.shm.sync import DESC, WORDS, PeerGone, PeerTimeout, Sync

__all__ = ["Allocation", "Board", "Round", "memmove"]

_STAGED = 0  # descriptor "where": 0 = staging area, k + 1 = allocation k
memmove = ctypes.memmove  # the planned copies' (above)


@dataclass
class Allocation:
    """A shared allocation (dt.shm_empty): every local rank's part, `stride` bytes apart."""

    index: int
    base: torch.Tensor  # uint8 over the whole allocation (all ranks' parts)
    part: int  # bytes per rank
    stride: int
    mine: tuple[int, int]  # [start, end) address of this rank's part


class Board:
    """A single-host group's staging areas, descriptors and syncs, from one rank's view."""

    def __init__(self, seg: torch.Tensor, sync: Sync, stage_offset: int, capacity: int,
                 names: list[int], group: object = None):
        self.seg, self.sync, self.group = seg, sync, group
        self.p, self.me = sync.n, sync.me
        self.stage_offset, self.capacity = stage_offset, capacity
        self.names = names
        self._staging = [[seg[stage_offset + (2 * j + q) * capacity:
                              stage_offset + (2 * j + q + 1) * capacity] for q in (0, 1)]
                         for j in range(self.p)]  # views made once: a call slices, not builds
        self.rounds = 0
        self.allocations: list[Allocation] = []
        self._starts: list[int] = []  # this rank's part of each allocation, by address
        self._sorted: list[Allocation] = []
        self.broken: str | None = None
        # Each rank's descriptor "where" word, per parity (a fast path's all_staged reads them).
        self._where = [[j * WORDS + DESC + 4 * q for j in range(self.p)] for q in (0, 1)]

    # -- staging and allocations ------------------------------------------------
    def staging(self, rank: int, parity: int) -> torch.Tensor:
        return self._staging[rank][parity]

    def add_allocation(self, base: torch.Tensor, part: int) -> Allocation:
        start = base.data_ptr() + self.me * part
        a = Allocation(len(self.allocations), base, part, part, (start, start + part))
        self.allocations.append(a)
        i = bisect.bisect(self._starts, start)
        self._starts.insert(i, start)
        self._sorted.insert(i, a)
        return a

    def find(self, t: torch.Tensor) -> tuple[int, int] | None:
        """(allocation, byte offset in this rank's part) if `t` lives in one of ours, else None."""
        if not self.allocations or not t.is_contiguous() or t.device.type != "cpu":
            return None
        ptr = t.data_ptr()
        i = bisect.bisect(self._starts, ptr) - 1
        if i < 0:
            return None
        a = self._sorted[i]
        lo, hi = a.mine
        if ptr + t.numel() * t.element_size() <= hi:
            return a.index, ptr - lo
        return None

    def publish_staged(self, nbytes: int) -> int:
        """Start a round whose first `nbytes` of staging this rank fills (the fast path's
        publish: the same round count and descriptor a `Round` writes); return its parity."""
        self.rounds += 1
        parity = self.rounds % 2
        words, i = self.sync.words, self.me * WORDS + DESC + 4 * parity
        words[i], words[i + 1], words[i + 2], words[i + 3] = _STAGED, 0, nbytes, 0
        return parity

    def all_staged(self, parity: int) -> bool:
        """Whether every rank published its staging area (not a shared allocation) this round."""
        words = self.sync.words
        for i in self._where[parity]:
            if words[i]:
                return False
        return True

    def staged_rows(self, parity: int, dtype: torch.dtype, lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) of every rank's staging half `parity`: one strided (p, hi - lo) view."""
        first = self._staging[0][parity].view(dtype)
        return first.as_strided((self.p, hi - lo), (2 * self.capacity // first.element_size(), 1),
                                first.storage_offset() + lo)

    def call(self, collective: str, algorithm: str) -> BoardCall:
        if self.broken:
            raise CollectiveError(f"{collective}[{algorithm}]: the group's shared-memory wire is "
                                  f"unusable after an earlier error ({self.broken})")
        return BoardCall(self, collective, algorithm)


class BoardCall:
    """One collective call on the board: its rounds, syncs and accounting."""

    def __init__(self, board: Board, collective: str, algorithm: str):
        self.board, self.collective, self.algorithm = board, collective, algorithm
        self.charge = accounting.label(collective, algorithm)
        self.syncs = 0
        self.zero_copy = False  # did any rank publish in place in any round

    def round(self) -> Round:
        b = self.board
        b.rounds += 1
        return Round(self, b.rounds % 2)

    # -- synchronisation, with errors that say where ---------------------------
    def where(self) -> str:
        b = self.board
        return (f"rank {b.names[b.me]} (group rank {b.me} of {b.p}) in "
                f"{self.collective}[{self.algorithm}] at sync {self.syncs}")

    def _failed(self, exc: BaseException) -> None:
        """Turn a failed wait into the CollectiveError every rank's peers hear of."""
        b = self.board
        me = b.names[b.me]
        if isinstance(exc, PeerTimeout):
            self._break(exc)
            behind = [q for q in b.names if q != me]
            liveness.announce(liveness.Failure(me, "timeout", f"rank {me} in "
                                               f"{self.collective}[{self.algorithm}]: {exc}",
                                               behind[0] if len(behind) == 1 else liveness.EVERYONE))
            raise CollectiveTimeout(f"{self.where()}: {exc}; a peer is "
                                    f"stuck elsewhere or never called {self.collective}") from None
        late = b.sync.waiting_on()
        self._break(exc)
        failure = exc.failure if isinstance(exc, liveness.PeerFailed) else None
        text = failure.text if failure is not None else str(exc)
        if failure is not None and failure.is_timeout:  # the run's deadline (or a peer's timeout)
            who = ", ".join(f"rank {r}" for r in late)
            raise CollectiveTimeout(f"{self.where()}: waiting on {who}: {text}") from None
        liveness.announce(liveness.Failure(
            me, "gave up", f"rank {me} gave up in {self.collective}[{self.algorithm}] because "
            f"{text}", failure.rank if failure is not None else liveness.EVERYONE))
        raise CollectiveError(f"{self.where()}: {text}") from None

    def _break(self, exc: BaseException) -> None:
        b = self.board
        if b.broken is None:
            b.broken = f"{self.where()}: {exc}"
            b.sync.fail()

    def _timeout(self) -> float:
        return settings.timeout_for(self.board.group)

    def sync(self) -> None:
        """Arrive and wait for every rank of the group (its timeout: settings.timeout_for,
        asked only if the wait comes to sleeping)."""
        self.syncs += 1
        try:
            self.board.sync.sync(self.where, self._timeout)
        except (PeerTimeout, PeerGone, liveness.PeerFailed) as exc:
            self._failed(exc)

    def arrive(self) -> None:
        """Arrive without waiting (a rank that needs nothing more from this sync)."""
        self.syncs += 1
        self.board.sync.arrive()

    def finish(self) -> None:
        """The closing sync a zero-copy call needs: only ranks whose tensor peers read wait."""
        if self.zero_copy:
            self.sync()

    def count(self, peer: int, sent: int, received: int) -> None:
        """dt.traffic(): bytes peer reads from this rank (sent) and this rank from peer."""
        if sent:
            accounting.account(*self.charge, sent=sent, received=-1, wire="shm")
        if received:
            accounting.account(*self.charge, sent=-1, received=received, wire="shm")


class Round:
    """One round of a call: publish, sync, read."""

    def __init__(self, call: BoardCall, parity: int):
        self.call, self.parity = call, parity
        self.board = call.board

    def staging(self) -> torch.Tensor:
        """This rank's staging half for this round (uint8, `capacity` bytes)."""
        return self.board.staging(self.board.me, self.parity)

    def _desc(self, rank: int) -> int:
        return rank * WORDS + DESC + 4 * self.parity

    def publish(self, tensor: torch.Tensor | None = None, nbytes: int = 0, more: int = 0,
                in_place: bool = True) -> bool:
        """Publish `tensor` (in place if it lives in a shared allocation and `in_place`, else
        copied into staging) or, with tensor None, the first `nbytes` of staging the caller
        filled. `more`: this rank has data for another round. True when published in place."""
        b = self.board
        where, offset = _STAGED, 0
        if tensor is not None:
            nbytes = tensor.numel() * tensor.element_size()
            found = b.find(tensor) if in_place else None
            if found is not None:
                where, offset = found[0] + 1, found[1]
            elif nbytes:
                self.staging()[:nbytes].copy_(tensor.reshape(-1).view(torch.uint8))
        words, i = b.sync.words, self._desc(b.me)
        words[i], words[i + 1], words[i + 2], words[i + 3] = where, offset, nbytes, more
        return where != _STAGED

    def sync(self) -> None:
        self.call.sync()
        if not self.call.zero_copy:
            words = self.board.sync.words
            self.call.zero_copy = any(words[self._desc(j)] != _STAGED for j in range(self.board.p))

    def in_place(self, rank: int) -> bool:
        return self.board.sync.words[self._desc(rank)] != _STAGED

    def any_more(self) -> bool:
        """Whether any rank announced data for another round."""
        return any(self.more(j) for j in range(self.board.p))

    def more(self, rank: int) -> int:
        return self.board.sync.words[self._desc(rank) + 3]

    def nbytes(self, rank: int) -> int:
        return self.board.sync.words[self._desc(rank) + 2]

    def region(self, rank: int) -> torch.Tensor:
        """Rank `rank`'s published bytes this round (uint8)."""
        b = self.board
        words, i = b.sync.words, self._desc(rank)
        where, offset, nbytes = words[i], words[i + 1], words[i + 2]
        if where == _STAGED:
            return b.staging(rank, self.parity)[:nbytes]
        a = b.allocations[where - 1]
        start = rank * a.stride + offset
        return a.base[start:start + nbytes]

    def view(self, rank: int, dtype: torch.dtype) -> torch.Tensor:
        return self.region(rank).view(dtype)

    def rows(self, dtype: torch.dtype, lo: int, hi: int) -> torch.Tensor | list[torch.Tensor]:
        """Elements [lo, hi) of every rank's region: one (p, hi - lo) strided view when the
        regions sit at a constant stride (all staged, or all at one place of one allocation),
        else a list of p views."""
        b = self.board
        words = b.sync.words
        descs = {(words[self._desc(j)], words[self._desc(j) + 1]) for j in range(b.p)}
        first = self.view(0, dtype)
        if len(descs) == 1 and b.p > 1:
            where = next(iter(descs))[0]
            isz = first.element_size()
            if where == _STAGED and (2 * b.capacity) % isz == 0:
                return b.staged_rows(self.parity, dtype, lo, hi)
            stride = 2 * b.capacity if where == _STAGED else b.allocations[where - 1].stride
            if stride % isz == 0:
                return first.as_strided((b.p, hi - lo), (stride // isz, 1), first.storage_offset() + lo)
        return [first[lo:hi]] + [self.view(j, dtype)[lo:hi] for j in range(1, b.p)]
