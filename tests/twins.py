"""Unsharded twins of dt's parallel layers, for the tests only.

Each is built from plain torch layers right after the same seed as its
sharded twin, so the sharded layer must hold exact slices of its parameters
and reproduce its outputs and gradients (tests/test_tensor_parallel.py,
test_expert_parallel.py, test_context_parallel.py). The MoE and attention
twins are written plainly and independently of dt's code: dense experts and
masks, Python loops for the capacity, a triangular mask on the whole sequence.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.parallel.tensor.attention import attention, split_heads

__all__ = ["MLP", "MoETwin", "SelfAttention", "whole_attention"]


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


class MoETwin(nn.Module):
    """The unsharded reference: dense experts, masks, and per-sequence loops."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, capacity_factor: float | None):
        super().__init__()
        f64 = torch.float64
        self.router = nn.Linear(hidden, experts, bias=False, dtype=f64)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, ffn, dtype=f64), nn.GELU(), nn.Linear(ffn, hidden, dtype=f64))
            for _ in range(experts))
        self.k, self.cf, self.E = top_k, capacity_factor, experts

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        B, S, _ = x.shape
        probs = self.router(x).softmax(-1)
        top, idx = probs.topk(self.k, dim=-1)
        gates = top if self.k == 1 else top / top.sum(-1, keepdim=True)
        keep = torch.ones_like(idx, dtype=torch.bool)
        if self.cf is not None:
            cap = math.ceil(self.cf * self.k * S / self.E)
            for b in range(B):
                taken = [0] * self.E
                for j in range(self.k):  # first choices claim places before second choices
                    for t in range(S):
                        e = int(idx[b, t, j])
                        if taken[e] >= cap:
                            keep[b, t, j] = False
                        else:
                            taken[e] += 1
        every = torch.stack([expert(x) for expert in self.experts])  # [E, B, S, h]
        y = torch.zeros_like(x)
        for j in range(self.k):
            chosen = every.gather(0, idx[..., j][None, ..., None].expand(1, B, S, x.shape[-1]))[0]
            y = y + chosen * (gates[..., j] * keep[..., j])[..., None]
        f = F.one_hot(idx, self.E).sum(dim=(1, 2)).to(torch.float64) / (S * self.k)
        aux = self.E * (f * probs.mean(dim=1)).sum(-1)
        return y, aux, int((~keep).sum())


def whole_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v on the whole sequence, in position order, triangular mask if causal."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v
