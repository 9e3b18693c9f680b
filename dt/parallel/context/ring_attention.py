"""Ring attention: queries stay, key/value blocks travel around the context-parallel ring.

Rank r holds q, k, v for its tokens (dt.layout.SequenceLayout, zig-zag for
causal load balance). Forward, cp steps: at step h rank r attends its
queries to the key/value block it holds (its own at step 0, then block r-h),
merging each partial result into a running one with the online softmax
(dt.parallel.context.blocks.merge), while it passes the block on: it sends
the block it holds to r+1 and receives the next from r-1 (dt.layout.ring_hop).
Each step's send and receive are posted as one batch before the step's
attention and waited on after it, so the transfer hides behind the compute;
nothing is posted ahead of its step (NCCL's rule, dt.transport.rules).

Backward, flash-attention style with the saved final lse: each rank computes
its own block's contribution, then passes the k/v blocks around the ring
again; the gradient of each block (dk, dv) travels one hop behind it,
accumulating every rank's contribution, and the last hop brings it home. At
hop h a rank sends block r-h's k/v (h <= cp-2) and its accumulated dk/dv
(h >= 1), together, as one message.

Cost per rank (dt.cost.ring_attention_traffic, exact): forward cp-1 hops of
one k/v block, 2 b H s_r d numbers; backward cp hops, 4 (cp-1) block halves
in all. Even split: forward 2(cp-1)/cp, backward 4(cp-1)/cp of b S H d
numbers: flat in cp, unlike Ulysses, but every hop overlaps compute.
"""

from __future__ import annotations

from typing import Any

import torch

from dt.layout import SequenceLayout, ring_hop
from dt.parallel.context.blocks import block_backward, block_forward, merge, plan
from dt.transport import RECV, SEND, Comm, Group, Handle, resolve_group
from dt.transport.accounting import blocking

__all__ = ["LABEL", "ring_attention"]

LABEL = "ring_attention"  # dt.traffic() charges every hop, forward and backward, to this name


def _wait(handles: list[Handle]) -> None:
    """Wait for a hop, its time charged to dt.traffic()'s `seconds` (communication not hidden)."""
    if handles:
        blocking(lambda: [h.wait() for h in handles])


def _post(comm: Comm, hop: int, send: torch.Tensor, recv: torch.Tensor) -> list[Handle]:
    """One hop: send to rank+1 and receive from rank-1 as one batch (empty messages skipped)."""
    comm.step = hop
    p, r = comm.size, comm.rank
    ops = ([(SEND, send, (r + 1) % p)] if send.numel() else []) + \
          ([(RECV, recv, (r - 1) % p)] if recv.numel() else [])
    return comm.batch(ops) if ops else []


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Group,
                layout: SequenceLayout, causal: bool) -> torch.Tensor:
        p, r = g.size, g.rank
        b, heads, _, d = k.shape
        mine = layout.chunks(r)
        comm = Comm(g, LABEL, "ring")
        kv = torch.stack([k, v])
        out = lse = None
        for hop in range(p):
            held = (r - hop) % p
            handles: list[Handle] = []
            if hop < p - 1:
                _, incoming = ring_hop(r, p, hop)
                nxt = kv.new_empty(2, b, heads, layout.size(incoming), d)
                handles = _post(comm, hop, kv, nxt)
            part = block_forward(q, kv[0], kv[1], plan(mine, layout.chunks(held), causal, q.device))
            out, lse = part if out is None else merge(out, lse, *part)
            _wait(handles)
            if hop < p - 1:
                kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.g, ctx.layout, ctx.causal = g, layout, causal
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        g, layout, causal = ctx.g, ctx.layout, ctx.causal
        p, r = g.size, g.rank
        b, heads, _, d = k.shape
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        mine = layout.chunks(r)
        dq, dk, dv = block_backward(q, k, v, dout, lse, delta, plan(mine, mine, causal, q.device))
        comm = Comm(g, LABEL, "ring")
        kv, dkv = torch.stack([k, v]), None
        for hop in range(p if p > 1 else 0):
            carries_kv, carries_grad = hop <= p - 2, hop >= 1
            _, incoming = ring_hop(r, p, hop)
            send = torch.cat(([kv.reshape(-1)] if carries_kv else [])
                             + ([dkv.reshape(-1)] if carries_grad else []))
            one = 2 * b * heads * layout.size(incoming) * d
            recv = kv.new_empty(one * (int(carries_kv) + int(carries_grad)))
            _wait(_post(comm, hop, send, recv))
            if carries_kv:  # the next block: its k/v and (hop >= 1) the others' dk/dv so far
                kv = recv[:one].view(2, b, heads, layout.size(incoming), d)
                dq_b, dk_b, dv_b = block_backward(q, kv[0], kv[1], dout, lse, delta,
                                                  plan(mine, layout.chunks(incoming), causal, q.device))
                dq += dq_b
                dkv = torch.stack([dk_b, dv_b])
                if carries_grad:
                    dkv += recv[one:].view_as(dkv)
            else:  # the last hop: this rank's own block, with every other rank's dk/dv
                home = recv.view(2, b, heads, layout.size(r), d)
                dk, dv = dk + home[0], dv + home[1]
        return dq, dk, dv, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None,
                   layout: SequenceLayout | None = None, causal: bool = True) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence's keys, by ring.

    q, k, v: [b, heads, s_r, d], this rank's tokens as `layout` places them
    (default: a contiguous split with every rank holding s_r tokens). Returns
    this rank's output [b, heads, s_r, d]. Differentiable.
    """
    g = resolve_group(group)
    if layout is None:
        layout = SequenceLayout(q.shape[-2] * g.size, g.size, zigzag=False)
    if layout.parts != g.size:
        raise ValueError(f"rank {g.ranks[g.rank]}: the layout splits the sequence over {layout.parts} "
                         f"ranks but the group has {g.size}")
    if not q.shape[-2] == k.shape[-2] == v.shape[-2] == layout.size(g.rank):
        raise ValueError(f"rank {g.ranks[g.rank]}: q, k, v hold {q.shape[-2]}, {k.shape[-2]}, "
                         f"{v.shape[-2]} tokens but the layout gives this rank {layout.size(g.rank)}")
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), g, layout, causal)
