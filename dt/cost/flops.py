"""FLOPs of dt's decoders (dt/models/gpt.py's GPT, its MoE blocks, llama.py's Llama), layer by layer.

    arch = Decoder.of(cfg)                        # any GPTConfig / LlamaConfig (read by field name)
    train_flops_per_token(cfg)                    # forward + backward per token: MFU's numerator
    layer_forward(arch, layer=3, tp=2, cp=2)      # one rank's share of one layer, per sequence, by kind
    step_flops(arch, sequences=8, recompute="full")  # forward, backward, recompute of a micro-batch

What is counted, and why (the convention Megatron, PaLM and torch's FlopCounterMode share):
- Matrix multiplies only, 2 FLOPs per multiply-add: an [m, k] x [k, n] product is 2 m k n.
  Norms, activations, softmax, bias adds, residual adds, rotary and the loss's log-softmax
  are elementwise: a few FLOPs per element, not per weight, under 1% of a step at any size
  worth planning, and memory-bound anyway (priced by bandwidth, not by FLOP/s).
- Attention counts the whole s x s score matrix (QK^T: 2 s^2 d per head, AV the same) even
  though it is causal, as Megatron's 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) and PaLM's
  6N + 12 l h s do, and as torch's counter counts the math kernel.
- Backward is twice the forward for every matmul (the gradient of each operand is one
  product of the same size). The embedding is a lookup: no FLOPs forward, and its backward
  is a scatter-add (elementwise), so 0. The head (logits = x W^T) is a matmul like any other.
- Recompute (activation checkpointing) reruns a block's forward before its backward:
  "full" reruns every block (not the embedding or the head: Megatron's formula keeps the
  head's V term at 3x), "selective" reruns only attention's scores and AV (Korthikanti 2022).
- Mixture of experts (n_experts > 0): the router (2 h E per token) plus top_k experts per
  token (no token dropped: capacity_factor None, the planner's assumption).
- The optimizer step is elementwise per parameter: OPTIMIZER_FLOPS_PER_PARAM (dt's Adam,
  dt/train/optim.py, counted op by op), per step, not per token.

Splits (what one rank computes): tp divides every tensor-parallel matmul (qkv, out_proj,
the dense MLP, the vocab-parallel head) and attention (whole heads per rank); an MoE is
replicated over tp (gpt_plan splits no MoE: its tokens are), so tp does not divide it. cp gives a
rank seq_len / cp of the queries against every key: 1/cp of every term. ep moves tokens,
not work: with uniform routing a rank runs as many expert rows as its own tokens chose
(T top_k), whatever ep. pp: a stage computes the layers it holds; layer indices follow
dt's layer list [Embedding, Block x n_layer, Head] (dt.parallel.pipeline.stage_layers),
so a stage's FLOPs are the sum of layer_forward over its range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BLOCK_KINDS", "Decoder", "KINDS", "OPTIMIZER_FLOPS_PER_PARAM", "RECOMPUTE", "StepFlops",
           "expert_params", "forward_flops_per_token", "layer_forward", "layer_params", "matmul_params",
           "optimizer_flops", "step_flops", "train_flops_per_token"]

# dt's Adam per parameter: m = b1 m + (1-b1) g (3), v = b2 v + (1-b2) g^2 (4), sqrt(v) divided by
# sqrt(1 - b2^t) plus eps (3), m divided by that, times -lr / (1 - b1^t), added to p (3).
OPTIMIZER_FLOPS_PER_PARAM = 13

BLOCK_KINDS = ("qkv", "scores", "attend", "out_proj", "router", "mlp")
KINDS = ("embedding", *BLOCK_KINDS, "head")
RECOMPUTE = ("none", "selective", "full")  # what recompute reruns: nothing, the attention core, every block


@dataclass(frozen=True)
class Decoder:
    """The shape of a decoder, as much as its FLOPs and memory need (no torch)."""

    vocab_size: int
    seq_len: int
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int  # = n_head: multi-head attention (GPT)
    ffn_hidden: int  # the MLP's (or each expert's) hidden width
    gated: bool = False  # SwiGLU: three matrices (gate, up, down) instead of two
    n_experts: int = 0
    top_k: int = 1
    tied: bool = True
    position_table: bool = True  # GPT's learned positions (Llama: rotary, no table)
    bias: bool = True

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def of(cls, cfg: Any, seq_len: int | None = None) -> Decoder:
        """From a dt GPTConfig (dt/models/gpt.py) or LlamaConfig (seq_len defaults to
        block_size), or from dt.plan's ModelShape (vocab, ffn, gated, experts; give seq_len)."""
        if hasattr(cfg, "vocab"):  # dt.plan.model.ModelShape: dt's block, gated = SwiGLU
            return cls(vocab_size=cfg.vocab, seq_len=_given(seq_len), n_layer=cfg.n_layer,
                       n_embd=cfg.n_embd, n_head=cfg.n_head, n_kv_head=cfg.n_head,
                       ffn_hidden=cfg.ffn or 4 * cfg.n_embd, gated=cfg.gated, n_experts=cfg.experts,
                       top_k=cfg.top_k, tied=cfg.tied)
        llama = hasattr(cfg, "n_kv_head")
        h = cfg.n_embd
        return cls(vocab_size=cfg.vocab_size, seq_len=seq_len or cfg.block_size, n_layer=cfg.n_layer,
                   n_embd=h, n_head=cfg.n_head, n_kv_head=cfg.n_kv_head if llama else cfg.n_head,
                   ffn_hidden=cfg.ffn_hidden if llama else 4 * h, gated=llama,
                   n_experts=getattr(cfg, "n_experts", 0), top_k=getattr(cfg, "top_k", 1),
                   tied=cfg.tied, position_table=not llama, bias=not llama)


