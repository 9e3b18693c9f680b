"""Self-attention with its heads split across the tensor-parallel group.

The fused QKV weight's rows are laid out per head, [q_0 k_0 v_0 q_1 k_1 v_1 ...]
(Megatron's layout), so a contiguous slice of rows, which is what a
ColumnParallelLinear holds, is a set of whole heads. `attention` and
`split_heads` are the arithmetic the unsharded twin (tests/twins.py) runs too.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from dt.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from dt.transport import resolve_group

__all__ = ["ParallelSelfAttention", "attention", "split_heads"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over [b, heads, s, d], with a causal mask if asked."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(-1) @ v


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[b, s, heads*3*d] laid out per head (q, k, v of head 0, then head 1, ...) -> three [b, heads, s, d]."""
    b, s, width = qkv.shape
    qkv = qkv.view(b, s, heads, width // heads).transpose(1, 2)
    return qkv.chunk(3, dim=-1)


class ParallelSelfAttention(nn.Module):
    """Self-attention with its heads split across the group.

    Heads are independent, so rank r computes heads
    [r*H/p, (r+1)*H/p) end to end: its slice of the fused QKV projection
    (column parallel: whole heads, thanks to the per-head layout), attention
    over those heads, and the matching input columns of the output projection
    (row parallel). num_heads must be divisible by the group size.

    Cost per rank, n = b*s*h*itemsize: forward one all-reduce of n (after the
    output projection), backward one all-reduce of n (the input gradient),
    as for the MLP. Sequence parallel: all-gather + reduce-scatter instead.
    """

    def __init__(self, hidden: int, num_heads: int, group: Any = None, causal: bool = True, *,
                 bias: bool = True, sequence_parallel: bool = False,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        g = resolve_group(group)
        if hidden % num_heads:
            raise ValueError(f"hidden size {hidden} is not divisible by num_heads {num_heads}")
        if num_heads % g.size:
            raise ValueError(f"num_heads {num_heads} is not divisible by the tensor-parallel group "
                             f"size {g.size}: attention heads are split whole across ranks")
        self.group, self.causal = g, causal
        self.num_heads = num_heads
        self.num_heads_per_partition = num_heads // g.size
        self.query_key_value = ColumnParallelLinear(hidden, 3 * hidden, bias, gather_output=False,
                                                    group=g, sequence_parallel=sequence_parallel,
                                                    dtype=dtype, device=device)
        self.dense = RowParallelLinear(hidden, hidden, bias, input_is_parallel=True, group=g,
                                       sequence_parallel=sequence_parallel, dtype=dtype,
                                       device=device)

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        q, k, v = split_heads(self.query_key_value(x, seq_len), self.num_heads_per_partition)
        context = attention(q, k, v, self.causal)  # [b, local heads, s, d]
        b, _, s, _ = context.shape
        return self.dense(context.transpose(1, 2).reshape(b, s, -1))
