"""Point-to-point with context: the only way collectives talk.

A collective asks for a `Comm` (its group, bound to one call) and uses its
`isend` / `irecv` / `exchange`. Every message is counted (dt.transport.accounting)
and every wait knows what it is waiting for: the collective, the algorithm,
the step and the peer, so a deadlock becomes an error that says where it
happened.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from dt.transport import accounting, settings
from dt.transport.errors import CollectiveError, CollectiveTimeout
from dt.transport.group import Group

__all__ = ["RECV", "SEND", "Comm", "Handle"]

SEND, RECV = "send", "recv"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Handle:
    """One posted send or receive; `wait()` raises with the collective's context."""

    __slots__ = ("work", "comm", "what", "peer", "nbytes", "step")

    def __init__(self, work: Any, comm: Comm | None, what: str, peer: int, nbytes: int, step: int):
        self.work, self.comm, self.what, self.peer, self.nbytes, self.step = (
            work, comm, what, peer, nbytes, step)

    def wait(self) -> None:
        if self.work is None:
            return
        timeout = settings.timeout_for(self.comm.group if self.comm is not None else None)
        try:
            self.work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            assert self.comm is not None
            self.comm.fail(self, exc, timeout)
        self.work = None


class Comm:
    """A group bound to one collective call.

    `step` is the algorithm's current sequential step; it is carried into
    every error message so a deadlock says where it happened.
    """

    def __init__(self, group: Group, collective: str, algorithm: str):
        self.group = group
        self.rank = group.rank
        self.size = group.size
        self.collective = collective
        self.algorithm = algorithm
        self.step = 0
        # Traffic of a collective built from others (naive all-reduce = reduce +
        # broadcast) is charged to the outermost one, the one the user called.
        self._charge_to = accounting.charge_target() or (collective, algorithm)

    # -- posting ------------------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int) -> Handle:
        handle = Handle(None, self, "send", peer, _nbytes(tensor), self.step)
        handle.work = self._post(dist.isend, tensor, handle)
        accounting.account(*self._charge_to, sent=handle.nbytes, received=-1)
        return handle

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle:
        handle = Handle(None, self, "receive", peer, _nbytes(tensor), self.step)
        handle.work = self._post(dist.irecv, tensor, handle)
        accounting.account(*self._charge_to, sent=-1, received=handle.nbytes)
        return handle

    def _post(self, post: Any, tensor: torch.Tensor, handle: Handle) -> Any:
        # A peer that gave up (its timeout) closed the connection: posting fails
        # at once, and says so with the same context as a failed wait.
        try:
            return post(tensor, self.group.ranks[handle.peer], group=self.group.pg)
        except RuntimeError as exc:
            self.fail(handle, exc, settings.timeout_for(self.group))

    def batch(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Handle]:
        """Post one step's sends and receives together: [(SEND or RECV, tensor, peer), ...].

        What a step posts as one batch can never wait on itself: NCCL runs a
        batch as one grouped call (dist.batch_isend_irecv), so a send and a
        receive with the same peer in one batch cannot block each other. On
        gloo the receives are posted first, so every send finds its peer's
        receive already asked for. Handles come back in the order of `ops`.
        """
        handles: list[Handle | None] = [None] * len(ops)
        for i, (kind, tensor, peer) in enumerate(ops):
            if kind == RECV:
                handles[i] = self.irecv(tensor, peer)
        for i, (kind, tensor, peer) in enumerate(ops):
            if kind == SEND:
                handles[i] = self.isend(tensor, peer)
            elif kind != RECV:
                raise ValueError(f"batch op must be {SEND!r} or {RECV!r}, got {kind!r}")
        return handles  # type: ignore[return-value]

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        self.isend(tensor, peer).wait()

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        self.irecv(tensor, peer).wait()

    def exchange(
        self,
        send: torch.Tensor | None,
        to: int,
        recv: torch.Tensor | None,
        frm: int,
    ) -> None:
        """Send to one peer while receiving from another, as one batch, and wait for both.

        Posting both before waiting on either is what keeps a ring from
        deadlocking: every rank is a sender and a receiver at once.
        """
        ops = ([(RECV, recv, frm)] if recv is not None else []) + \
              ([(SEND, send, to)] if send is not None else [])
        for h in self.batch(ops):
            h.wait()

    # -- errors -------------------------------------------------------------
    def where(self) -> str:
        return (
            f"rank {self.group.ranks[self.rank]} (group rank {self.rank} of {self.size}) "
            f"in {self.collective}[{self.algorithm}] at step {self.step}"
        )

    def fail(self, handle: Handle, exc: BaseException, timeout: float) -> None:
        """Raise the CollectiveError (or CollectiveTimeout) for a failed wait on `handle`."""
        peer_global = self.group.ranks[handle.peer]
        direction = "from" if handle.what == "receive" else "to"
        msg = (
            f"{self.where()}: {handle.what} of {handle.nbytes} bytes {direction} "
            f"rank {peer_global} failed"
        )
        text = str(exc)
        if "Timed out" in text or "timeout" in text.lower() and "closure" not in text:
            raise CollectiveTimeout(
                f"{msg}: waited {timeout:g}s ({getattr(timeout, 'source', 'dt.transport timeout')}) "
                f"with nothing from the "
                f"peer; it is stuck elsewhere or never called {self.collective}"
            ) from exc
        first_line = text.splitlines()[0] if text else type(exc).__name__
        first_line = first_line.split(" This is typically")[0]  # gloo's boilerplate
        raise CollectiveError(f"{msg}: {first_line}") from exc
