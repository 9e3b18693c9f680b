"""Watching a learner's collective from inside each rank.

`install()` runs once in every judge worker, before the learner's file is
imported (so `from torch.distributed import isend` binds the watched twin). It
replaces torch.distributed's point-to-point calls (isend, irecv, send, recv;
batch_isend_irecv posts through them on gloo, and so does dt.transport) with
counted twins, and its collectives with guards. While a `CallWatch` is open, that
is while the learner's function runs:

- every message is counted (bytes and messages, sent and received) and
  logged as one JSON line: its direction, the peer, its ordinal with that
  peer ("its 5th message from rank 2"), its size, and the line of the
  learner's file that posted it. Lines are written as they happen, with
  os.write, so the log outlives the process: after a rank crashed the judge
  still knows what every rank had posted and what it was waiting on.
- every wait is bounded: a wait that outlasts the timeout raises `Deadlock`
  after logging what it waited on. No wait is unbounded, so a deadlocked
  collective costs the judge the timeout, never a hang.
- torch's collectives raise `Forbidden`, and so does a message posted from
  inside dt.collectives (dt's own algorithm, unless the exercise allows it):
  the learner writes the collective; torch's is only the judge's reference.

Outside a CallWatch every call goes straight to torch's own function: `original(name)`,
which is also what the judge's reference and the benchmark call.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = ["COLLECTIVES", "CallWatch", "Deadlock", "Forbidden", "describe", "install", "ordinal",
           "original", "watching"]

POINT_TO_POINT = ("isend", "irecv", "send", "recv")
COLLECTIVES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
    "barrier", "monitored_barrier", "broadcast_object_list", "scatter_object_list", "gather_object",
    "all_reduce_coalesced", "all_gather_coalesced",
)

_ORIGINAL: dict[str, Callable[..., Any]] = {}
_active: CallWatch | None = None


class Forbidden(Exception):
    """A collective called inside the learner's code."""


class Deadlock(RuntimeError):
    """A wait on one message outlasted the judge's timeout."""


def original(name: str) -> Callable[..., Any]:
    """torch.distributed's own `name`, whether or not the twins are installed."""
    return _ORIGINAL.get(name) or getattr(c10d, name)


def ordinal(k: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def describe(event: dict[str, Any]) -> str:
    """'recv from rank 2 (its 5th message from rank 2, 132 bytes)' for a logged post."""
    peer = "any rank" if event["peer"] is None else f"rank {event['peer']}"
    way = "from" if event["kind"] == "recv" else "to"
    tag = f", tag {event['tag']}" if event.get("tag") else ""
    return (f"{event['kind']} {way} {peer} (its {ordinal(event['k'])} message {way} {peer}, "
            f"{event['bytes']:,} bytes{tag})")


class _Posted:
    """What the learner's isend/irecv returns: torch's Work, with a bounded wait."""

    def __init__(self, work: Any, event: dict[str, Any], watch: CallWatch):
        self.work, self.event, self.watch = work, event, watch
        self.finished = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self.finished:
            return True
        w = self.watch
        limit = w.timeout
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
            limit = min(limit, timeout.total_seconds())
        w.log(e="wait", id=self.event["id"], at=w.where())
        try:
            self.work.wait(datetime.timedelta(seconds=limit))
        except RuntimeError as exc:
            raise w.failed(self, exc, limit) from None
        w.completed(self)
        return True

    def is_completed(self) -> bool:
        done = self.finished or bool(self.work.is_completed())
        if done and not self.finished:
            self.watch.completed(self)
        return done

    def __getattr__(self, name: str) -> Any:  # result(), exception(), _source_rank() ...
        return getattr(self.work, name)


class CallWatch:
    """One rank's view of one call of the learner's function."""

    def __init__(self, *, learner_file: str | None, what: str, timeout: float,
                 log_fd: int | None = None, allow_dt: bool = False):
        self.learner_file = learner_file
        self.what = what
        self.timeout = timeout
        self.log_fd = log_fd
        self.allow_dt = allow_dt
        self.rank = dist.get_rank()
        self.bytes_sent = self.bytes_received = self.messages_sent = self.messages_received = 0
        self.empty_sent = 0  # messages of no bytes: each still pays a latency
        self.open: dict[int, _Posted] = {}  # posted and not yet seen to complete
        self.ordinals: dict[tuple[str, int | None, int], int] = defaultdict(int)
        self.stuck: dict[str, Any] | None = None  # the post whose wait timed out
        self.lost: str | None = None  # a wait failed for another reason (a peer died)
        self.forbidden: str | None = None  # what was called, where, and why that is not allowed
        self._ids = 0
        self._lock = threading.Lock()

    # -- the log ------------------------------------------------------------
    def log(self, **event: Any) -> None:
        if self.log_fd is not None:
            os.write(self.log_fd, (json.dumps(event) + "\n").encode())

    def where(self) -> str | None:
        """'ring.py:23' for the innermost frame of the learner's file on this thread's stack."""
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_filename == self.learner_file:
                return f"{os.path.basename(self.learner_file)}:{f.f_lineno}"
            f = f.f_back
        return None

    # -- posting and waiting -------------------------------------------------
    def post(self, kind: str, tensor: torch.Tensor, peer: int | None, tag: int,
             start: Callable[[], Any]) -> _Posted:
        if not self.allow_dt:
            inside = _inside_dt_collective()
            if inside:
                raise self.forbid(f"dt's own {inside}")
        nbytes = tensor.numel() * tensor.element_size()
        at = self.where()
        work = start()
        with self._lock:
            self._ids += 1
            self.ordinals[(kind, peer, tag)] += 1
            event = {"e": "post", "id": self._ids, "kind": kind, "peer": peer, "tag": tag,
                     "k": self.ordinals[(kind, peer, tag)], "bytes": nbytes, "at": at}
            if kind == "send":
                self.bytes_sent += nbytes
                self.messages_sent += 1
                self.empty_sent += nbytes == 0
            else:
                self.bytes_received += nbytes
                self.messages_received += 1
            posted = _Posted(work, event, self)
            self.open[self._ids] = posted
        self.log(**event)
        return posted

    def completed(self, posted: _Posted) -> None:
        posted.finished = True
        with self._lock:
            self.open.pop(posted.event["id"], None)
        self.log(e="done", id=posted.event["id"])

    def failed(self, posted: _Posted, exc: RuntimeError, limit: float) -> Exception:
        text = str(exc)
        what = describe(posted.event)
        if "Timed out" in text or "timed out" in text:
            self.stuck = posted.event
            self.log(e="stuck", id=posted.event["id"], after=limit)
            return Deadlock(f"rank {self.rank} waited {limit:g}s in {what} and nothing came")
        first = text.splitlines()[0].split(" This is typically")[0] if text else type(exc).__name__
        self.lost = first
        self.log(e="lost", id=posted.event["id"], why=first)
        return RuntimeError(f"rank {self.rank}: {what} failed: {first}")

    def forbid(self, call: str) -> Forbidden:
        at = self.where()
        self.log(e="forbidden", call=call, at=at)
        self.forbidden = (
            f"rank {self.rank} called {call}{f' at {at}' if at else ''} inside your {self.what}: "
            f"the judge runs your {self.what} from point-to-point messages only "
            "(dist.isend/irecv/send/recv or dt.transport); torch's collective is its reference, "
            "not a building block")
        return Forbidden(self.forbidden)

    def settle(self, grace: float) -> list[dict[str, Any]]:
        """Give posts the learner never waited on `grace` seconds; return those still pending."""
        pending = []
        for posted in list(self.open.values()):
            try:
                posted.work.wait(datetime.timedelta(seconds=grace))
                self.completed(posted)
            except RuntimeError:
                self.log(e="unfinished", id=posted.event["id"])
                pending.append(posted.event)
        return pending

    def counts(self) -> dict[str, int]:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "messages_sent": self.messages_sent, "messages_received": self.messages_received,
                "empty_sent": self.empty_sent}


