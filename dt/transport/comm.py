"""Point-to-point with context: the only way collectives talk.

A collective asks for a `Comm` (its group, bound to one call) and posts
through it: `batch` for one step's sends and receives together, `isend` /
`irecv` for one message, `exchange` for a send and a receive waited on at
once. Every message is counted (dt.transport.accounting), carried by the
peer's wire (dt.transport.wire), and every wait knows what it is waiting
for: the collective, the algorithm, the step and the peer, so a deadlock
becomes an error that says where it happened.

`comm.ahead` says whether this step's receives may be posted before the
step (gloo: yes, it is how data flows at once; NCCL: no, see wire.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch

from dt.transport import accounting, liveness, rules, settings
from dt.transport.asynchronous import after_queued
from dt.transport.errors import CollectiveError, CollectiveTimeout, timed_out
from dt.transport.group import Group
from dt.transport.wire import RECV, SEND, Wire

__all__ = ["RECV", "SEND", "Comm", "Handle"]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Handle:
    """One posted send or receive; `wait()` raises with the collective's context."""

    __slots__ = ("work", "comm", "what", "peer", "nbytes", "step")

    def __init__(self, work: Any, comm: Comm | None, what: str, peer: int, nbytes: int, step: int):
        self.work, self.comm, self.what, self.peer, self.nbytes, self.step = (
            work, comm, what, peer, nbytes, step)

    def wait(self) -> None:
        """Wait for the operation; on NCCL, order the current stream after it instead.

        A timeout makes torch's NCCL wait poll the host until the GPU is done;
        without one it only makes the caller's stream wait, and NCCL's own
        watchdog (armed with the group's timeout at init) catches a hang. A
        peer's failure announced meanwhile (dt.transport.liveness) ends the wait.
        """
        if self.work is None:
            return
        assert self.comm is not None
        group = self.comm.group
        timeout = settings.timeout_for(group)
        try:
            with liveness.watching(group.ranks, group.pg, group.backend):
                if group.backend == "nccl":
                    self.work.wait()
                else:
                    self.work.wait(datetime.timedelta(seconds=timeout))
        except (RuntimeError, liveness.PeerFailed) as exc:
            self.comm.fail(self.what, self.peer, self.nbytes, exc, timeout)
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
        # The label its messages are counted under (accounting.label); asked only while a
        # dt.traffic() block is open: nothing is counted otherwise.
        self._charge_to = (accounting.label(collective, algorithm) if accounting.open_records
                           else (collective, algorithm))
        self._rules = rules.RULES.recorder
        # Receives may go out ahead of their step only where every wire allows it
        # (and not while NCCL's rules are being checked).
        self.ahead = self._rules is None and all(
            group.wire_for(q).posts_ahead for q in range(group.size) if q != group.rank)

    # -- posting ------------------------------------------------------------
    def batch(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Handle]:
        """Post one step's sends and receives together: [(SEND or RECV, tensor, peer), ...].

        What a step posts as one batch can never wait on itself: NCCL runs a
        batch as one grouped call (dist.batch_isend_irecv), so a send and a
        receive with the same peer in one batch cannot block each other. On
        gloo the receives are posted first, so every send finds its peer's
        receive already asked for. Handles come back in the order of `ops`. Posted from
        outside the group's communication thread, a batch follows what is queued there
        (asynchronous.after_queued): one order of messages per channel.
        """
        after_queued(self.group)
        for kind, _, _ in ops:
            if kind not in (SEND, RECV):
                raise ValueError(f"batch op must be {SEND!r} or {RECV!r}, got {kind!r}")
        if self._rules is not None:
            self._record(ops)
        try:
            liveness.check(self.group.ranks)
        except liveness.PeerFailed as exc:
            kind, tensor, peer = ops[0] if ops else (SEND, torch.empty(0), self.rank)  # host: named only
            self.fail("send" if kind == SEND else "receive", peer, _nbytes(tensor), exc, 0.0)
        by_wire: dict[int, tuple[Wire, list[int]]] = {}
        for i, (_, tensor, peer) in enumerate(ops):
            wire = self.group.wire_for(peer, tensor.device.type)
            by_wire.setdefault(id(wire), (wire, []))[1].append(i)
        handles: list[Handle | None] = [None] * len(ops)
        for wire, idx in by_wire.values():
            try:
                works = wire.post([(ops[i][0], ops[i][1], self.group.ranks[ops[i][2]]) for i in idx])
            except RuntimeError as exc:  # a connection already closed fails at posting
                kind, tensor, peer = ops[idx[0]]
                self.fail("send" if kind == SEND else "receive", peer, _nbytes(tensor), exc,
                          settings.timeout_for(self.group))
            for i, work in zip(idx, works):
                kind, tensor, peer = ops[i]
                nbytes = _nbytes(tensor)
                if accounting.open_records:  # counted only inside dt.traffic(): no call otherwise
                    accounting.account(*self._charge_to, sent=nbytes if kind == SEND else -1,
                                       received=nbytes if kind == RECV else -1, wire=wire.name)
                handles[i] = Handle(work, self, "send" if kind == SEND else "receive", peer, nbytes,
                                    self.step)
        return handles  # type: ignore[return-value]

    def isend(self, tensor: torch.Tensor, peer: int) -> Handle:
        return self.batch([(SEND, tensor, peer)])[0]

    def irecv(self, tensor: torch.Tensor, peer: int) -> Handle:
        return self.batch([(RECV, tensor, peer)])[0]

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

    def _record(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> None:
        """NCCL-rules mode: note the batch and any tensor on the wrong kind of device."""
        assert self._rules is not None
        want = "cuda" if self.group.backend == "nccl" else "cpu"
        for kind, tensor, peer in ops:
            if tensor.device.type != want:
                self._rules.violation(
                    f"{self.where()}: {kind} of a {tensor.device.type} tensor to rank "
                    f"{self.group.ranks[peer]} on a {self.group.backend} group (needs {want})")
        self._rules.batch(self.group.name, tuple(
            rules.Op(kind, self.group.ranks[peer], _nbytes(t)) for kind, t, peer in ops),
            f"{self.collective}[{self.algorithm}] step {self.step}")

    # -- errors -------------------------------------------------------------
    def where(self) -> str:
        return (
            f"rank {self.group.ranks[self.rank]} (group rank {self.rank} of {self.size}) "
            f"in {self.collective}[{self.algorithm}] at step {self.step}"
        )

    def fail(self, what: str, peer: int, nbytes: int, exc: BaseException, timeout: float) -> None:
        """Raise the CollectiveError (or CollectiveTimeout) for a failed post or wait.

        Three ways a wait fails, told apart here and announced to every rank
        (dt.transport.liveness), so that nobody else waits on this rank:
        it timed out (this rank waited `timeout` on `peer`); a known failure
        ended it (a peer died, raised, or timed out: name the rank it started
        from, never the messenger); or gloo closed the connection for a reason
        nobody announced. gloo's own error never escapes raw.
        """
        me = self.group.ranks[self.rank]
        peer_global = self.group.ranks[peer]
        direction = "from" if what == "receive" else "to"
        msg = f"{self.where()}: {what} of {nbytes} bytes {direction} rank {peer_global} failed"
        step = f"{self.collective}[{self.algorithm}] at step {self.step}"
        text = str(exc)
        if isinstance(exc, liveness.PeerFailed):
            failure: liveness.Failure | None = exc.failure
        elif "Timed out" in text or "timeout" in text.lower() and "closure" not in text:
            liveness.announce(liveness.Failure(
                me, "timeout", f"rank {me} waited on rank {peer_global} in {step}: "
                f"{timed_out(timeout)}, and it never answered", peer_global))
            raise CollectiveTimeout(
                f"{msg}: {timed_out(timeout)} ({getattr(timeout, 'source', 'dt.transport timeout')}) "
                f"with nothing from the peer; it is stuck elsewhere or never called {self.collective}"
            ) from None
        else:
            failure = liveness.cause(self.group.ranks)
        if failure is None:
            gloo = (text.splitlines()[0] if text else type(exc).__name__).split(" This is typically")[0]
            gloo = gloo.split("] ", 1)[-1]  # gloo's source location
            liveness.announce(liveness.Failure(
                me, "lost", f"rank {me} lost its connection to rank {peer_global} in {step}",
                peer_global))
            if "closed" in gloo.lower() or "reset" in gloo.lower():
                raise CollectiveError(f"{msg}: the connection closed ({gloo}) and no rank reported "
                                      f"a failure: rank {peer_global} or the network went away") from None
            raise CollectiveError(f"{msg}: the transport failed ({gloo})") from None
        if failure.rank not in (me, liveness.EVERYONE):
            liveness.announce(liveness.Failure(
                me, "gave up", f"rank {me} gave up in {step} because {failure.text}", failure.rank))
        error = CollectiveTimeout if failure.is_timeout else CollectiveError
        raise error(f"{msg}: {failure.text}") from None
