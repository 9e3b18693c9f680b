"""What every plain language model here shares: its loss, its attention core and sampling.

The loss and the attention core are modules (not calls written into
forward) so that parallelism can be applied from outside by swapping them
(dt.parallel.plan): `NextTokenLoss.per_token` for a vocabulary-parallel
cross-entropy, `CausalAttention` for ring attention or Ulysses over a
context-parallel group. Plain, they are F.cross_entropy and
F.scaled_dot_product_attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CausalAttention", "CrossEntropy", "LanguageModel", "NextTokenLoss", "lm_loss", "sample"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits [b, s, V] against targets [b, s].

    Half-precision logits are upcast for the softmax (its sums lose digits in
    16 bits); float32 and float64 stay as they are.
    """
    return per_token_loss(logits, targets).mean()


def per_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every token, [b, s], half precision upcast for the softmax."""
    wide = logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(wide, targets.flatten(), reduction="none").view(targets.shape)


class CrossEntropy(nn.Module):
    """Per-token cross-entropy of logits [b, s, V] against targets [b, s] -> [b, s]."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return per_token_loss(logits, targets)


class NextTokenLoss(nn.Module):
    """The mean over tokens of `per_token` (a CrossEntropy): the model's loss.

    Split in two so each part can be swapped alone: per_token for one that
    reads vocabulary-sharded logits, the mean for one over a sequence's share.
    """

    def __init__(self) -> None:
        super().__init__()
        self.per_token = CrossEntropy()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.per_token(logits, targets).mean()


class CausalAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + causal mask) v over q, k, v [b, heads, s, d]: attention's core."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@torch.no_grad()
def sample(model: nn.Module, ids: torch.Tensor, block_size: int, max_new_tokens: int,
           temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Append max_new_tokens tokens to ids [b, s], each drawn from model(last block_size ids)[0].

    temperature 0 takes the most likely token; top_k keeps only the k most likely.
    """
    if temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"sample: temperature must be >= 0 and top_k >= 1, got {temperature}, {top_k}")
    for _ in range(max_new_tokens):
        logits = model(ids[:, -block_size:])[0][:, -1, :].float()
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        ids = torch.cat([ids, nxt], dim=1)
    return ids


class LanguageModel(nn.Module):
    """What every plain model here shares: its size and its sampling (`cfg.block_size` the context)."""

    cfg: object

    def num_params(self) -> int:
        """Parameters counted once (a tied head's weight is the embedding's)."""
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to ids [b, s] (temperature 0: the most likely)."""
        return sample(self, ids, self.cfg.block_size, max_new_tokens, temperature, top_k, generator)