def _given(seq_len: int | None) -> int:
    if not seq_len:
        raise ValueError("a model shape without a block size needs seq_len")
    return seq_len


def _arch(model: Decoder | Any, seq_len: int | None = None) -> Decoder:
    if isinstance(model, Decoder):
        return model if seq_len is None else Decoder(**{**model.__dict__, "seq_len": seq_len})
    return Decoder.of(model, seq_len)


def _mlp_forward(a: Decoder) -> float:
    """One MLP (or one expert) per token, forward."""
    return (3 if a.gated else 2) * 2 * a.n_embd * a.ffn_hidden


def forward_flops_per_token(model: Decoder | Any, seq_len: int | None = None) -> dict[str, float]:
    """Forward FLOPs per token of ONE block, by kind (BLOCK_KINDS), unsplit."""
    a = _arch(model, seq_len)
    h, s, d = a.n_embd, a.seq_len, a.head_dim
    moe = a.n_experts > 0
    return {
        "qkv": 2 * h * (a.n_head + 2 * a.n_kv_head) * d,
        "scores": 2 * s * a.n_head * d,  # this token's query against all s keys
        "attend": 2 * s * a.n_head * d,  # its s weights times all s values
        "out_proj": 2 * a.n_head * d * h,
        "router": 2 * h * a.n_experts if moe else 0,
        "mlp": _mlp_forward(a) * (a.top_k if moe else 1),
    }


def layer_forward(model: Decoder | Any, layer: int, tp: int = 1, cp: int = 1,
                  seq_len: int | None = None) -> dict[str, float]:
    """Forward FLOPs of dt's layer `layer` (0: embedding, 1..n_layer: blocks, n_layer + 1: head)
    for one sequence, as one rank of a tp x cp split computes it, by kind (KINDS)."""
    a = _arch(model, seq_len)
    if not 0 <= layer <= a.n_layer + 1:
        raise ValueError(f"layer {layer} is not one of the model's 0..{a.n_layer + 1}")
    tokens = a.seq_len / cp
    out = dict.fromkeys(KINDS, 0.0)
    if layer == a.n_layer + 1:
        out["head"] = 2 * a.n_embd * a.vocab_size * tokens / tp  # vocab-parallel
    elif layer > 0:
        replicated = ("router", "mlp") if a.n_experts else ()  # the MoE is replicated over tp
        for kind, f in forward_flops_per_token(a).items():
            out[kind] = f * tokens / (1 if kind in replicated else tp)
    return out


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one micro-batch on one rank: what the model needs, and what recompute adds."""

    forward: float
    backward: float
    recompute: float

    @property
    def model(self) -> float:
        """Forward + backward: MFU's count."""
        return self.forward + self.backward

    @property
    def hardware(self) -> float:
        """Everything the device runs, recompute included: HFU's count."""
        return self.forward + self.backward + self.recompute


def _recomputed(kinds: dict[str, float], layer: int, n_layer: int, recompute: str) -> float:
    if not 1 <= layer <= n_layer or recompute == "none":
        return 0.0
    if recompute == "selective":
        return kinds["scores"] + kinds["attend"]
    return sum(kinds.values())


