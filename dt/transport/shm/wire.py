"""The shared-memory wire, and the torch wire of a group that also has one.

`ShmWire` is a Wire like TorchWire: `post(ops)` posts one batch and returns
one waitable per operation. Its peers are the ranks of this rank's host;
dt.transport.connect gives it to exactly those peers (Group.wire_for).

In a group that spans hosts, a rank may wait on a torch receive while a
send of its own still sits, half-written, in the shared-memory engine (a
channel holds only K slots); the peer that needs that send may in turn be
what the torch receive is waiting for: a cycle through two wires. So the
torch wire of such a group is a `PumpedTorchWire`: while shared-memory work
is pending, a helper thread keeps the engine moving for as long as the rank
blocks in torch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from dt.transport.shm.channel import Engine
from dt.transport.wire import TorchWire, Wire

__all__ = ["PumpedTorchWire", "ShmWire"]


class ShmWire(Wire):
    """Point-to-point with the ranks of this host, through the group's shared segment."""

    name = "shm"
    posts_ahead = True

    def __init__(self, engine: Engine, local_of: dict[int, int]):
        self.engine = engine
        self.local_of = local_of  # global rank -> index among this host's ranks

    def post(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Any]:
        engine, local_of = self.engine, self.local_of
        return [engine.post(kind, t, local_of[peer]) for kind, t, peer in ops]


class _Pump:
    """A helper thread that moves the engine's transfers while its rank blocks in torch.

    torch's point-to-point works cannot be polled (gloo's say completed only once
    waited on), so a rank that must wait on one while its own shared-memory
    sends are pending hands the engine to this thread for the duration of the
    wait: it progresses whatever can move and sleeps on the rank's bell between.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.active = 0
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.stopped = False

    def __enter__(self) -> None:
        with self.lock:
            self.active += 1
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="dt-shm-pump", daemon=True)
                self.thread.start()
        self.wake.set()

    def __exit__(self, *exc: Any) -> None:
        with self.lock:
            self.active -= 1

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()

    def _loop(self) -> None:
        engine = self.engine
        while not self.stopped:
            self.wake.wait()
            self.wake.clear()
            while self.active and engine.pending and not engine.broken:
                if not engine.progress():
                    engine.sync.nap(1e-3)  # a peer's ring ends it early


class _Pumped:
    """A torch Work whose wait keeps the shared-memory engine moving (see _Pump)."""

    __slots__ = ("work", "pump")

    def __init__(self, work: Any, pump: _Pump):
        self.work, self.pump = work, pump

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self, timeout: timedelta | None = None) -> Any:
        if not self.pump.engine.pending:
            return self.work.wait(timeout) if timeout is not None else self.work.wait()
        with self.pump:
            return self.work.wait(timeout) if timeout is not None else self.work.wait()


class PumpedTorchWire(TorchWire):
    """torch.distributed point-to-point for the peers on other hosts (see the module doc)."""

    def __init__(self, pg: Any, backend: str, engine: Engine):
        super().__init__(pg, backend)
        self.pump = _Pump(engine)

    def post(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Any]:
        return [_Pumped(w, self.pump) for w in super().post(ops)]

    def close(self) -> None:
        self.pump.stop()
