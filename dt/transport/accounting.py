"""Byte accounting: what this rank sent and received, per collective and per algorithm.

    with dt.traffic() as t:
        dt.all_reduce(x, algorithm="ring")
    t.bytes_sent, t.messages_sent, t.by_collective["all_reduce"]

Every message the transport posts is counted here, against the outermost
collective the user called (`charged_to`): a naive all-reduce built from a
reduce and a broadcast is charged to "all_reduce", once. A group's setup
(its first collective's connection messages, dt.transport.discover) is no
one's traffic: `setup()` marks it, so that the dt backend's send/recv, which
count what torch code posts itself, do not file it under "send_recv".
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RECORDERS", "Counts", "Recorders", "TrafficRecord", "account", "account_call", "blocking",
           "charge_target",
           "charged_as", "charged_to", "in_setup", "label", "open_records", "setup", "traffic"]


@dataclass
class Counts:
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    calls: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class TrafficRecord(Counts):
    """What this rank moved while a `traffic()` block was open (measured; dt.cost predicts it).

    Totals are the fields inherited from Counts; `by_collective` splits them by
    the outermost collective that caused them ("all_reduce", "validate", ...)
    and `by_algorithm` by "collective:algorithm"; `by_wire` by the wire that
    carried the bytes ("torch": torch.distributed; "shm": shared memory).
    """

    by_collective: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    by_algorithm: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    by_wire: dict[str, Counts] = field(default_factory=lambda: defaultdict(Counts))
    # Wall time the calling threads spent inside synchronous collectives (the
    # outermost call only): the communication a step cannot hide.
    seconds: float = 0.0


@dataclass(eq=False)
class Recorders:
    """The traffic() blocks open now, in any thread, and each thread's label (`charged_to`).

    `reset()` (dt.transport.reset) closes blocks a run left open (none, when every block
    is a `with`) and this thread's label; the list stays the same object, so the hot
    path's one read of it (`open_records`, below) costs what a module global costs.
    """

    open: list[TrafficRecord] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    scope: threading.local = field(default_factory=threading.local, repr=False)  # name, setup, blocking

    def reset(self) -> None:
        with self.lock:
            self.open.clear()
        self.scope.__dict__.clear()


RECORDERS = Recorders()
# The same objects as RECORDERS' (reset empties them in place), read as module globals on
# every message and by the fast path (dt.collectives.plan runs only while open_records is
# empty: the fast path counts nothing).
open_records = RECORDERS.open
_recorders_lock = RECORDERS.lock
_scope = RECORDERS.scope


@contextlib.contextmanager
def traffic() -> Iterator[TrafficRecord]:
    """Count this rank's point-to-point traffic inside the block (all threads)."""
    record = TrafficRecord()
    with _recorders_lock:
        open_records.append(record)
    try:
        yield record
    finally:
        with _recorders_lock:
            open_records.remove(record)


def account(collective: str, algorithm: str, sent: int, received: int, calls: int = 0,
            wire: str | None = None) -> None:
    """Add one message (sent or received; -1 means none) and `calls` calls to every open record."""
    if not open_records:
        return
    with _recorders_lock:
        for rec in open_records:
            counts = [rec, rec.by_collective[collective], rec.by_algorithm[f"{collective}:{algorithm}"]]
            if wire is not None:
                counts.append(rec.by_wire[wire])
            for c in counts:
                if sent >= 0:
                    c.bytes_sent += sent
                    c.messages_sent += 1
                if received >= 0:
                    c.bytes_received += received
                    c.messages_received += 1
                c.calls += calls


def account_call(collective: str, algorithm: str, counted: Any, wire: str) -> None:
    """One whole call's traffic at once, counted as its messages one by one would be: `counted`
    (a dt.cost RankTraffic: bytes and messages each way) under the current `charged_to` label
    (else collective, algorithm), and one call where no label was open (charged_to's rule).
    The fast path's (dt.collectives.plan): its counts are the algorithm's, known once per shape."""
    if not open_records:
        return
    scope = getattr(_scope, "name", None)
    name, algo = scope or (collective, algorithm)
    with _recorders_lock:
        for rec in open_records:
            calls = [rec, rec.by_collective[name], rec.by_algorithm[f"{name}:{algo}"]]
            for c in calls + [rec.by_wire[wire]]:
                c.bytes_sent += counted.bytes_sent
                c.messages_sent += counted.messages_sent
                c.bytes_received += counted.bytes_received
                c.messages_received += counted.messages_received
            if scope is None:
                for c in calls:
                    c.calls += 1


def charge_target() -> tuple[str, str] | None:
    """(collective, algorithm) the current thread's traffic is charged to, if inside one."""
    return getattr(_scope, "name", None)


def label(collective: str, algorithm: str) -> tuple[str, str]:
    """What traffic posted now is counted under: the enclosing `charged_to`'s label (set by the
    algorithm's registry wrapper, or a layer's own), else the poster's own names."""
    return getattr(_scope, "name", None) or (collective, algorithm)


@contextlib.contextmanager
def charged_to(collective: str, algorithm: str) -> Iterator[None]:
    """Charge traffic of nested collectives in this block to `collective`."""
    prev = getattr(_scope, "name", None)
    if prev is None:
        _scope.name = (collective, algorithm)
        account(collective, algorithm, sent=-1, received=-1, calls=1)
    try:
        yield
    finally:
        _scope.name = prev


@contextlib.contextmanager
def charged_as(name: tuple[str, str] | None) -> Iterator[None]:
    """Charge this thread's traffic in the block to `name`: the label (charge_target) the thread
    that issued the work had open, carried to the thread that runs it (a group's communication
    thread). No call is counted: the issuer's charged_to counted it. None: no label, as issued."""
    prev = getattr(_scope, "name", None)
    _scope.name = name
    try:
        yield
    finally:
        _scope.name = prev


@contextlib.contextmanager
def setup() -> Iterator[None]:
    """Messages this thread posts in the block set a group up: uncounted (see `in_setup`)."""
    prev = getattr(_scope, "setup", False)
    _scope.setup = True
    try:
        yield
    finally:
        _scope.setup = prev


def in_setup() -> bool:
    """Whether the current thread is setting a group up (inside `setup()`)."""
    return bool(getattr(_scope, "setup", False))


def blocking(fn: Callable[[], Any]) -> Any:
    """Run fn, charging its wall time to the open traffic() records (`seconds`)."""
    if not open_records or getattr(_scope, "blocking", False):
        return fn()
    _scope.blocking = True
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        _scope.blocking = False
        elapsed = time.perf_counter() - t0
        with _recorders_lock:
            for rec in open_records:
                rec.seconds += elapsed
