"""What a stage's arithmetic costs: FLOPs of each layer, priced on the cluster.

Forward FLOPs of one block on one rank, for b sequences of t local tokens
(t = T / cp) against T keys, hidden C, MLP hidden F, tp ranks (Megatron's
count; a multiply-add is 2 FLOPs):

    projections  2 b t (4 C^2 + k C F) / tp      (k = 2 matrices, 3 gated; x top_k for MoE)
    attention    4 b t T C / tp                  (Q K^T and A V over every key: dt masks, not skips)
    head         2 b t C V / tp                  (the vocabulary-parallel logits)

backward is twice the forward; full recompute runs the forward once more.

On a catalogue cluster the seconds are FLOPs / (peak x stated efficiency).
On this machine the rate is measured at the layer's own shapes: one block
(and the head) of this rank's shard is built and timed forward and backward
with the threads each rank gets (cores / world), and the FLOPs above
divided by that time; tiny layers are bound by the ops' fixed costs, not by
arithmetic, and this catches both.
"""

from __future__ import annotations

import functools
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from dt.plan.cluster import Cluster
from dt.plan.model import ModelShape

__all__ = ["Shard", "block_flops", "head_flops", "layer_seconds"]


@functools.cache
def _shard_shape(model: ModelShape, tp: int) -> tuple[int, int, int]:
    return model.n_embd, model.n_head // tp, model.hidden // tp


def block_flops(model: ModelShape, b: int, t: int, keys: int, tp: int) -> float:
    """Forward FLOPs of one block on one rank (the module doc's count)."""
    c, f = model.n_embd, model.hidden
    mats = 3 if model.gated else 2
    mlp = mats * c * f * (model.top_k if model.experts else 1)
    return (2 * b * t * (4 * c * c + mlp) + 4 * b * t * keys * c) / tp


def head_flops(model: ModelShape, b: int, t: int, tp: int) -> float:
    return 2 * b * t * model.n_embd * model.vocab / tp


class Shard(nn.Module):
    """One rank's slice of a block (tp-sharded widths), for timing only: the same matmuls and sizes."""

    def __init__(self, c: int, heads: int, head_dim: int, hidden: int, gated: bool):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * heads * head_dim), nn.Linear(heads * head_dim, c)
        self.up = nn.Linear(c, (2 if gated else 1) * hidden)
        self.down = nn.Linear(hidden, c)
        self.gated = gated

    def forward(self, x: torch.Tensor, keys: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if keys != t:  # ring attention: this rank's queries against every key (as many blocks)
            k, v = k.repeat(1, 1, keys // t, 1), v.repeat(1, 1, keys // t, 1)
        a = F.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        h = self.up(self.ln2(x))
        h = F.silu(h.chunk(2, -1)[0]) * h.chunk(2, -1)[1] if self.gated else F.gelu(h)
        return x + self.down(h)


def _time(fn, reps: int = 5) -> float:
    fn()  # warm: allocations, kernels chosen
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return sorted(samples)[len(samples) // 2]


@functools.cache
def _measured(kind: str, model: ModelShape, b: int, t: int, keys: int, tp: int, threads: int,
              dtype: str) -> float:
    """Seconds of forward + backward of one layer of this shard, timed here (median of 5)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        dt_ = getattr(torch, dtype)
        c, heads, hidden = _shard_shape(model, tp)
        x = torch.randn(b, t, c, dtype=dt_, requires_grad=True)
        if kind == "block":
            layer = Shard(c, heads, model.n_embd // model.n_head, hidden, model.gated).to(dt_)
            run = lambda: layer(x, keys).sum().backward()  # noqa: E731
        else:
            w = torch.randn(model.vocab // tp or 1, c, dtype=dt_, requires_grad=True)
            run = lambda: F.linear(F.layer_norm(x, (c,)), w).logsumexp(-1).sum().backward()  # noqa: E731
        return _time(run)
    finally:
        torch.set_num_threads(old)


def layer_seconds(cluster: Cluster, kind: str, model: ModelShape, b: int, t: int, keys: int,
                  tp: int, world: int) -> tuple[float, float]:
    """(forward, backward) seconds of one block or head on one rank of `cluster`."""
    flops = block_flops(model, b, t, keys, tp) if kind == "block" else head_flops(model, b, t, tp)
    if cluster.flops > 0:
        return flops / cluster.flops, 2 * flops / cluster.flops
    cores = os.cpu_count() or 1
    threads = max(1, cores // world)
    total = _measured(kind, model, b, t, keys, tp, threads, {4: "float32", 8: "float64"}[cluster.itemsize])
    total *= max(1.0, world * threads / cores)  # more ranks than cores: they take turns on them
    return total / 3, 2 * total / 3  # the forward : backward split of the FLOPs, 1 : 2
