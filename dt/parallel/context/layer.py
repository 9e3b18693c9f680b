"""Self-attention over a sequence split across a context-parallel group (and heads across tp).

The same projections as dt.parallel.tensor.ParallelSelfAttention (built after
the same seed they hold the same weights), so a model switches context
parallelism on without changing its parameters: the fused QKV projection
and the output projection are per token and run on this rank's tokens; only
the attention in between sees the whole sequence, by ring attention or
Ulysses over the cp group, on this rank's tensor-parallel heads.

    x [b, s_r, h] -> QKV (column parallel) -> q, k, v [b, H/tp, s_r, d]
      -> ring_attention / ulysses_attention over cp -> [b, H/tp, s_r, d]
      -> output projection (row parallel) -> [b, s_r, h]

Ulysses splits the tp rank's heads again over cp: H must divide by tp * cp.
Cost per rank: the tensor-parallel all-reduces (dt.parallel.tensor) on
s_r tokens, plus dt.cost.ring_attention_traffic or dt.cost.ulysses_traffic.
"""

from __future__ import annotations

from typing import Any

import torch

from dt.layout import SequenceLayout
from dt.parallel.context.ring_attention import ring_attention
from dt.parallel.context.ulysses import ulysses_attention
from dt.parallel.tensor.attention import ParallelSelfAttention, split_heads
from dt.transport import resolve_group

__all__ = ["KINDS", "ContextParallelSelfAttention"]

KINDS = {"ring": ring_attention, "ulysses": ulysses_attention}


class ContextParallelSelfAttention(ParallelSelfAttention):
    """ParallelSelfAttention whose attention spans the tokens of every rank of `cp_group`."""

    def __init__(self, hidden: int, num_heads: int, tp_group: Any, cp_group: Any,
                 layout: SequenceLayout, kind: str = "ring", causal: bool = True, *,
                 bias: bool = True, dtype: torch.dtype | None = None, device: Any = None):
        super().__init__(hidden, num_heads, tp_group, causal, bias=bias, dtype=dtype, device=device)
        if kind not in KINDS:
            raise ValueError(f"context-parallel attention is one of {sorted(KINDS)}, got {kind!r}")
        self.cp_group, self.layout, self.kind = resolve_group(cp_group), layout, kind
        if kind == "ulysses" and self.num_heads_per_partition % self.cp_group.size:
            raise ValueError(f"Ulysses splits the {self.num_heads_per_partition} heads of each "
                             f"tensor-parallel rank over cp = {self.cp_group.size}: {num_heads} heads "
                             f"must divide by tp * cp; use ring attention")

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        q, k, v = split_heads(self.query_key_value(x, seq_len), self.num_heads_per_partition)
        context = KINDS[self.kind](q, k, v, self.cp_group, self.layout, self.causal)
        b, _, s, _ = context.shape
        return self.dense(context.transpose(1, 2).reshape(b, s, -1))
