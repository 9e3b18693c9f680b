"""Liveness: when a rank fails, every other rank hears of it within a second and stops waiting.

gloo notices a dead peer only on the connection to that peer: a rank waiting
on the dead rank itself fails at once ("Connection closed by peer"), but a
rank waiting on a *live* rank that has given up (the next rank on a ring)
waits out its whole timeout, and then blames the wrong rank. Nor can a gloo
wait be cut short: gloo has no abort (ProcessGroupGloo.abort does nothing),
and a wait that times out closes its connection, so waits cannot be sliced.

So failures are announced, and announcements abort waits:

- Failures. Who failed (a global rank, or everyone), how, and whom it
  points at. dt's launcher announces a worker that dies ("died", with the
  signal or exit code), a worker whose function raises ("raised"), and a run
  that outlives its timeout ("deadline", for everyone). A rank announces its
  own failed wait: it waited the full timeout on a peer ("timeout"), its
  connection to a peer closed and nobody said why ("lost"), it was aborted by
  another rank's failure ("gave up"), or an algorithm raised half-way
  ("raised").
- Channels carry them to every rank. Under dt's launcher: a pipe between
  each worker and the launcher, which relays every failure to every worker
  (PipeChannel; its end of file also tells a worker its launcher is gone).
  Under torchrun: the job's c10d store, failure i under dt/liveness/<i>
  (StoreChannel).
- The watchdog. Each rank runs one thread that waits for the next failure.
  When one names a member of a group this rank is waiting on (or everyone),
  it aborts the wait: it shuts down this process's gloo connections
  (shutdown(2): the descriptors stay gloo's; the store's connections are
  left alone), which gloo takes exactly as it takes a peer crashing, so every
  pending wait fails at once. NCCL communicators have a real abort.
- The error. The transport asks `cause(group)` which failure explains a
  failed wait, following "gave up" and "lost" back to the rank that started
  it (the launcher's "died" can arrive a moment after a survivor's connection
  closed, so it waits up to a few seconds for one), and says so: "... in
  all_reduce[ring] at step 3: receive of 400 bytes from rank 3 failed: rank 2
  died (signal SIGKILL)".

Without a channel (a process group dt did not set up) nothing is announced
and waits end at their timeout, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch.distributed as dist

__all__ = ["EVERYONE", "WATCH", "Failure", "FailureChannel", "FailureWatch", "PeerFailed", "PipeChannel",
           "StoreChannel", "announce", "attach", "attached", "cause", "check", "decode", "encode", "failures",
           "watching"]

EVERYONE = -1
PREFIX = "dt/liveness"
PRIMARY = ("died", "raised", "timeout", "deadline")  # explain themselves; "lost", "gave up" point on
CAUSE_GRACE_S = 3.0  # how long a survivor waits for the record that explains a closed connection


@dataclass(frozen=True)
class Failure:
    rank: int  # global rank, or EVERYONE
    kind: str  # died, raised, timeout, deadline, lost, gave up
    text: str  # a whole clause: "rank 2 died (signal SIGKILL)"
    blame: int = EVERYONE  # the rank this one points at ("lost", "gave up", "timeout")

    @property
    def is_timeout(self) -> bool:
        return self.kind in ("timeout", "deadline")


class PeerFailed(Exception):
    """A wait or post refused because a member of its group is known to have failed."""

    def __init__(self, failure: Failure):
        super().__init__(failure.text)
        self.failure = failure


@dataclass(eq=False)
class FailureWatch:
    """What this process knows of failures, and the waits a failure would abort.

    `reset()` (dt.transport.reset) forgets the
    failures heard: a pool whose run heard of one starts new workers anyway, so a
    run that begins with one known could only fail for an earlier run's sake. The
    channel and the store's ports stay: the watchdog is attached once per process.
    """

    lock: threading.Condition = field(default_factory=threading.Condition, repr=False)
    known: list[Failure] = field(default_factory=list)  # in the order announced
    # the waits in progress: token -> (global ranks, process group, backend)
    pending: dict[int, tuple[tuple[int, ...], Any, str]] = field(default_factory=dict)
    tokens: Iterator[int] = field(default_factory=itertools.count, repr=False)
    channel: FailureChannel | None = None
    keep_ports: set[int] = field(default_factory=set)  # the store's connections: aborting leaves them alone
    aborted: bool = False  # this process shut its connections down for a failure's sake

    def reset(self) -> None:
        with self.lock:
            self.known.clear()
            self.aborted = False


WATCH = FailureWatch()


# -- channels: how a rank hears of failures, and tells of its own ------------


def encode(failure: Failure) -> bytes:
    return json.dumps(asdict(failure)).encode()


def decode(data: bytes) -> Failure:
    return Failure(**json.loads(data))


class FailureChannel:
    """`send` one failure to every rank; `receive` the next one (blocks; None once gone)."""

    def send(self, failure: Failure) -> None:
        raise NotImplementedError

    def receive(self) -> Failure | None:
        raise NotImplementedError

    def stop(self) -> bool:
        """Make `receive` return None soon; whether it will (a pipe's read cannot be cut short)."""
        return False


class PipeChannel(FailureChannel):
    """Under dt's launcher: a pipe to the launcher, which relays every failure to every rank.

    Its end of file means the launcher is gone: the launcher holds the only
    other end (the worker's watchdog ends the worker then, see dt.launcher.worker).
    """

    def __init__(self, conn: Any):
        self.conn = conn
        self.lock = threading.Lock()  # two threads may announce at once

    def send(self, failure: Failure) -> None:
        with self.lock, contextlib.suppress(OSError):
            self.conn.send_bytes(encode(failure))

    def receive(self) -> Failure | None:
        try:
            return decode(self.conn.recv_bytes())
        except (EOFError, OSError):
            return None


class StoreChannel(FailureChannel):
    """Under torchrun: failures appended to the job's c10d store, under dt/liveness/<i>;
    each rank polls for the next on a store connection of its own.

    It polls (`check`, every POLL_S) rather than blocking in the store's `wait`:
    a thread blocked in C++ when the interpreter finalizes (the store's server,
    another host's agent, may close at that moment) aborts the whole process as
    its wait returns ("terminate called without an active exception"). `stop`
    ends the poll; `attach` calls it at exit.
    """

    POLL_S = 0.25

    def __init__(self, store: Any):
        self.store, self.reader, self.next = store, store.clone(), 0
        self.stopped = threading.Event()

    def send(self, failure: Failure) -> None:
        with contextlib.suppress(Exception):  # the store is gone with the job: nobody to tell
            i = self.store.add(f"{PREFIX}/count", 1) - 1
            self.store.set(f"{PREFIX}/{i}", encode(failure))

    def receive(self) -> Failure | None:
        key = f"{PREFIX}/{self.next}"
        try:
            while not self.reader.check([key]):
                if self.stopped.wait(self.POLL_S):
                    return None
            data = self.reader.get(key)
        except Exception:  # noqa: BLE001 - the store is gone
            return None
        self.next += 1
        return decode(data)

    def stop(self) -> bool:
        self.stopped.set()
        return True


def attach(channel: FailureChannel, keep_ports: tuple[int, ...] = (),
           on_gone: Callable[[], None] | None = None) -> None:
    """Start this rank's watchdog on `channel`; `keep_ports`: the store's (never aborted);
    `on_gone`: what to do when the channel closes."""
    if WATCH.channel is not None:
        return
    WATCH.channel = channel
    WATCH.keep_ports.update(keep_ports)

    def watch() -> None:
        while (failure := channel.receive()) is not None:
            _learn(failure)
        if on_gone is not None and not stopping.is_set():
            on_gone()

    stopping = threading.Event()
    thread = threading.Thread(target=watch, name="dt-liveness", daemon=True)
    thread.start()

    def end_watch() -> None:  # at exit, before the interpreter finalizes: see StoreChannel
        stopping.set()
        if channel.stop():
            thread.join(timeout=5)

    atexit.register(end_watch)


def attached() -> bool:
    return WATCH.channel is not None


def announce(failure: Failure) -> None:
    """Tell every rank (this one included) that `failure` happened."""
    if WATCH.channel is not None:
        WATCH.channel.send(failure)


def _learn(failure: Failure) -> None:
    with WATCH.lock:
        WATCH.known.append(failure)
        WATCH.lock.notify_all()
        hit = [(pg, backend) for ranks, pg, backend in WATCH.pending.values()
               if failure.rank == EVERYONE or failure.rank in ranks]
        if not hit or WATCH.aborted:
            return
        WATCH.aborted = True
    _abort(hit)


def _abort(groups: list[tuple[Any, str]]) -> None:
    """Make every pending wait of this process fail now."""
    for pg, backend in groups:
        if backend == "nccl":
            with contextlib.suppress(Exception):
                (pg or dist.group.WORLD).abort()
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        with contextlib.suppress(OSError, ValueError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                _shutdown_if_peer_link(int(name))


def _shutdown_if_peer_link(fd: int) -> None:
    """Shut down `fd` if it is a connected TCP socket that is not the store's."""
    sock = socket.socket(fileno=fd)
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return
        peer, local = sock.getpeername(), sock.getsockname()  # a listener has no peer: OSError
        if peer[1] in WATCH.keep_ports or local[1] in WATCH.keep_ports:
            return
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()  # the descriptor stays open, and gloo's


# -- what the transport asks -------------------------------------------------


def _among(ranks: tuple[int, ...]) -> list[Failure]:
    return [f for f in WATCH.known if f.rank == EVERYONE or f.rank in ranks]


def failures() -> list[Failure]:
    """Every failure this rank has heard of, in the order announced."""
    with WATCH.lock:
        return list(WATCH.known)


def check(ranks: tuple[int, ...]) -> None:
    """Raise PeerFailed if a member of `ranks` (global) has failed."""
    with WATCH.lock:
        known = _among(ranks)
    if known:
        raise PeerFailed(_root(known[0]))


@contextlib.contextmanager
def watching(ranks: tuple[int, ...], pg: Any, backend: str) -> Iterator[None]:
    """Around a wait on a group: a failure of a member announced meanwhile aborts it."""
    token = next(WATCH.tokens)
    with WATCH.lock:
        WATCH.pending[token] = (ranks, pg, backend)
        known = _among(ranks)
    try:
        if known:
            raise PeerFailed(_root(known[0]))
        yield
    finally:
        with WATCH.lock:
            del WATCH.pending[token]


def _root(failure: Failure) -> Failure:
    """Follow "lost" and "gave up" (and a timeout on a rank that failed) back to where it started."""
    seen = {failure.rank}
    while failure.blame != EVERYONE and failure.blame not in seen:
        if failure.kind in PRIMARY and failure.kind != "timeout":
            break
        nxt = next((f for f in WATCH.known if f.rank == failure.blame), None)
        if nxt is None:
            break
        seen.add(nxt.rank)
        failure = nxt
    return failure


def cause(ranks: tuple[int, ...], grace: float = CAUSE_GRACE_S) -> Failure | None:
    """The failure that explains a failed wait on a group of `ranks`, or None if none is known.

    Waits up to `grace` seconds for one that explains itself (a rank's death
    is announced by the launcher a moment after its peers' connections close).
    """
    if WATCH.channel is None:
        return None
    deadline = time.monotonic() + grace
    with WATCH.lock:
        while True:
            # A wait on a group with no failed member fails too when this process aborted
            # its connections for another group's sake: that failure is the cause then.
            roots = [_root(f) for f in _among(ranks) or (WATCH.known if WATCH.aborted else [])]
            primary = [f for f in roots if f.kind in PRIMARY]
            left = deadline - time.monotonic()
            if primary or left <= 0:
                return (primary or roots or [None])[0]
            WATCH.lock.wait(left)