def _inside_dt_collective() -> str | None:
    """The outermost dt.collectives function on the stack ('dt.collectives.api.all_reduce'), if any."""
    found, f = None, sys._getframe(2)
    while f is not None:
        module = f.f_globals.get("__name__", "")
        if module.startswith("dt.collectives"):
            found = f"{module}.{f.f_code.co_name}"
        f = f.f_back
    return found


@contextlib.contextmanager
def watching(**settings: Any) -> Iterator[CallWatch]:
    """Watch the calls made inside the block (all threads): see `CallWatch`."""
    global _active
    watch = CallWatch(**settings)
    _active = watch
    try:
        yield watch
    finally:
        _active = None


# ---------------------------------------------------------------------------
# The twins.
# ---------------------------------------------------------------------------


def _global_peer(group: Any, peer: int | None, group_peer: int | None) -> int | None:
    if group_peer is None:
        return peer
    return dist.get_global_rank(group, group_peer) if group is not None else group_peer


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Any:
    start = lambda: _ORIGINAL["isend"](tensor, dst, group, tag, group_dst=group_dst)  # noqa: E731
    w = _active
    if w is None:
        return start()
    return w.post("send", tensor, _global_peer(group, dst, group_dst), tag, start)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Any:
    start = lambda: _ORIGINAL["irecv"](tensor, src, group, tag, group_src=group_src)  # noqa: E731
    w = _active
    if w is None:
        return start()
    return w.post("recv", tensor, _global_peer(group, src, group_src), tag, start)


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    if _active is None:
        return _ORIGINAL["send"](tensor, dst, group, tag, group_dst=group_dst)
    isend(tensor, dst, group, tag, group_dst).wait()
    return None


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    if _active is None:
        return _ORIGINAL["recv"](tensor, src, group, tag, group_src=group_src)
    posted = irecv(tensor, src, group, tag, group_src)
    posted.wait()
    peer = posted.event["peer"]
    return posted.work._source_rank() if peer is None else peer


_TWINS = {"isend": isend, "irecv": irecv, "send": send, "recv": recv}


def _guard(name: str) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _active is not None:
            raise _active.forbid(f"torch.distributed.{name}")
        return _ORIGINAL[name](*args, **kwargs)

    guarded.__name__ = guarded.__qualname__ = name
    guarded.__doc__ = f"torch.distributed.{name}, forbidden inside a judged collective."
    return guarded


def install() -> None:
    """Put the twins and guards in place of torch.distributed's functions (once per process)."""
    if _ORIGINAL:
        return
    # Every message must pass through torch's point-to-point to be counted and bounded
    # here: the judge's groups talk over the torch wire, never dt's shared memory.
    from dt import transport

    transport.set_transport("torch")
    for name in POINT_TO_POINT + COLLECTIVES:
        if not hasattr(c10d, name):
            continue
        _ORIGINAL[name] = getattr(c10d, name)
        replacement = _TWINS.get(name) or _guard(name)
        setattr(c10d, name, replacement)
        if getattr(dist, name, None) is _ORIGINAL[name]:
            setattr(dist, name, replacement)