def step_flops(model: Decoder | Any, sequences: int = 1, layers: range | None = None, tp: int = 1,
               cp: int = 1, recompute: str = "none", seq_len: int | None = None) -> StepFlops:
    """Forward, backward and recompute FLOPs of `sequences` sequences through `layers`
    (default: the whole model) on one rank of a tp x cp split."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    a = _arch(model, seq_len)
    layers = range(a.n_layer + 2) if layers is None else layers
    fwd = rec = 0.0
    for i in layers:
        kinds = layer_forward(a, i, tp, cp)
        fwd += sum(kinds.values())
        rec += _recomputed(kinds, i, a.n_layer, recompute)
    return StepFlops(forward=fwd * sequences, backward=2 * fwd * sequences, recompute=rec * sequences)


def train_flops_per_token(model: Decoder | Any, seq_len: int | None = None,
                          recompute: str = "none") -> float:
    """Forward + backward (+ recompute, when asked) FLOPs per token of the whole model at
    seq_len (default block_size). recompute="none" is the model FLOPs MFU divides by."""
    a = _arch(model, seq_len)
    return step_flops(a, recompute=recompute).hardware / a.seq_len


def matmul_params(model: Decoder | Any) -> int:
    """Weights one token multiplies by: every block matrix and the head (the tied word
    embedding counts once, as the head); under MoE the router and top_k experts (the active
    parameters). PaLM's N in 6N + 12 l h s; biases, norms and the position table are left
    out (they do no matmul)."""
    a = _arch(model)
    h, d = a.n_embd, a.head_dim
    attn = h * (a.n_head + 2 * a.n_kv_head) * d + a.n_head * d * h
    mlp = (3 if a.gated else 2) * h * a.ffn_hidden
    ffn = mlp * a.top_k + h * a.n_experts if a.n_experts else mlp
    return a.n_layer * (attn + ffn) + a.vocab_size * h


def optimizer_flops(params: int) -> float:
    """The optimizer step over `params` parameters (one rank's shard under ZeRO)."""
    return OPTIMIZER_FLOPS_PER_PARAM * params


def expert_params(model: Decoder | Any, layer: int, ep: int = 1) -> float:
    """Parameters of the experts one rank of an ep split holds in layer `layer` (0 outside an MoE
    block): n_experts / ep experts, each an MLP (its biases too), replicated over tp."""
    a = _arch(model)
    if not a.n_experts or layer in (0, a.n_layer + 1):
        return 0.0
    expert = (3 if a.gated else 2) * a.n_embd * a.ffn_hidden + int(a.bias) * (a.ffn_hidden + a.n_embd)
    return expert * a.n_experts / ep


def layer_params(model: Decoder | Any, layer: int, tp: int = 1, ep: int = 1) -> float:
    """Parameters dt's layer `layer` holds on one rank of a tp (x ep) split, as gpt_plan splits
    dt/models/gpt.py's GPT (biases and norms included): the embedding's word table is vocab-parallel, the
    position table replicated; a block's column-parallel weights and biases and row-parallel
    weights divide by tp, the row-parallel bias and the norms do not; an MoE (replicated over
    tp) holds the router and n_experts / ep experts. The head holds ln_f and, untied, its
    vocab-parallel matrix (tied: the word table, counted with the embedding; a stage holding
    the head but not the embedding holds a copy, layer_params(..., n_layer + 1) + the table).
    Llama-style (gated, no bias): RMSNorm weights h, q/k/v/o and gate/up/down divide by tp."""
    a = _arch(model)
    h = a.n_embd
    norm = (2 if a.bias else 1) * h
    if layer == 0:
        return a.vocab_size * h / tp + (a.seq_len * h if a.position_table else 0)
    if layer == a.n_layer + 1:
        return norm + (0 if a.tied else a.vocab_size * h / tp)
    dense, _ = block_tensors(a, tp)
    return sum(dense) + (expert_params(a, layer, ep) if a.n_experts else 0)


def block_tensors(model: Decoder | Any, tp: int = 1) -> tuple[list[int], int]:
    """(each dense tensor's numbers on one rank, in parameter order; the experts' numbers before ep)
    of one block as gpt_plan / llama_plan split it over tp (layer_params' count, tensor by tensor:
    what DDP's buckets and FSDP's units are made of). GPT: ln_1's weight and bias, qkv's, the
    projection's (its bias replicated), ln_2's, the MLP's two (the second's bias replicated); an
    MoE block's router in place of the MLP. Llama: the norms' weights, q with k and v (of n_kv_head
    heads), o, gate with up, down."""
    a = _arch(model)
    h, f, d = a.n_embd, a.ffn_hidden, a.head_dim
    q, kv = a.n_head * d * h // tp, 2 * a.n_kv_head * d * h // tp
    if not a.bias:  # RMSNorm, no biases
        mats = 3 if a.gated else 2
        return [h, q + kv, q, h, (mats - 1) * f * h // tp, f * h // tp], 0
    norm = [h, h]
    attn = [q + kv, (a.n_head + 2 * a.n_kv_head) * d // tp, q, h]
    mats = 3 if a.gated else 2
    if a.n_experts:  # the router is dense; the experts' MLPs are not split over tp
        return norm + attn + norm + [h * a.n_experts], a.n_experts * (mats * h * f + f + h)
    return norm + attn + norm + [(mats - 1) * f * h // tp, (mats - 1) * f // tp, f * h // tp, h], 0
