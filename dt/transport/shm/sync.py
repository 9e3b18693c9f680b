"""Waiting on peers through shared memory: a short spin, then a futex, and never forever.

Every local rank owns one line of words in the segment (RANK_BYTES apart):

    word 0  arrive    how many synchronisations this rank has reached (collectives)
    word 1  state     0 while healthy; 1 once it gave up (an error): peers stop waiting
    word 2  pid       so a peer can tell that it died
    word 3  sleeping  how many of its threads are asleep on its bell
    word 4+ the board's descriptors (dt.transport.shm.board)
    byte 128: bell    a 32-bit futex word, on its own cache line: peers ring it

Each word has one writer (its owner; the bell: the kernel, atomically), so
no atomic instructions are needed from Python: an aligned 8-byte store is
atomic on x86-64, and x86's stores become visible in program order, so a
peer that sees a counter move also sees the data written before it.

A waiter first spins (checking its condition, and driving the point-to-
point engine) for `spin_s`, but only while the machine has a core to spare
(the running-task count in /proc/loadavg, read at most every 20 ms, not
above the cores): a spinning rank otherwise holds the core the awaited peer
needs to wake up on, and each microsecond of spin is a microsecond of the
peer's delay (measured: on the loaded 2-core machine a 1 ms spin made a
4 KB all-reduce 3x slower; DeepSpeed's spinning all-reduce collapses
exactly there), and never when the host's ranks outnumber its cores. Then it sleeps: it marks itself
sleeping, checks once more, and calls FUTEX_WAIT on its bell; a peer that
changes anything this rank may wait for rings the bell of every sleeping
rank with FUTEX_WAKE_OP (an atomic increment and a wake in one system
call). Sleeps are bounded (1 ms growing to 50 ms) so that a peer that died
(its pid gone, or its state 1, or its failure announced by
dt.transport.liveness) is named, and the transport's timeout enforced,
within a fraction of a second, at a cost of a few wake-ups per second
while idle.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence

from dt import args
from dt.transport import liveness
from dt.transport.errors import timed_out
from dt.transport.shm.segment import alive

__all__ = ["RANK_BYTES", "PeerGone", "PeerTimeout", "Sync", "futex_wait", "futex_wake"]

RANK_BYTES = 256
WORDS = RANK_BYTES // 8
ARRIVE, STATE, PID, SLEEPING, DESC = 0, 1, 2, 3, 4
BELL_BYTE = 128

_SYS_FUTEX = {"x86_64": 202, "AMD64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE_OP = 0, 5
# FUTEX_WAKE_OP's op word: *uaddr2 += 1 (FUTEX_OP_ADD, oparg 1); compare "== 0" (irrelevant:
# uaddr2 is uaddr, whose waiters the first wake already woke).
_ADD_ONE = (1 << 28) | (0 << 24) | (1 << 12) | 0
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def futex_wait(addr: ctypes.c_void_p, expected: int, seconds: float) -> None:
    """Sleep while the 32-bit word at addr holds `expected`, at most `seconds` (or a wake)."""
    if _SYS_FUTEX is None:  # no futex here: poll
        time.sleep(min(seconds, 2e-4))
        return
    ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, ctypes.c_int(expected), ctypes.byref(ts), None, 0)


def futex_wake(addr: ctypes.c_void_p) -> None:
    """Atomically add 1 to the word at addr and wake everyone asleep on it."""
    if _SYS_FUTEX is not None:
        _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE_OP, 0x7FFFFFFF, None, addr, _ADD_ONE)


class PeerGone(RuntimeError):
    """A local peer died or gave up while this rank waited on it, seen on the segment itself.

    Not liveness.PeerFailed: that one carries a failure announced to every rank; this one
    is what the wire saw directly (a dead pid, a peer's give-up word), with no Failure behind it.
    """


class PeerTimeout(RuntimeError):
    """Timed out waiting on a peer (the text starts "Timed out", as gloo's does)."""


def default_spin(local_ranks: int) -> float:
    """Seconds to spin before sleeping: 200 us, none when the ranks outnumber the cores."""
    spin_us = args.env_value("DT_SHM_SPIN_US")
    if spin_us is not None:
        return spin_us * 1e-6
    return 200e-6 if local_ranks <= args.cores() else 0.0


class _SpareCore:
    """Whether the machine has a core nobody is running on (cached for 20 ms)."""

    def __init__(self) -> None:
        self.cores, self.checked, self.spare = args.cores(), 0.0, True

    def __call__(self, now: float) -> bool:
        if now - self.checked > 0.02:
            self.checked = now
            try:
                with open("/proc/loadavg") as f:
                    running = int(f.read().split()[3].split("/")[0])
                self.spare = running <= self.cores  # this rank is one of them
            except (OSError, ValueError, IndexError):
                self.spare = True
        return self.spare


_spare_core = _SpareCore()
_now = time.perf_counter


class Sync:
    """The local ranks' words in one segment, from one rank's point of view.

    `names[i]` is how errors name local rank i (its global rank).
    """

    def __init__(self, buf: memoryview, address: int, me: int, names: Sequence[int]):
        self.me, self.n, self.names = me, len(names), list(names)
        self.words = buf.cast("q")
        self.bells = buf.cast("i")
        self._bell_index = [i * RANK_BYTES // 4 + BELL_BYTE // 4 for i in range(self.n)]
        self._bell_addr = [ctypes.c_void_p(address + i * RANK_BYTES + BELL_BYTE) for i in range(self.n)]
        self._sleep_lock = threading.Lock()
        # The word indices a sync reads, made once: its per-call work is a store and a few loads.
        peers = [j for j in range(self.n) if j != me]
        self._arrive_at = me * WORDS + ARRIVE
        self._peer_arrive = [j * WORDS + ARRIVE for j in peers]
        self._peer_sleeping = [(j * WORDS + SLEEPING, self._bell_addr[j]) for j in peers]
        self.spin_s = default_spin(self.n)
        self.words[me * WORDS + PID] = os.getpid()
        self.words[me * WORDS + STATE] = 0

    # -- words ----------------------------------------------------------------
    def word(self, rank: int, index: int) -> int:
        return self.words[rank * WORDS + index]

    def set_word(self, index: int, value: int) -> None:
        self.words[self.me * WORDS + index] = value

    # -- ringing --------------------------------------------------------------
    def ring(self, rank: int) -> None:
        """Wake local rank `rank` if any of its threads sleeps (it re-checks its condition)."""
        if self.words[rank * WORDS + SLEEPING]:
            futex_wake(self._bell_addr[rank])

    def ring_all(self) -> None:
        words, me = self.words, self.me
        for j in range(self.n):
            if j != me and words[j * WORDS + SLEEPING]:
                futex_wake(self._bell_addr[j])

    # -- collective synchronisation -------------------------------------------
    def arrive(self) -> int:
        """Count one more synchronisation reached by this rank; return the count."""
        words = self.words
        v = words[self._arrive_at] + 1
        words[self._arrive_at] = v
        for sleeping, bell in self._peer_sleeping:  # ring_all, inlined: once per sync
            if words[sleeping]:
                futex_wake(bell)
        return v

    def reached(self, v: int) -> bool:
        words = self.words
        for i in self._peer_arrive:
            if words[i] < v:
                return False
        return True

    def behind(self, v: int) -> list[int]:
        words = self.words
        return [j for j in range(self.n) if words[j * WORDS + ARRIVE] < v]

    def waiting_on(self) -> list[int]:
        """Global ranks that have not yet arrived where this rank last arrived."""
        return [self.names[j] for j in self.behind(self.words[self._arrive_at]) if j != self.me]

    def sync(self, what: Callable[[], str], timeout: float | Callable[[], float]) -> None:
        """Arrive, then wait until every local rank has arrived as often.

        The spin is written out here rather than through `wait`'s callables: a small
        all-reduce spends most of its time in this loop, and each Python call in it
        is a microsecond added to the peer's wait (DeepSpeed's C++ loop is the same
        load and compare, ~100x cheaper per turn).
        """
        v = self.arrive()
        words, peers = self.words, self._peer_arrive
        for i in peers:
            if words[i] < v:
                break
        else:
            return
        if self.spin_s and _spare_core(_now()):
            end = _now() + self.spin_s
            while True:
                for i in peers:
                    if words[i] < v:
                        break
                else:
                    return
                if _now() > end:
                    break
        self.wait(lambda: self.reached(v), lambda: self.behind(v), what, timeout=timeout, spin=False)

    def fail(self) -> None:
        """Mark this rank as gone: peers waiting on it stop at once, naming it."""
        self.set_word(STATE, 1)
        for j in range(self.n):
            if j != self.me:
                futex_wake(self._bell_addr[j])

    # -- waiting ----------------------------------------------------------------
    def nap(self, seconds: float) -> None:
        """Sleep on this rank's bell for at most `seconds` (a peer's ring ends it early)."""
        me = self.me
        bell = self.bells[self._bell_index[me]]
        with self._sleep_lock:
            self.words[me * WORDS + SLEEPING] += 1
        try:
            futex_wait(self._bell_addr[me], bell, seconds)
        finally:
            with self._sleep_lock:
                self.words[me * WORDS + SLEEPING] -= 1

    def check(self, peers: Sequence[int]) -> None:
        """Raise PeerGone if one of `peers` (local indices) died or gave up; or
        liveness.PeerFailed if a failure of one of them was announced (dt.transport.liveness)."""
        liveness.check(tuple(self.names[j] for j in peers if j != self.me))
        for j in peers:
            if j == self.me:
                continue
            if self.word(j, STATE):
                raise PeerGone(f"rank {self.names[j]} gave up (its own error says why)")
            pid = self.word(j, PID)
            if pid and not alive(pid):
                # The launcher (or torchrun's store) says how it died, a moment later.
                failure = liveness.cause((self.names[j],), grace=1.0)
                if failure is not None:
                    raise liveness.PeerFailed(failure)
                raise PeerGone(f"rank {self.names[j]} (pid {pid}) died")

    def wait(self, ready: Callable[[], bool], blockers: Callable[[], Sequence[int]],
             what: Callable[[], str], progress: Callable[[], object] | None = None, *,
             timeout: float | Callable[[], float], spin: bool = True) -> None:
        """Return once ready(); spin, then sleep on this rank's bell.

        `blockers()` names the local ranks being waited on (checked for death),
        `progress()` moves pending point-to-point traffic while waiting.
        Raises PeerGone or PeerTimeout (text "Timed out ...").
        """
        start = time.perf_counter()
        if spin and self.spin_s and _spare_core(start):
            end = start + self.spin_s
            while time.perf_counter() < end:
                if progress is not None:
                    progress()
                if ready():
                    return
        limit = timeout() if callable(timeout) else timeout  # the caller's: settings.timeout_for
        deadline = start + limit
        chunk = 1e-3
        me = self.me
        bell_i, bell_addr, sleeping = self._bell_index[me], self._bell_addr[me], me * WORDS + SLEEPING
        words = self.words
        while True:
            bell = self.bells[bell_i]
            with self._sleep_lock:
                words[sleeping] += 1
            try:
                if progress is not None:
                    progress()
                if ready():
                    return
                futex_wait(bell_addr, bell, chunk)
            finally:
                with self._sleep_lock:
                    words[sleeping] -= 1
            if ready():
                return
            self.check(blockers())
            if time.perf_counter() > deadline:
                waiting = [self.names[j] for j in blockers() if j != me]
                source = getattr(limit, "source", "dt.transport timeout")  # which rule set it
                who = ", ".join(f"rank {r}" for r in waiting)
                raise PeerTimeout(f"{timed_out(limit)} ({source}) on {who} for {what()}")
            chunk = min(chunk * 2, 0.05)
