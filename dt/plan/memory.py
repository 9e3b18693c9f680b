"""One layout's peak bytes per rank: what a stage holds at the worst moment of its step.

    state        parameters, gradients and Adam's two moments of this rank's
                 tensors (dt.parallel.zero.zero_memory_formula: ZeRO-1 shards
                 the moments over dp); mixed precision (bf16/fp16): 2 + 2 bytes
                 of weight and gradient and 12 of fp32 master and moments
    activations  what autograd keeps per block and micro-batch (below), times
                 the micro-batches the schedule holds at once (dt.plan.pipeline's
                 peak stash: GPipe m, 1F1B p - s on stage s, interleaved more), per
                 chunk; with recompute only each block's input is kept, plus one
                 block's whole set while it is recomputed
    logits       the head's b x t x V/tp logits and the cross-entropy's softmax
    buffers      the largest gradient bucket's flat copy (all_reduce_buckets)

A block of dt's GPT keeps, per token, the LayerNorms' inputs and outputs and
the residual (4 C numbers), the qkv output and attention output (4 C / tp),
the MLP's hidden before and after GELU (2 F / tp), and per head two
t x keys score tensors (the masked scores and the softmax). Peak = state +
max(activations + logits, buffers): the buckets are built after the last
backward, when the activations are gone.
"""

from __future__ import annotations

from dt.parallel.zero import zero_memory_formula
from dt.plan.cluster import Cluster
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.stage import bucket_bytes, stage_tensors

__all__ = ["block_activation_bytes", "peak_bytes"]


def block_activation_bytes(model: ModelShape, b: int, t: int, keys: int, tp: int, itemsize: int) -> int:
    """Bytes one block keeps for backward for b sequences of t tokens (the module doc's count)."""
    c, f = model.n_embd, model.hidden * (model.top_k if model.experts else 1)
    per_token = 4 * c + 4 * c // tp + 2 * f // tp
    scores = 2 * (model.n_head // tp) * t * keys
    return (b * t * per_token + b * scores) * itemsize


def peak_bytes(c: Cluster, model: ModelShape, lay: Layout, batch: int, seq: int,
               stash: list[int]) -> list[dict[str, int]]:
    """Per pipeline stage: {state, activations, logits, buffers, peak} bytes of one of its ranks."""
    item = c.itemsize
    mixed = c.precision in ("bf16", "fp16")
    b = batch // lay.dp // lay.micro_batches
    t = seq // lay.cp
    keys = seq  # ring: t queries against all T keys; Ulysses: T x T over H / cp heads, the same bytes
    out = []
    for s in range(lay.pp):
        dense, experts, blocks, head, _ = stage_tensors(model, lay, seq, s)
        psi = sum(dense) + experts
        state = zero_memory_formula(psi, lay.dp, lay.zero, k=12 if mixed else 2 * item,
                                    param_bytes=2 if mixed else item, grad_bytes=2 if mixed else item)
        one = block_activation_bytes(model, b, t, keys, lay.tp, item)
        per_chunk = blocks / lay.virtual
        if lay.recompute:
            acts = stash[s] * per_chunk * b * t * model.n_embd * item + one
        else:
            acts = stash[s] * per_chunk * one
        logits = 2 * b * t * (model.vocab // lay.tp) * item if head else 0
        buffers = max(bucket_bytes(dense, item), default=0) if lay.dp * lay.cp > 1 else 0
        row = {"state": int(sum(state.values())), "activations": int(acts), "logits": int(logits),
               "buffers": int(buffers)}
        row["peak"] = row["state"] + max(row["activations"] + row["logits"], row["buffers"])
        out.append(row)
    return out
