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
  one stream, and 1F1B queues send(activation) then recv(gradient) on stage
  s and send(gradient) then recv(activation) on s+1: as separate calls that
  deadlocks. So a send waits (`pending`) and goes out in one batch with the
  receive that follows it, which is Megatron's send_forward_recv_backward
  on one side and send_backward_recv_forward on the other. At most one send
  waits: a second send posts the first alone. dt.transport.rules replays
  every schedule this way in the tests (tests/test_nccl_rules_parallel.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from dt.device import clock
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
        # data send waits for the next receive, and a header sent at once would pass it.
        self._inline = {q for q in range(p) if q != s and group.wire_for(q).name == "shm"}
        self._headers: deque[tuple[Any, torch.Tensor]] = deque()  # header receives posted ahead
        self._sends: list[tuple[Any, torch.Tensor]] = []  # posted, kept alive until drain
        self._pending: list[tuple[torch.Tensor, int]] = []  # a data send waiting for a receive
        self._loopback: deque[torch.Tensor] = deque()
        self.bytes_sent = 0
        self.wait_s = 0.0

    def _comm(self, group: Group | None = None) -> Comm:
        return Comm(group or self.group, LABEL, "p2p")

    def begin(self, headers_in: int) -> None:
        """Start a step that will receive `headers_in` activations from the stage before."""
        self.bytes_sent, self.wait_s = 0, 0.0
        if self._shared and headers_in and not self._comm().ahead:
            raise ValueError("on NCCL a pipeline needs its header groups: build the pipeline on the "
                             "world group, or pass header_groups=dt.parallel.pipeline.header_groups("
                             "every pipeline's ranks) (dt.mesh makes them as mesh.pp_headers)")
        inline = (self.group.rank - 1) % self.group.size in self._inline and self._comm().ahead
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
        else:
            self._flush(comm)
            self._pending.append((t, peer))

    def recv(self, src: int, like: torch.Tensor | None = None) -> torch.Tensor:
        """The next tensor from `src`: an activation (shape from its header) or, given `like`, a gradient."""
        if src == self.me:
            return self._loopback.popleft()
        t0 = clock(self.device)
        comm = self._comm()
        if like is None:
            if self._shared or (comm.ahead and self.group.group_rank(src) in self._inline):
                h = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
                comm.irecv(h, self.group.group_rank(src)).wait()
            else:
                handle, h = self._headers.popleft()
                handle.wait()
            words = h.tolist()
            t = torch.empty(words[2:2 + int(words[1])], dtype=_DTYPES[int(words[0])], device=self.device)
        else:
            t = torch.empty_like(like, memory_format=torch.contiguous_format)
        pending, self._pending = self._pending, []
        handles = comm.batch([(SEND, buf, q) for buf, q in pending] + [(RECV, t, self.group.group_rank(src))])
        self._sends += [(hd, buf) for hd, (buf, _) in zip(handles, pending)]
        handles[-1].wait()
        self.wait_s += clock(self.device) - t0
        return t

    def _flush(self, comm: Comm) -> None:
        """Post the waiting send on its own."""
        if self._pending:
            (t, peer), = self._pending
            self._pending = []
            self._sends.append((comm.isend(t, peer), t))

    def drain(self) -> None:
        """Post what is still pending, then wait for every send since the last drain."""
        t0 = clock(self.device)
        self._flush(self._comm())
        for handle, _ in self._sends:
            handle.wait()
        self._sends.clear()
        self.wait_s += clock(self.device) - t0
