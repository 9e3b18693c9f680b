"""A Llama-style decoder, written plainly: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention.

    model = Llama(LlamaConfig(vocab_size=256, block_size=64, n_head=4, n_kv_head=2))
    logits, loss = model(ids, targets)

What differs from GPT-2 (dt/models/gpt.py), each for a reason:

- RMSNorm instead of LayerNorm: x / rms(x) * g, no mean subtracted and no bias;
  as good in practice and cheaper.
- Rotary position embeddings (RoPE) instead of a learned position table: each
  (i, i + d/2) pair of a query's and key's coordinates is rotated by the angle
  position * theta^(-2i/d), so q . k depends on positions only through their
  difference. Nothing to learn, and no table to outgrow.
- SwiGLU MLP: down(silu(gate(x)) * up(x)), with the hidden width 2/3 of 4h
  (rounded up to a multiple) so it costs what GPT's 4h MLP does.
- Grouped-query attention: n_kv_head key/value heads shared by n_head query
  heads (n_head / n_kv_head queries per group), which shrinks the KV cache.
- No biases anywhere; the head is a separate matrix unless `tied`.

Module names follow Hugging Face's LlamaForCausalLM (embed_tokens,
layers.{i}.self_attn.q_proj ... mlp.down_proj, norm, lm_head), so a plan written
for one names the other's modules too. Rotation follows its "rotate half" convention.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.models.lm import CausalAttention, LanguageModel, NextTokenLoss

__all__ = ["Llama", "LlamaConfig", "RMSNorm", "Rotary", "apply_rotary", "rotary_tables"]


@dataclass
class LlamaConfig:
    vocab_size: int = 64
    block_size: int = 32  # the longest sequence the rotary tables cover
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2  # key/value heads; n_head must be a multiple (n_kv_head = n_head: plain MHA)
    n_embd: int = 64
    ffn_multiple_of: int = 32  # SwiGLU's hidden width is rounded up to a multiple of this
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tied: bool = False
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd",
                     "ffn_multiple_of"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"LlamaConfig: n_embd {self.n_embd} / n_head {self.n_head} must be a whole, "
                             "even head size (rotary embeddings turn coordinates in pairs)")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"LlamaConfig: n_head {self.n_head} is not a multiple of n_kv_head "
                             f"{self.n_kv_head} (each key/value head serves a whole group of queries)")
        if not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(f"LlamaConfig.dtype {self.dtype!r} is not a torch dtype")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_hidden(self) -> int:
        width = int(2 * 4 * self.n_embd / 3)
        return -(-width // self.ffn_multiple_of) * self.ffn_multiple_of

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in at least float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # host: moved with the model (.to)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rotary_tables(head_dim: int, positions: int, theta: float = 10_000.0,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [positions, head_dim]: angle p * theta^(-2i/d) for pair i, repeated for both halves."""
    # Built on the host in float64 (angles up to block_size radians keep their digits), then
    # registered as buffers, which follow the model's .to(device).
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # host: buffer
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)  # host: buffer
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Rotary(nn.Module):
    """The rotary tables, looked up by position: positions [s] -> cos, sin [s, head_dim].

    A module called with the positions (not a slice taken in forward), so a
    context-parallel plan can hand it this rank's positions instead of 0..s-1.
    """

    def __init__(self, head_dim: int, positions: int, theta: float, dtype: torch.dtype):
        super().__init__()
        cos, sin = rotary_tables(head_dim, positions, theta, dtype)
        # Buffers follow .to(device) but are not weights: not saved in checkpoints.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions], self.sin[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + d/2) pair of x [b, heads, s, d] by its position's angle (cos, sin: [s, d])."""
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)
    return x * cos + rotated_half * sin


class Attention(nn.Module):
    """Causal grouped-query attention with rotary embeddings on q and k."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.queries_per_kv = cfg.n_head // cfg.n_kv_head
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.attend = CausalAttention()  # context parallelism swaps this for ring attention / Ulysses

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(x)
        # Head counts and length come from the projections, so a tensor-parallel shard (whole
        # heads) runs alike, as would a sequence-parallel one (x: this rank's tokens only).
        b, s, _ = q.shape
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Query head j reads key/value head j // queries_per_kv.
        k = k.repeat_interleave(self.queries_per_kv, dim=1)
        v = v.repeat_interleave(self.queries_per_kv, dim=1)
        y = self.attend(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(LanguageModel):
    """embed_tokens, layers, norm, lm_head; forward returns (logits, mean loss or None)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        for m in self.modules():  # Llama's init: N(0, 0.02) for every matrix
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        if cfg.tied:
            self.lm_head.weight = self.embed_tokens.weight
        dtype = getattr(torch, cfg.dtype)
        self.to(dtype)
        self.rotary = Rotary(cfg.head_dim, cfg.block_size, cfg.rope_theta, dtype)
        self.loss = NextTokenLoss()  # a module, so a plan can swap it (vocab-parallel, context-parallel)

    @property
    def rope_cos(self) -> torch.Tensor:
        """The rotary tables for positions 0..block_size-1 (rotary(positions) looks them up)."""
        return self.rotary.cos

    @property
    def rope_sin(self) -> torch.Tensor:
        return self.rotary.sin

    def forward(self, ids: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        s = ids.shape[1]
        if s > self.cfg.block_size:
            raise ValueError(f"a sequence of {s} tokens is longer than block_size {self.cfg.block_size}")
        x = self.embed_tokens(ids)
        cos, sin = self.rotary(torch.arange(s, device=ids.device))
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits, None
        return logits, self.loss(logits, targets)

