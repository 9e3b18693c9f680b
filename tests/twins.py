"""Unsharded twins of dt's tensor-parallel layers, for the tests only.

Each is built from plain torch layers right after the same seed as its
sharded twin, so the sharded layer must hold exact slices of its parameters
and reproduce its outputs and gradients (tests/test_tensor_parallel.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.parallel.tensor.attention import attention, split_heads

__all__ = ["MLP", "SelfAttention"]


class MLP(nn.Module):
    """The unsharded reference: Linear(h, ffn), GELU, Linear(ffn, h)."""

    def __init__(self, hidden: int, ffn_hidden: int | None = None, bias: bool = True, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        self.dense_h_to_4h = nn.Linear(hidden, ffn_hidden, bias=bias, dtype=dtype, device=device)
        self.dense_4h_to_h = nn.Linear(ffn_hidden, hidden, bias=bias, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class SelfAttention(nn.Module):
    """The unsharded reference: fused QKV projection, softmax attention, output projection.

    The QKV weight's rows are laid out per head, [q_0 k_0 v_0 q_1 k_1 v_1 ...]
    (Megatron's layout), so a contiguous slice of rows is a set of whole heads.
    """

    def __init__(self, hidden: int, num_heads: int, causal: bool = True, bias: bool = True, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        if hidden % num_heads:
            raise ValueError(f"hidden size {hidden} is not divisible by num_heads {num_heads}")
        self.num_heads, self.causal = num_heads, causal
        self.query_key_value = nn.Linear(hidden, 3 * hidden, bias=bias, dtype=dtype, device=device)
        self.dense = nn.Linear(hidden, hidden, bias=bias, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = split_heads(self.query_key_value(x), self.num_heads)
        context = attention(q, k, v, self.causal)  # [b, heads, s, d]
        b, _, s, _ = context.shape
        return self.dense(context.transpose(1, 2).reshape(b, s, -1))
