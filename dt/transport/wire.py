"""Wires: how bytes get from one rank to another.

A wire posts one *batch* of point-to-point operations at a time: the sends
and receives of one algorithm step, [(SEND or RECV, tensor, global peer)],
and gives back one waitable per operation (anything with `wait(timedelta)`
and `is_completed()`). dt.transport.comm.Comm chooses the wire for each
peer; the collectives never see which one carried their bytes.

- TorchWire: torch.distributed's isend/irecv (gloo's TCP on CPU, NCCL on GPUs).

A wire also says whether receives may be posted *ahead* of the step that
needs them (`posts_ahead`). On gloo that is how a message flows the moment
its sender is ready (gloo moves data only once the receiver has asked for
it). On NCCL it is a deadlock: every operation between two ranks runs in
order on one stream, so a receive posted early blocks everything queued
behind it on that stream, the sends that would have let the peers progress
included. NCCL wants each step's sends and receives as one grouped call and
nothing posted ahead (see dt.transport.rules, which checks exactly that).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["RECV", "SEND", "TorchWire", "Wire"]

SEND, RECV = "send", "recv"


class Wire:
    """What every wire offers: post a batch, say whether receives may be posted ahead, close."""

    name = "wire"
    posts_ahead = True

    def post(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what the wire runs of its own (a thread), when its group is disconnected."""


class TorchWire(Wire):
    """torch.distributed point-to-point on one process group (None = the world)."""

    name = "torch"

    def __init__(self, pg: Any, backend: str):
        self.pg = pg
        self.backend = backend
        # NCCL runs all traffic between two ranks in order on one stream: a
        # receive posted ahead would block the sends behind it.
        self.posts_ahead = backend != "nccl"

    def post(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Any]:
        if self.backend == "nccl" and len(ops) > 1:
            p2p = [dist.P2POp(dist.isend if kind == SEND else dist.irecv, t, peer, group=self.pg)
                   for kind, t, peer in ops]
            works = dist.batch_isend_irecv(p2p)
            if len(works) == len(ops):
                return list(works)
            return [works[-1]] * len(ops)  # one coalesced work stands for the whole batch
        works: list[Any] = [None] * len(ops)
        # Receives first: gloo sends a message only once its receiver has asked for it.
        for i, (kind, t, peer) in enumerate(ops):
            if kind == RECV:
                works[i] = dist.irecv(t, peer, group=self.pg)
        for i, (kind, t, peer) in enumerate(ops):
            if kind == SEND:
                works[i] = dist.isend(t, peer, group=self.pg)
        return works
