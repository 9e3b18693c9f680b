"""The pipeline's link to its neighbours: activations forward, their gradients back.

Stages agree on nothing in advance: an activation is preceded by a header of
8 int64 words (dtype code, ndim, up to 6 dims), so the next stage learns
what it is about to receive from the message itself. A gradient needs none:
it has the shape of the activation it belongs to, which the stage that sent
that activation still holds. Per micro-batch and boundary: a 64-byte header
and the activation forward, the gradient back.

Every message the pipeline moves goes through this one class. How they are
posted is what makes the pipeline correct on NCCL as well as on gloo:

- Headers travel on groups of their own, one per boundary and direction of
  travel (stage s to s+1): on such a group one rank only sends and the other
  only receives, so the receiver may post every header receive of the step
  at its start and no header ever waits behind other traffic.
- Data travels on the pipeline group. On gloo (receives may go ahead) a send
  is posted at once and waited for at the end of the step (`drain`), so only
  receives block. On NCCL every operation between two ranks runs in order on
  one stream and a send completes only when its receive runs: a send posted
  on its own can hold up the stream until its peer gets to it, while the peer
  first needs a message queued behind it (with interleaved 1F1B on stage 0:
  a backward's gradient, then a forward's activation, both to the last stage,
  no receive between them). So there the link posts in lockstep
  (lockstep.py): at each tick of the step's common clock, one batch with
  what this stage sends at that tick and the receives of what its neighbours
  send at it, the batches of a tick pairing up across ranks, as Megatron and
  torch.distributed.pipelining do. dt.transport.rules replays every schedule
  this way in the tests (tests/test_nccl_rules_parallel.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from dt.device import clock
from dt.parallel.pipeline.lockstep import Message, StagePlan
from dt.transport import RECV, SEND, Comm, Group, connect, default_device, resolve_group, shared_group

__all__ = ["LABEL", "StageLink", "header_groups"]

LABEL = "pipeline"  # dt.traffic() charges every activation and gradient a pipeline sends to it

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.bool, torch.uint8]
_HEADER = 8  # int64 words: dtype code, ndim, up to 6 dims


def _header(t: torch.Tensor) -> torch.Tensor:
    if t.dim() > _HEADER - 2:
        raise ValueError(f"pipeline activations have at most {_HEADER - 2} dims, got {t.dim()}")
    words = [_DTYPES.index(t.dtype), t.dim(), *t.shape] + [0] * (_HEADER - 2 - t.dim())
    return torch.tensor(words, dtype=torch.int64, device=t.device)


def _from_header(h: torch.Tensor, device: Any) -> torch.Tensor:
    """An empty tensor of the dtype and shape a header announces."""
    words = h.tolist()
    return torch.empty(words[2:2 + int(words[1])], dtype=_DTYPES[int(words[0])], device=device)


def header_groups(pipelines: list[tuple[int, ...]]) -> dict[int, Group]:
    """The header groups of every pipeline, created on every rank; this rank's {boundary: group}.

    `pipelines` lists every pipeline group's global ranks in stage order (all
    of them: torch.distributed.new_group is collective over the world, so
    every rank creates every group, in the same order). Boundary s carries
    the headers stage s sends to stage s+1 (mod p: the last stage hands on to
    the first when chunks are interleaved). With two stages both boundaries
    join the same two ranks; creating them in boundary order on every rank
    keeps them apart.
    """
    me = dist.get_rank()
    mine: dict[int, Group] = {}
    for ranks in pipelines:
        p = len(ranks)
        for s in range(p if p > 1 else 0):
            pair = (ranks[s], ranks[(s + 1) % p])
            pg = shared_group(sorted(pair), f"pipeline headers, boundary {s} of {ranks}")
            if me in pair:
                mine[s] = resolve_group(pg)
    return mine


class StageLink:
    """One stage's point-to-point traffic, and what it cost this step.

    Peers are global ranks. A message to this rank itself (one stage holding
    consecutive chunks) never touches the wire: it is queued and popped.
    `bytes_sent` and `wait_s` (time blocked receiving or draining sends) count
    from the last `reset`.
    """

    def __init__(self, group: Group, headers: dict[int, Group] | None):
        self.group = group
        # Every stage builds its link at the same point: connect the pipeline group here (a
        # collective over it), so the first step's messages already take the shared-memory
        # wire between ranks of one host, not the torch wire a group has until it connects.
        connect(group, "building the pipeline's stage link")
        self.me = group.global_rank(group.rank)
        self.device = default_device(group)
        s, p = group.rank, group.size
        # Without header groups (a pipeline on a sub-group built by hand) headers
        # share the data's group: fine on gloo, where sends never block.
        self._shared = headers is None
        headers = headers or {}
        self._hdr_out = headers.get(s)  # headers this stage sends to stage s+1
        self._hdr_in = headers.get((s - 1) % p) if p > 1 else None  # from stage s-1
        # To a peer on this host's shared-memory wire a header goes with its data, on the
        # pipeline group: that wire's sends move only while its own engine is driven, and a
        # rank blocked on a header on another group's wire would leave its data send
        # unmoved and its peer waiting (both ends agree: a pair shares a host or does not).
        # Not where receives may not go ahead (NCCL's rules, replayed in the tests): there a
        # receive is posted in its tick's batch, after its header has arrived on its own group.
        self._inline = {q for q in range(p) if q != s and group.wire_for(q).name == "shm"}
        self._headers: deque[tuple[Any, torch.Tensor]] = deque()  # header receives posted ahead
        self._sends: list[tuple[Any, torch.Tensor]] = []  # posted, kept alive until drain
        self._loopback: deque[torch.Tensor] = deque()
        # Lockstep (receives may not go ahead): the step's messages still to post, the
        # receives posted and not yet taken (per peer, in order), and the activations sent
        # whose gradients are still to come (a gradient's receive is shaped like them).
        self._to_send: deque[Message] = deque()
        self._to_receive: deque[Message] = deque()
        self._posted: dict[int, deque[tuple[Any, torch.Tensor]]] = {}
        self._awaiting_gradient: dict[tuple[int, int], torch.Tensor] = {}
        self.bytes_sent = 0
        self.wait_s = 0.0

    def _comm(self, group: Group | None = None) -> Comm:
        return Comm(group or self.group, LABEL, "p2p")

    @property
    def lockstep(self) -> bool:
        """Whether this step's messages go out in lockstep (lockstep.py): where receives may not go ahead."""
        return not self._comm().ahead

    def begin(self, headers_in: int, plan: StagePlan | None = None) -> None:
        """Start a step that will receive `headers_in` activations from the stage before.

        `plan` (lockstep.stage_plan) is the step's messages on the common clock: needed
        in lockstep, unused otherwise.
        """
        self.bytes_sent, self.wait_s = 0, 0.0
        lockstep = self.lockstep
        if self._shared and headers_in and lockstep:
            raise ValueError("on NCCL a pipeline needs its header groups: build the pipeline on the "
                             "world group, or pass header_groups=dt.parallel.pipeline.header_groups("
                             "every pipeline's ranks) (dt.mesh makes them as mesh.pp_headers)")
        if lockstep:
            if plan is None:
                raise ValueError("where receives may not go ahead (NCCL) a step needs its lockstep plan")
            self._to_send, self._to_receive = deque(plan.sends), deque(plan.receives)
        inline = (self.group.rank - 1) % self.group.size in self._inline and not lockstep
        if headers_in and self._hdr_in is not None and not inline:
            comm = self._comm(self._hdr_in)
            peer = 1 - self._hdr_in.rank  # the other member of a two-rank group
            for _ in range(headers_in):
                h = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                self._headers.append((comm.irecv(h, peer), h))

    def send(self, t: torch.Tensor, dst: int, activation: bool) -> None:
        """Send `t` to global rank `dst` (an activation with its header, or a gradient)."""
        t = t.detach().contiguous()
        if dst == self.me:
            self._loopback.append(t)
            return
        self.bytes_sent += t.numel() * t.element_size()
        comm = self._comm()
        peer = self.group.group_rank(dst)
        if activation:
            h = _header(t)
            self.bytes_sent += h.numel() * h.element_size()
            if self._shared or (comm.ahead and peer in self._inline):
                self._sends.append((comm.isend(h, peer), h))
            else:
                self._sends.append((self._comm(self._hdr_out).isend(h, 1 - self._hdr_out.rank), h))
        if comm.ahead:
            self._sends.append((comm.isend(t, peer), t))
            return
        msg = self._to_send.popleft()
        if msg.peer != peer:
            raise RuntimeError(f"the pipeline sent to stage {peer} where its plan sends to stage {msg.peer}")
        if activation:
            self._awaiting_gradient[msg.chunk, msg.micro_batch] = t
        self._post_through(comm, msg.tick, (t, peer))

    def recv(self, src: int, like: torch.Tensor | None = None) -> torch.Tensor:
        """The next tensor from `src`: an activation (shape from its header) or, given `like`, a gradient."""
        if src == self.me:
            return self._loopback.popleft()
        t0 = clock(self.device)
        comm = self._comm()
        peer = self.group.group_rank(src)
        if not comm.ahead:
            posted = self._posted.setdefault(peer, deque())
            if not posted:  # post every batch up to the tick this message is sent at
                self._post_through(comm, next(m.tick for m in self._to_receive if m.peer == peer))
            handle, t = posted.popleft()
            handle.wait()
            self.wait_s += clock(self.device) - t0
            return t
        if like is None:
            if self._shared or peer in self._inline:
                h = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                comm.irecv(h, peer).wait()
            else:
                handle, h = self._headers.popleft()
                handle.wait()
            t = _from_header(h, self.device)
        else:
            t = torch.empty_like(like, memory_format=torch.contiguous_format)
        comm.irecv(t, peer).wait()
        self.wait_s += clock(self.device) - t0
        return t

    def _post_through(self, comm: Comm, tick: int, send: tuple[torch.Tensor, int] | None = None) -> None:
        """Post, in tick order, every batch up to `tick`: each tick's receives, and `send` in its own."""
        while self._to_receive and self._to_receive[0].tick <= tick:
            at = self._to_receive[0].tick
            ops = []
            while self._to_receive and self._to_receive[0].tick == at:
                ops.append(self._receive_op(self._to_receive.popleft()))
            if send is not None and at == tick:
                ops.append((SEND, *send))
                send = None
            self._post(comm, ops)
        if send is not None:
            self._post(comm, [(SEND, *send)])

    def _receive_op(self, msg: Message) -> tuple[str, torch.Tensor, int]:
        """A receive, shaped by its header (an activation) or by the activation it is the gradient of."""
        if msg.kind == "F":
            t0 = clock(self.device)
            handle, h = self._headers.popleft()
            handle.wait()
            self.wait_s += clock(self.device) - t0
            return RECV, _from_header(h, self.device), msg.peer
        sent = self._awaiting_gradient.pop((msg.chunk, msg.micro_batch))
        return RECV, torch.empty_like(sent, memory_format=torch.contiguous_format), msg.peer

    def _post(self, comm: Comm, ops: list[tuple[str, torch.Tensor, int]]) -> None:
        for handle, (kind, t, peer) in zip(comm.batch(ops), ops):
            if kind == SEND:
                self._sends.append((handle, t))
            else:
                self._posted.setdefault(peer, deque()).append((handle, t))

    def drain(self) -> None:
        """Wait for every send since the last drain."""
        t0 = clock(self.device)
        for handle, _ in self._sends:
            handle.wait()
        self._sends.clear()
        self.wait_s += clock(self.device) - t0
