"""The shared-memory wire, and the torch wire of a group that also has one.

`ShmWire` is a Wire like TorchWire: `post(ops)` posts one batch and returns
one waitable per operation. Its peers are the ranks of this rank's host;
dt.transport.connect gives it to exactly those peers (Group.wire_for).

In a group that spans hosts, a rank may wait on a torch receive while a
send of its own still sits, half-written, in the shared-memory engine (a
channel holds only K slots); the peer that needs that send may in turn be
what the torch receive is waiting for: a cycle through two wires. So the
torch wire of such a group is a `PumpedTorchWire`: while shared-memory work
is pending, its waits keep the engine moving between polls of torch's work.
"""

from __future__ import annotations

import time
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


class _Pumped:
    """A torch Work whose wait keeps the shared-memory engine moving."""

    __slots__ = ("work", "engine")

    def __init__(self, work: Any, engine: Engine):
        self.work, self.engine = work, engine

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def wait(self, timeout: timedelta | None = None) -> Any:
        engine, work = self.engine, self.work
        if engine.pending and not work.is_completed():
            limit = timeout.total_seconds() if timeout is not None else float("inf")
            deadline = time.perf_counter() + limit
            while engine.pending and not work.is_completed():
                if not engine.progress():
                    engine.sync.nap(2e-4)  # woken early by shared-memory traffic
                if time.perf_counter() > deadline:
                    break
            if timeout is not None:
                timeout = timedelta(seconds=max(1e-3, deadline - time.perf_counter()))
        return work.wait(timeout) if timeout is not None else work.wait()


class PumpedTorchWire(TorchWire):
    """torch.distributed point-to-point for the peers on other hosts (see the module doc)."""

    def __init__(self, pg: Any, backend: str, engine: Engine):
        super().__init__(pg, backend)
        self.engine = engine

    def post(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Any]:
        return [_Pumped(w, self.engine) for w in super().post(ops)]
