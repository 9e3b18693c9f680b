"""Context parallelism's attention, one rank's local work, for the planner's timing (dt.plan.timed).

dt train's cp attention is not torch's fused kernel: it is dt.parallel.context's
block attention (dt.parallel.context.blocks: per-chunk masks, an online-softmax
merge per key block, a flash-style backward per block), which on this
machine's tiny shapes costs about twice the stand-in block's softmax(q k^T) v
(CPU time of one rank of dp1.cp2: 54 ms a step measured against 23 ms
predicted). So the planner times the same local calls on one rank, the
messages left out (priced apart, dt.plan.stage):

    ring     forward: cp calls of block_forward, one per key block the ring
             brings (queries this rank's zig-zag chunks), merged; backward:
             this rank's own block, then cp - 1 more, each hop's message
             packed as dt's ring packs it (cat of k/v and the dk/dv so far)
    ulysses  q, k, v stacked, split by heads and joined along the sequence as
             the all-to-all's pieces are, attention over the whole sequence
             in layout order on heads / cp heads, split back

Rank 0 of the cp group is timed: zig-zag gives every rank the same work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dt.layout import SequenceLayout, ring_hop
from dt.parallel.context.blocks import attention, block_backward, block_forward, merge, plan
from dt.parallel.context.style import sequence_layout

__all__ = ["LocalContextCore"]


class _LocalRing(torch.autograd.Function):
    """Ring attention's compute on rank 0 of cp (dt.parallel.context.ring_attention), no messages:
    the key blocks other ranks would send are this rank's own (every block is the same size)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: SequenceLayout
                ) -> torch.Tensor:
        parts, mine = layout.parts, layout.chunks(0)
        kv = torch.stack([key, value])
        out = lse = None
        for hop in range(parts):
            held = (0 - hop) % parts
            part = block_forward(query, kv[0], kv[1], plan(mine, layout.chunks(held), True, query.device))
            out, lse = part if out is None else merge(out, lse, *part)
            kv = kv.clone() if hop < parts - 1 else kv  # the block received: a fresh buffer
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.layout = layout
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, out, lse = ctx.saved_tensors
        layout = ctx.layout
        parts, mine = layout.parts, layout.chunks(0)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        dq, dk, dv = block_backward(query, key, value, dout, lse, delta, plan(mine, mine, True, query.device))
        kv, dkv = torch.stack([key, value]), None
        for hop in range(parts):
            carries_kv, carries_grad = hop <= parts - 2, hop >= 1
            _, incoming = ring_hop(0, parts, hop)
            send = torch.cat(([kv.reshape(-1)] if carries_kv else [])
                             + ([dkv.reshape(-1)] if carries_grad else []))
            recv = send.clone()  # what the neighbour's message would fill
            one = kv.numel()
            if carries_kv:
                kv = recv[:one].view_as(kv)
                pairs = plan(mine, layout.chunks(incoming), True, query.device)
                dq_block, dk_block, dv_block = block_backward(query, kv[0], kv[1], dout, lse, delta, pairs)
                dq += dq_block
                dkv = torch.stack([dk_block, dv_block]) + (recv[one:].view_as(kv) if carries_grad else 0)
            else:
                home = recv.view(2, *key.shape)
                dk, dv = dk + home[0], dv + home[1]
        return dq, dk, dv, None


def _local_ulysses(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   layout: SequenceLayout) -> torch.Tensor:
    """Ulysses's compute on one rank (dt.parallel.context.ulysses), the all-to-alls' pieces kept here."""
    parts = layout.parts
    _, heads, _, _ = query.shape
    per_rank = heads // parts
    qkv = torch.stack([query, key, value])
    got = [qkv[:, :, j * per_rank:(j + 1) * per_rank].contiguous() for j in range(parts)]  # as received
    full = torch.cat(got, dim=3)  # [3, b, H/cp, S, d]
    order = [chunk for rank in range(parts) for chunk in layout.chunks(rank)]
    out = attention(*full, order, order, True)
    back = [piece.contiguous() for piece in out.split(layout.sizes(), dim=2)]
    return torch.cat(back, dim=1)  # [b, H, s_r, d]


class LocalContextCore(nn.Module):
    """The attention core a cp rank runs (q, k, v of its tokens -> its output), without messages."""

    def __init__(self, kind: str, seq: int, cp: int):
        super().__init__()
        if kind not in ("ring", "ulysses"):
            raise ValueError(f"context-parallel attention is ring or ulysses, got {kind!r}")
        self.kind, self.layout = kind, sequence_layout(seq, cp)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        if query.shape[-2] != self.layout.size(0):
            raise ValueError(f"LocalContextCore: rank 0 of cp {self.layout.parts} holds "
                             f"{self.layout.size(0)} tokens, got {query.shape[-2]}")
        if self.kind == "ring":
            return _LocalRing.apply(query.contiguous(), key.contiguous(), value.contiguous(), self.layout)
        return _local_ulysses(query, key, value, self.layout)
