"""The model a plan is for: dt's GPT shape (its flags) or a named preset of a public shape.

dt's GPT block: attention (q, k, v and output projections, 4 C^2 weights)
and an MLP of hidden F (2 C F weights; 3 C F when gated, as Llama's SwiGLU),
two LayerNorms; a word embedding of V x C (tied with the head unless
untied) and a learned position embedding of T x C. `family="llama"` is
dt.models.llama's: no biases, RMSNorm, rotary positions (no table), grouped
key/value heads (n_kv_head) and SwiGLU (gated) of dt's rounded width.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dt.cost.flops import Decoder
from dt.models.llama import LlamaConfig

__all__ = ["PRESETS", "ModelShape", "llama_shape", "preset"]


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
    family: str = "gpt"  # dt train's --model: gpt (dt.models.gpt) or llama (dt.models.llama)
    n_kv_head: int = 0  # llama's key/value heads; 0: n_head

    @property
    def hidden(self) -> int:
        return self.ffn or 4 * self.n_embd

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    def decoder(self, seq: int) -> Decoder:
        """This shape as dt.cost's Decoder (its FLOPs and activation bytes live there)."""
        llama = self.family == "llama"
        return Decoder(vocab_size=self.vocab, seq_len=seq, n_layer=self.n_layer, n_embd=self.n_embd,
                       n_head=self.n_head, n_kv_head=self.kv_heads, ffn_hidden=self.hidden,
                       gated=self.gated, n_experts=self.experts, top_k=self.top_k, tied=self.tied,
                       position_table=not llama, bias=not llama)

    def block_params(self) -> int:
        """Weights of one block (biases and norms included), unsharded; an MoE block's every expert."""
        width, hidden = self.n_embd, self.hidden
        if self.family == "llama":  # no biases, two RMSNorm weights, k and v of n_kv_head heads
            kv = 2 * width * self.kv_heads * (width // self.n_head)
            return 2 * width * width + kv + 3 * width * hidden + 2 * width
        mlp = (3 if self.gated else 2) * width * hidden + hidden + width
        router = width * self.experts if self.experts else 0
        # q, k, v and the output projection with their biases, two LayerNorms' weights and biases
        return 4 * width * width + 4 * width + 4 * width + mlp * max(1, self.experts) + router

    def params(self, seq: int) -> int:
        """Every weight of the model, unsharded (the tied head counted once)."""
        positions = 0 if self.family == "llama" else seq * self.n_embd
        final_norm = self.n_embd if self.family == "llama" else 2 * self.n_embd
        embed = self.vocab * self.n_embd * (1 if self.tied else 2) + positions
        return embed + self.n_layer * self.block_params() + final_norm


def _llama(name: str, n_layer: int, n_head: int, n_embd: int, ffn: int, vocab: int,
           n_kv_head: int) -> ModelShape:
    return ModelShape(n_layer, n_head, n_embd, vocab, ffn=ffn, gated=True, tied=False, name=name,
                      family="llama", n_kv_head=n_kv_head)


# Public shapes, each as its paper or released config gives it: GPT-2 (Radford et al. 2019; the
# Hugging Face configs), GPT-3 175B (Brown et al. 2020, Table 2.1), Llama 1/2 (Touvron et al.
# 2023; Llama 2 70B: 8 key/value heads), Llama 3 / 3.1 (Grattafiori et al. 2024, Table 3).
PRESETS = {
    "gpt2": ModelShape(12, 12, 768, 50257, name="gpt2"),
    "gpt2-350m": ModelShape(24, 16, 1024, 50257, name="gpt2-350m"),
    "gpt2-1.5b": ModelShape(48, 25, 1600, 50257, name="gpt2-1.5b"),
    "gpt3-175b": ModelShape(96, 96, 12288, 50257, name="gpt3-175b"),
    "llama-7b": _llama("llama-7b", 32, 32, 4096, 11008, 32000, 32),
    "llama-13b": _llama("llama-13b", 40, 40, 5120, 13824, 32000, 40),
    "llama-70b": _llama("llama-70b", 80, 64, 8192, 28672, 32000, 8),
    "llama3-8b": _llama("llama3-8b", 32, 32, 4096, 14336, 128256, 8),
    "llama3-70b": _llama("llama3-70b", 80, 64, 8192, 28672, 128256, 8),
    "llama3-405b": _llama("llama3-405b", 126, 128, 16384, 53248, 128256, 8),
}


def llama_shape(n_layer: int, n_head: int, n_embd: int, vocab: int, n_kv_head: int = 0,
                tied: bool = False) -> ModelShape:
    """dt train's --model llama: SwiGLU of dt.models.llama's width (8C/3 rounded up to its multiple, 32)."""
    width = int(2 * 4 * n_embd / 3)
    multiple = LlamaConfig.ffn_multiple_of  # the config's default: what dt train --model llama builds
    return ModelShape(n_layer, n_head, n_embd, vocab, ffn=-(-width // multiple) * multiple, gated=True,
                      tied=tied, name="llama", family="llama", n_kv_head=n_kv_head)


def preset(name: str, **changes: object) -> ModelShape:
    """A preset by name (KeyError names the choices), with fields changed."""
    if name not in PRESETS:
        raise KeyError(f"no model preset {name!r}; one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **changes)
