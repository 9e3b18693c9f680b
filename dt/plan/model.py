"""The model a plan is for: dt's GPT shape (its flags) or a named preset of a public shape.

dt's GPT block: attention (q, k, v and output projections, 4 C^2 weights)
and an MLP of hidden F (2 C F weights; 3 C F when gated, as Llama's SwiGLU),
two LayerNorms; a word embedding of V x C (tied with the head unless
untied) and a learned position embedding of T x C.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["PRESETS", "ModelShape", "preset"]


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_head: int
    n_embd: int
    vocab: int
    ffn: int = 0  # MLP hidden size; 0: 4 * n_embd (GPT)
    gated: bool = False  # three MLP matrices (SwiGLU) instead of two
    tied: bool = True
    experts: int = 0
    top_k: int = 1
    name: str = "gpt"

    @property
    def hidden(self) -> int:
        return self.ffn or 4 * self.n_embd

    def block_params(self) -> int:
        """Weights of one block (biases and norms included), unsharded; an MoE block's every expert."""
        c, f = self.n_embd, self.hidden
        mlp = (3 if self.gated else 2) * c * f + f + c
        router = c * self.experts if self.experts else 0
        return 4 * c * c + 4 * c + 4 * c + mlp * max(1, self.experts) + router

    def params(self, seq: int) -> int:
        """Every weight of the model, unsharded (the tied head counted once)."""
        embed = self.vocab * self.n_embd * (1 if self.tied else 2) + seq * self.n_embd
        return embed + self.n_layer * self.block_params() + 2 * self.n_embd


# Public shapes (GPT-2: Radford et al. 2019; Llama: Touvron et al. 2023), as dt's block.
PRESETS = {
    "gpt2": ModelShape(12, 12, 768, 50257, name="gpt2"),
    "gpt2-350m": ModelShape(24, 16, 1024, 50257, name="gpt2-350m"),
    "gpt2-1.5b": ModelShape(48, 25, 1600, 50257, name="gpt2-1.5b"),
    "llama-7b": ModelShape(32, 32, 4096, 32000, ffn=11008, gated=True, tied=False, name="llama-7b"),
    "llama-13b": ModelShape(40, 40, 5120, 32000, ffn=13824, gated=True, tied=False, name="llama-13b"),
    "llama-70b": ModelShape(80, 64, 8192, 32000, ffn=28672, gated=True, tied=False, name="llama-70b"),
}


def preset(name: str, **changes: object) -> ModelShape:
    """A preset by name (KeyError names the choices), with fields changed."""
    if name not in PRESETS:
        raise KeyError(f"no model preset {name!r}; one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)
