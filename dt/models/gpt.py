"""The GPT dt trains, written plainly: no parallelism inside, one forward pass to read.

    model = GPT(GPTConfig(vocab_size=256, block_size=64))
    logits, loss = model(ids, targets)          # ids, targets: [batch, seq] token ids
    more = model.generate(ids, max_new_tokens=20)

GPT-2's shape, pre-norm: token + position embedding, n_layer blocks of
x + attn(ln(x)) then x + mlp(ln(x)), a final layer norm and the head (tied to
the token embedding unless `tied=False`). Tensor, sequence, pipeline and data
parallelism are applied to this model from outside, by swapping its modules
(`dt.parallelize`), never written into it. With `n_experts > 0` every block's
MLP is a mixture of experts (dt/models/moe.py): its balance loss, per
sequence, reaches the gradients (not the returned loss).

The model is a list of layers, [Embedding, Block x n_layer, Head], named
`layers.{i}.<name>` (the names every dt train checkpoint uses), so a
pipeline can cut the list anywhere.
Layer i, part j is built right after `seed_layer(cfg, i, j)`: the same
config and seed give the same weights, bit for bit, on every rank and grid.

The fused QKV weight's rows are laid out per head, [q_0 k_0 v_0 q_1 k_1 v_1 ...]
(Megatron's layout, as dt.parallel.tensor's attention reads it): a contiguous
slice of rows is a set of whole heads, so a column-parallel split keeps heads whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.models.lm import CausalAttention, LanguageModel, NextTokenLoss
from dt.models.moe import MoE

__all__ = ["GPT", "GPTConfig", "seed_layer"]


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32  # the longest sequence: the position table's length
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    tied: bool = True  # the head's weight is the token embedding's
    seed: int = 0
    dtype: str = "float32"
    n_experts: int = 0  # > 0: every block's MLP is a mixture of this many experts (dt/models/moe.py)
    top_k: int = 1
    capacity_factor: float | None = None  # None: no token is ever dropped
    aux_loss_coef: float = 0.01  # weight of the load-balancing loss

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"GPTConfig.dtype {self.dtype!r} is not a torch dtype")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.top_k <= self.n_experts):
            raise ValueError(f"GPTConfig: top_k {self.top_k} must be between 1 and n_experts "
                             f"{self.n_experts} (n_experts 0: a dense MLP)")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def seed_layer(cfg: Any, layer: int, part: int) -> None:
    """The RNG state layer `layer`'s part `part` is built from: the same on every rank and mesh."""
    torch.manual_seed(cfg.seed * 100_003 + layer * 16 + part)


class Embedding(nn.Module):
    """Token plus position embedding: [b, s] ids -> [b, s, h]."""

    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        seed_layer(cfg, layer, 0)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        seed_layer(cfg, layer, 1)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        with torch.no_grad():  # GPT-2's scale; nn.Embedding's N(0, 1) makes huge tied logits
            self.wte.weight.mul_(0.02)
            self.wpe.weight.mul_(0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: fused QKV (per-head layout), softmax(q k^T / sqrt(d)) v, output."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.n_embd // cfg.n_head
        self.query_key_value = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.dense = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.attend = CausalAttention()  # context parallelism swaps this for ring attention / Ulysses

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.query_key_value(x)
        # [b, s, heads * 3d] -> [b, heads, s, 3d] -> q, k, v of [b, heads, s, d]. The head count
        # and length come from qkv, so a tensor-parallel shard (whole heads, fewer) runs alike, as
        # does sequence parallelism (x: this rank's tokens, qkv: the whole sequence's).
        b, s, _ = qkv.shape
        q, k, v = qkv.view(b, s, -1, 3 * self.head_dim).transpose(1, 2).chunk(3, dim=-1)
        y = self.attend(q, k, v)
        return self.dense(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """Linear(h, 4h), GELU, Linear(4h, h)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.dense_4h_to_h = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)); the MLP may be an MoE."""

    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        seed_layer(cfg, layer, 0)
        self.attn = CausalSelfAttention(cfg)
        seed_layer(cfg, layer, 1)
        self.mlp = MoE(cfg.n_embd, 4 * cfg.n_embd, cfg.n_experts, cfg.top_k, cfg.capacity_factor,
                       cfg.aux_loss_coef) if cfg.n_experts else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Head(nn.Module):
    """Final layer norm and the output projection: [b, s, h] -> [b, s, vocab] logits."""

    def __init__(self, cfg: GPTConfig, layer: int, wte: nn.Parameter):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.weight: nn.Parameter | None = wte if cfg.tied else None
        self.lm_head: nn.Linear | None = None
        if not cfg.tied:
            seed_layer(cfg, layer, 0)
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_f(x)
        return self.lm_head(x) if self.lm_head is not None else F.linear(x, self.weight)


class GPT(LanguageModel):
    """layers = [Embedding, Block x n_layer, Head]; forward returns (logits, mean loss or None)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        embedding = Embedding(cfg, 0)
        blocks = [Block(cfg, i) for i in range(1, cfg.n_layer + 1)]
        head = Head(cfg, cfg.n_layer + 1, embedding.wte.weight)
        self.layers = nn.ModuleList([embedding, *blocks, head]).to(getattr(torch, cfg.dtype))
        self.loss = NextTokenLoss()  # a module, so a plan can swap it (vocab-parallel, context-parallel)

    def forward(self, ids: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if ids.shape[1] > self.cfg.block_size:
            raise ValueError(f"a sequence of {ids.shape[1]} tokens is longer than block_size "
                             f"{self.cfg.block_size}")
        x = ids
        for layer in self.layers:
            x = layer(x)
        if targets is None:
            return x, None
        return x, self.loss(x, targets)


