"""What every plain language model here shares: its loss and autoregressive sampling."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LanguageModel", "lm_loss", "sample"]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits [b, s, V] against targets [b, s].

    Half-precision logits are upcast for the softmax (its sums lose digits in
    16 bits); float32 and float64 stay as they are.
    """
    wide = logits.flatten(0, 1).to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(wide, targets.flatten())


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
