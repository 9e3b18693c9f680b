"""Attention over blocks of keys, with the online softmax: the arithmetic ring attention needs.

softmax(q k^T) v over all keys can be computed one block of keys at a time
if each block also reports the log of its softmax denominator,
lse = log sum_j exp(s_j). Two partial results merge exactly:

    lse = log(exp(lse_1) + exp(lse_2))
    out = out_1 exp(lse_1 - lse) + out_2 exp(lse_2 - lse)

(the running max and running sum of Milakov & Gimelshein's online softmax,
kept as one number; flash attention and ring attention are built on it).
Backward needs only the final lse: each block's probabilities are
p = exp(s - lse), exactly the global softmax's, so every block's gradient is
computed on its own (flash attention's backward):

    dv = p^T do      dp = do v^T      ds = p (dp - rowsum(do * out))
    dq += ds k / sqrt(d)      dk = ds^T q / sqrt(d)

Tokens are in chunks of consecutive positions (dt.layout.SequenceLayout), so
a causal mask between a query chunk and a key chunk is one of three cases:
every key visible (the key chunk ends at or before the query chunk starts),
none (it starts after the query chunk ends), or the diagonal. Chunks with
nothing visible are skipped: that skipped work is what zig-zag balances.

Tensors are [b, heads, tokens, head_dim]; lse is [b, heads, tokens].
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dt.layout import visible

__all__ = ["Chunks", "attention", "block_backward", "block_forward", "merge", "plan", "visible"]

Chunks = list[tuple[int, int]]  # [start, stop) positions, in local order
BlockPlan = list[tuple[tuple[int, int], list[tuple[int, int]], "torch.Tensor | None"]]


def _local(chunks: Chunks) -> list[tuple[int, int, int, int]]:
    """(local start, local stop, first position, end position) of each chunk."""
    out, lo = [], 0
    for a, z in chunks:
        out.append((lo, lo + z - a, a, z))
        lo += z - a
    return out


def plan(q_chunks: Chunks, k_chunks: Chunks, causal: bool, device: Any = None) -> BlockPlan:
    """For each query chunk with something to see: its local rows, the local key
    ranges it sees, and the mask over those keys (None when it sees them all)."""
    out: BlockPlan = []
    for qlo, qhi, qa, qz in _local(q_chunks):
        keys, masks, partial = [], [], False
        for klo, khi, ka, kz in _local(k_chunks):
            seen = visible((qa, qz), (ka, kz), causal)
            if seen == "none":
                continue
            keys.append((klo, khi))
            if seen == "some":
                partial = True
                masks.append(torch.arange(ka, kz, device=device)[None, :]
                             > torch.arange(qa, qz, device=device)[:, None])
            else:
                masks.append(torch.zeros(qz - qa, kz - ka, dtype=torch.bool, device=device))
        if keys:
            out.append(((qlo, qhi), keys, torch.cat(masks, dim=1) if partial else None))
    return out


def _keys(t: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([t[..., lo:hi, :] for lo, hi in ranges], dim=-2) if len(ranges) > 1 else \
        t[..., ranges[0][0]:ranges[0][1], :]


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (rows that saw no key) replaced by 0, so exp(s - lse) is 0, not nan."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, lse: torch.Tensor | None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - _finite(lse)[..., None]), lse


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: BlockPlan
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the queries q over the keys/values k, v alone (rows that see nothing: 0, -inf)."""
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])
    lse = q.new_full(q.shape[:-1], float("-inf"))
    for (lo, hi), keys, mask in p:
        probs, lse_c = _probs(q[..., lo:hi, :], _keys(k, keys), mask, None)
        out[..., lo:hi, :] = probs @ _keys(v, keys)
        lse[..., lo:hi] = lse_c
    return out, lse


def merge(out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attentions over disjoint key sets into one (the online softmax)."""
    new = torch.logaddexp(lse, lse_b)
    safe = _finite(new)
    out = out * torch.exp(lse - safe)[..., None] + out_b * torch.exp(lse_b - safe)[..., None]
    return out, new


def block_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                   lse: torch.Tensor, delta: torch.Tensor, p: BlockPlan
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) contributed by one key/value block, given the FINAL lse and
    delta = rowsum(dout * out) of the whole attention."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    for (lo, hi), keys, mask in p:
        qc, doc = q[..., lo:hi, :], dout[..., lo:hi, :]
        kc, vc = _keys(k, keys), _keys(v, keys)
        probs, _ = _probs(qc, kc, mask, lse[..., lo:hi])
        dv_c = probs.transpose(-2, -1) @ doc
        ds = probs * (doc @ vc.transpose(-2, -1) - delta[..., lo:hi, None])
        dq[..., lo:hi, :] += ds @ kc * scale
        dk_c = ds.transpose(-2, -1) @ qc * scale
        start = 0
        for klo, khi in keys:  # scatter back to the keys' own rows
            dk[..., klo:khi, :] += dk_c[..., start:start + khi - klo, :]
            dv[..., klo:khi, :] += dv_c[..., start:start + khi - klo, :]
            start += khi - klo
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d)) v with chunked causal masking, flash-style backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: BlockPlan) -> torch.Tensor:
        out, lse = block_forward(q, k, v, p)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = p
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        dq, dk, dv = block_backward(q, k, v, dout, lse, (dout * out).sum(-1), ctx.plan)
        return dq, dk, dv, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_chunks: Chunks, k_chunks: Chunks,
              causal: bool = True) -> torch.Tensor:
    """Attention of queries at q_chunks' positions over keys at k_chunks' positions, on one rank."""
    return _Attention.apply(q, k, v, plan(q_chunks, k_chunks, causal, q.device))
