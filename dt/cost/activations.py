"""Activation memory: the bytes autograd keeps per layer of dt's decoders until their backward.

    per = layer_activation_bytes(arch, layer=1, sequences=4, itemsize=2, tp=2)   # one block
    stage = stage_activation_bytes(arch, range(0, 5), sequences=4, itemsize=2)  # one micro-batch

Derived from what dt's layers save (each term below was read off a saved_tensors_hooks
measurement of the layer, dt/device_memory.py's saved_bytes, and is tested against it to
the byte): s tokens, b sequences, h hidden, a heads, f MLP hidden, V vocabulary, e the
activation itemsize, t = tp.

Korthikanti et al. 2022 count s b h (34 + 5 a s / h) bytes for a 16-bit GPT block. dt's
GPT block (dt/models/gpt.py; attention="sdpa", the default: torch's fused kernel, what the
plain models and `dt train` run) saves, in elements of e bytes:
    the two norms' inputs 2 sbh, their outputs (the qkv and MLP inputs) 2 sbh,
    qkv (one storage the kernel keeps) 3 sbh, its output (the projection's input) 1 sbh,
    GELU's input and output 2 x 4 sbh                           -> 16 sbh
plus the kernel's log-sum-exp (a b s in at least float32) and the norms' mean and rstd
(4 b s, in the activation dtype on the CPU; CUDA keeps them in float32: stats_bytes=4). At
e = 2 that is Korthikanti's 34 sbh with selective recompute (no s^2 term: the kernel keeps
no scores) less what dt does not run: no dropout (its two sbh masks, 1 byte each).

attention="dt" is dt.parallel.tensor's ParallelSelfAttention, written out (no model dt
trains runs it; tests/test_activations.py measures a block and a head of those layers): in
place of the kernel it keeps q, k^T and v 3 sbh, the softmax a s^2 b and the attention
output 1 sbh, plus the causal mask (s^2 bools): Korthikanti's 34 sbh + 5 a s^2 b less the
dropout (two sbh masks and the softmax's mask and output, 3 a s^2 b bytes).

Tensor parallel (t > 1): everything inside attention and the MLP divides by t (whole
heads, a slice of f); the norms' inputs and outputs are replicated, 4 e sbh per rank,
as Korthikanti's 10 sbh (at e = 2 less the dropout masks). Sequence parallel (dt's
ColwiseParallel / RowwiseParallel with sequence_parallel) runs the norms on s / t tokens,
so their inputs and statistics divide by t; but each column-parallel layer all-gathers its
input to the whole sequence and keeps that copy for its weight's gradient (Megatron instead
keeps the s / t shard and gathers again in backward, Korthikanti's 4.2.2): the matmul
inputs stay whole, 2 e sbh per GPT block, and 5 e sbh per Llama block (q, k, v, gate and up
each gather their own copy). The head keeps ln_f's input on s / t tokens and its gathered
output whole.

Context parallel (cp > 1): a rank holds s / cp tokens, and dt.parallel.context's ring
attention and Ulysses (which dt.parallelize swaps in for the model's kernel) work
block-wise: they keep q, k, v, the output and its log-sum-exp (in the activation dtype:
e a b s / cp bytes), never s^2 scores, and the output projection's input is a copy of the
output: 17 e s b h / cp in all.

Llama (dt/models/llama.py): its RMSNorm computes in at least float32 (w = max(e, 4) bytes:
the input's wide copy, its rsqrt per token), and keeps its normed and weighted outputs
(2 e sbh); attention keeps q, k, v (k and v repeated to every head) and the output
(4 e sbh; under cp, as GPT's, 5 e sbh) plus the log-sum-exp; SwiGLU keeps gate, silu, up
and their product (4 e s b f). Parallelized, each of its pipeline layers looks up its
rotary rows (dt.parallel.plan.llama_blocks: cos and sin, 2 e s head_dim, s / cp under cp),
which rotary's multiplies keep.

Recompute: "full" keeps only each block's input (e sbh, / t with sequence parallel; a
parallelized Llama layer's rotary rows too: they are its inputs); its activations come
back, one block at a time, in its backward: recompute_peak_bytes is that one block's.
"selective" (Korthikanti) recomputes the attention core alone (dt.parallel.recompute):
what the core keeps goes, the scores term (the softmax and mask written out; torch's
kernel and ring attention: their log-sum-exp) and under cp the output (its copy into the
projection stays); q, k, v stay, as the core's inputs. recompute_peak_bytes is then what
one core rebuilds.

The embedding keeps the token ids (int64) and the positions (int64; a plain Llama: its
rotary tables' rows at these positions, cos and sin [s, head_dim], looked up once for all
its layers); parallelized (the default: the model as dt.parallelize's plans split it, even
at tp = 1) the vocab-parallel embedding also keeps the mask of ids outside the rank's slice
(bool). The head keeps ln_f's input and output, the loss's softmax over the whole
vocabulary (the head gathers the logits; the loss upcasts: max(e, 4) bytes), and the
targets (int64); attention="dt" is the vocabulary-parallel loss instead
(dt.parallel.tensor.vocab_parallel_cross_entropy): the softmax of the rank's slice in the
activation dtype, the targets and their outside-the-slice mask.

Mixture of experts (dt.parallel.expert.ShardedMoE, which dt.parallelize's ExpertParallel swaps in
for the plain model's; replicated over tp, so never divided by it), T = b s / cp tokens,
R = T top_k rows this rank routes, R' the rows its experts receive (R' = R with uniform
routing; pass received_rows for a measured routing), in place of the MLP:
    router   its probabilities e T E, the top-k ids 8 T k, the balance loss's e b E, and at
             top_k > 1 the renormalising sum e T and the gates e T k
    dispatch the sort orders of sent and received rows 16 R + 16 R', the received rows e R' h
    experts  fc_in's output and GELU's output, 2 e R' f
    combine  each row's gate e R, the outputs back and weighted 2 e R h

Context parallel's backward holds far more than this for a moment, none of it kept from the
forward: dt.cost.context_backward counts it.
"""

from __future__ import annotations

from dt.cost.flops import RECOMPUTE, Decoder

__all__ = ["ATTENTION", "block_above_core_bytes", "block_activation_bytes", "layer_activation_bytes",
           "moe_activation_bytes", "recompute_peak_bytes", "stage_activation_bytes"]

ATTENTION = ("sdpa", "dt")  # torch's fused kernel (the plain models, dt train); dt.parallel.tensor's
INDEX_BYTES = 8  # int64 token ids, positions and targets


def _check(a: Decoder, attention: str, recompute: str, parallelized: bool = True) -> None:
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if a.n_experts and (a.gated or not parallelized):
        raise ValueError("a mixture of experts is dt.parallel.expert's layer in dt's GPT (not gated), "
                         "as dt.parallelize swaps it in: parallelized=True")


def moe_activation_bytes(a: Decoder, sequences: int, itemsize: int, cp: int = 1,
                         received_rows: float | None = None) -> float:
    """What an MoE block's router, dispatch, experts and combine keep (the module doc's terms)."""
    e, k, E, h, f = itemsize, a.top_k, a.n_experts, a.n_embd, a.ffn_hidden
    tokens = sequences * a.seq_len / cp
    rows = tokens * k
    got = rows if received_rows is None else received_rows
    router = e * tokens * E + INDEX_BYTES * tokens * k + e * sequences * E
    router += e * tokens * (1 + k) if k > 1 else 0  # top_k > 1: the gates renormalised
    dispatch = 2 * INDEX_BYTES * (rows + got) + e * got * h
    return router + dispatch + 2 * e * got * f + e * rows + 2 * e * rows * h


def _dropout_bytes(a: Decoder, sequences: int, itemsize: int, tp: int, cp: int, sequence_parallel: bool,
                   attention: str) -> dict[str, float]:
    """What dropout adds to a block (the stacks that train with it; dt's layers have none): a one-byte
    mask after attention's projection and after the MLP (on the residual stream: split over tp only
    with sequence parallel) and, where the score matrix is materialized (attention="dt"), the
    probabilities' mask and their dropped-out copy (a fused kernel keeps only its random state)."""
    s = a.seq_len / cp
    masks = 2 * s * sequences * a.n_embd / (tp if sequence_parallel else 1)
    probs = a.n_head * s * s * sequences / tp if attention == "dt" and cp == 1 else 0.0
    return {"dropout": masks, "scores": (1 + itemsize) * probs}


def block_activation_bytes(a: Decoder, sequences: int, itemsize: int, tp: int = 1, cp: int = 1,
                           sequence_parallel: bool = False, attention: str = "sdpa",
                           stats_bytes: int | None = None, received_rows: float | None = None,
                           parallelized: bool = True, dropout: bool = False,
                           shard_inputs: bool = False, fused_norm: bool = False) -> dict[str, float]:
    """Bytes one block keeps for backward on one rank, by part, with no recompute. shard_inputs:
    under sequence parallel the column-parallel layers keep their input's shard and gather it
    again in backward (Megatron's way), not the gathered whole (dt's). fused_norm: each RMSNorm is
    one kernel keeping its input and float32 rsqrt (nanotron's TritonRMSNorm, Transformer Engine's),
    not dt's float32 copy and normed output."""
    parts = _block_parts(a, sequences, itemsize, tp, cp, sequence_parallel, attention, stats_bytes,
                         received_rows, parallelized, shard_inputs, fused_norm)
    if dropout:
        for key, v in _dropout_bytes(a, sequences, itemsize, tp, cp, sequence_parallel, attention).items():
            parts[key] = parts.get(key, 0.0) + v
    return parts


def _block_parts(a: Decoder, sequences: int, itemsize: int, tp: int, cp: int, sequence_parallel: bool,
                 attention: str, stats_bytes: int | None, received_rows: float | None,
                 parallelized: bool, shard_inputs: bool = False,
                 fused_norm: bool = False) -> dict[str, float]:
    _check(a, attention, "none", parallelized)
    e, t, st = itemsize, tp, itemsize if stats_bytes is None else stats_bytes
    s = a.seq_len / cp
    sbh, bs = s * sequences * a.n_embd, s * sequences
    rep = t if sequence_parallel else 1  # what tp alone replicates, sp splits
    inputs = rep if shard_inputs else 1  # the matmuls' inputs: whole as gathered, or their shard
    if a.gated:  # Llama: RMSNorm (dt's in at least float32), SwiGLU; parallelized, each layer's rotary rows
        rotary = 2 * e * s * (a.n_embd // a.n_head) if parallelized else 0
        core = _attention_core(a, e, s, sequences, t, cp, "sdpa")
        gathered = sequence_parallel and not shard_inputs  # q, k, v, gate and up each gather their own
        return {"norms": 2 * _rms_norm_bytes(e, sbh, bs, fused_norm) / rep,
                "attention_input": (3 if gathered else 1) * e * sbh / inputs,
                "mlp_input": (2 if gathered else 1) * e * sbh / inputs,
                **core,
                "attention": core["attention"] + rotary, "mlp": 4 * e * s * sequences * a.ffn_hidden / t}
    # under sequence parallel the matmul inputs stay whole: each column-parallel layer keeps its gathered copy
    norms = {"norms": (2 * e * sbh + 4 * st * bs) / rep, "attention_input": e * sbh / inputs,
             "mlp_input": e * sbh / inputs}
    mlp = moe_activation_bytes(a, sequences, e, cp, received_rows) if a.n_experts else \
        2 * e * s * sequences * a.ffn_hidden / t
    return {**norms, **_attention_core(a, e, s, sequences, t, cp, attention), "mlp": mlp}


def _rms_norm_bytes(e: int, sbh: float, bs: float, fused: bool) -> float:
    """What one RMSNorm keeps (its output, the next matmul's input, counted there): fused, its input
    and float32 rsqrt; dt's, its input widened to at least float32, the rsqrt and the normed copy."""
    w = max(e, 4)
    return e * sbh + 4 * bs if fused else w * sbh + w * bs + e * sbh


def _attention_core(a: Decoder, e: int, s: float, sequences: int, t: int, cp: int,
                    attention: str) -> dict[str, float]:
    """attention: q, k, v, the output (the projection's input); scores: what only the core keeps;
    under cp projection_input: the projection's own copy of the output."""
    sbh, bs = s * sequences * a.n_embd, s * sequences
    if cp > 1:  # ring attention / Ulysses, block-wise: q, k, v, output, its copy into the projection; lse
        return {"attention": 4 * e * sbh / t, "projection_input": e * sbh / t,
                "scores": e * a.n_head * bs / t}
    if attention == "sdpa":  # one qkv storage, the output (the projection's input), log-sum-exp
        return {"attention": 4 * e * sbh / t, "scores": max(e, 4) * a.n_head * bs / t}
    scores = e * a.n_head * s * s * sequences / t + s * s  # the softmax, and the causal mask (bool)
    return {"attention": 4 * e * sbh / t, "scores": scores}


def _selective(a: Decoder, parts: dict[str, float], e: int, sequences: int, tp: int,
               cp: int) -> dict[str, float]:
    """What the attention core alone keeps, which selective recompute drops: its scores term, and
    under cp its output (ring attention's; the projection keeps its own copy)."""
    output = e * a.seq_len / cp * sequences * a.n_embd / tp if cp > 1 else 0.0
    return {"scores": parts["scores"], "attention": output}


def layer_activation_bytes(a: Decoder, layer: int, sequences: int, itemsize: int, tp: int = 1,
                           cp: int = 1, sequence_parallel: bool = False, attention: str = "sdpa",
                           recompute: str = "none", stats_bytes: int | None = None,
                           parallelized: bool = True, dropout: bool = False,
                           shard_inputs: bool = False, fused_norm: bool = False) -> float:
    """Bytes dt's layer `layer` (0 embedding, 1..n_layer blocks, n_layer + 1 head) keeps for
    backward on one rank, for `sequences` sequences of a.seq_len tokens; parallelized: the model
    as dt.parallelize splits it (what dt train runs), else the plain model whole."""
    _check(a, attention, recompute, parallelized)
    if not 0 <= layer <= a.n_layer + 1:
        raise ValueError(f"layer {layer} is not one of the model's 0..{a.n_layer + 1}")
    e, st = itemsize, itemsize if stats_bytes is None else stats_bytes
    s = a.seq_len / cp
    sbh = s * sequences * a.n_embd
    if layer == 0:
        return _embedding_bytes(a, e, s, sequences, parallelized)
    if layer == a.n_layer + 1:
        return _head_bytes(a, e, st, s, sequences, tp, attention, tp if sequence_parallel else 1, fused_norm)
    if recompute == "full":  # the block's input (and a parallelized Llama layer's rotary rows)
        rotary = 2 * e * s * (a.n_embd // a.n_head) if a.gated and parallelized else 0
        return e * sbh / (tp if sequence_parallel else 1) + rotary
    parts = block_activation_bytes(a, sequences, itemsize, tp, cp, sequence_parallel, attention, stats_bytes,
                                   parallelized=parallelized, dropout=dropout, shard_inputs=shard_inputs,
                                   fused_norm=fused_norm)
    dropped = _selective(a, parts, e, sequences, tp, cp) if recompute == "selective" else {}
    return sum(parts.values()) - sum(dropped.values())


def _embedding_bytes(a: Decoder, e: int, s: float, sequences: int, vocab_parallel: bool) -> float:
    """The ids, GPT's position ids; vocab-parallel: the outside-the-slice mask, else Llama's rotary rows."""
    bs = s * sequences
    if vocab_parallel:  # Llama's pipeline layers read its tables as views of its buffers
        return INDEX_BYTES * bs + bs + (INDEX_BYTES * s if a.position_table else 0)
    rotary = 2 * e * s * (a.n_embd // a.n_head)  # cos and sin rows, looked up once for every block
    return INDEX_BYTES * bs + (INDEX_BYTES * s if a.position_table else rotary)


def _head_bytes(a: Decoder, e: int, st: int, s: float, sequences: int, tp: int, attention: str,
                rep: int = 1, fused_norm: bool = False) -> float:
    """The final norm (its input and statistics on s / rep tokens under sequence parallel; its
    output, the logits' input, gathered whole), the loss's softmax and the targets."""
    bs, sbh = s * sequences, s * sequences * a.n_embd
    if a.gated:  # final RMSNorm, and its weighted output
        norm = _rms_norm_bytes(e, sbh, bs, fused_norm) / rep + e * sbh
    else:  # ln_f's input, mean and rstd, output
        norm = (e * sbh + 2 * st * bs) / rep + e * sbh
    if attention == "sdpa":  # the loss's float32 (or wider) log-softmax and weight total, targets
        return norm + max(e, 4) * (bs * a.vocab_size + 1) + INDEX_BYTES * bs
    return norm + e * bs * a.vocab_size / tp + INDEX_BYTES * bs + bs  # softmax slice, targets, mask


def recompute_peak_bytes(a: Decoder, sequences: int, itemsize: int, tp: int = 1, cp: int = 1,
                         sequence_parallel: bool = False, attention: str = "sdpa",
                         stats_bytes: int | None = None, parallelized: bool = True,
                         recompute: str = "full", fused_norm: bool = False) -> float:
    """What recompute adds at its peak: one block's activations rebuilt for its backward ("full"),
    or one attention core's ("selective": what it dropped); "none": nothing."""
    _check(a, attention, recompute, parallelized)
    if recompute == "none":
        return 0.0
    parts = block_activation_bytes(a, sequences, itemsize, tp, cp, sequence_parallel, attention,
                                   stats_bytes, parallelized=parallelized, fused_norm=fused_norm)
    if recompute == "selective":
        return sum(_selective(a, parts, itemsize, sequences, tp, cp).values())
    return sum(parts.values())


def block_above_core_bytes(a: Decoder, sequences: int, itemsize: int, tp: int = 1, cp: int = 1,
                           sequence_parallel: bool = False) -> float:
    """What one of dt's blocks keeps above its attention core, which the block's backward frees
    before it reaches the core: the output projection's input (under cp a copy of the core's
    output), the second norm, the MLP's input (Llama's gate and up each gather their own under
    sequence parallel) and the MLP (or the experts)."""
    parts = block_activation_bytes(a, sequences, itemsize, tp, cp, sequence_parallel)
    second_norm = parts["norms"] / 2  # the block's two norms keep alike
    return second_norm + parts["mlp_input"] + parts["mlp"] + parts.get("projection_input", 0.0)


def stage_activation_bytes(a: Decoder, layers: range, sequences: int, itemsize: int, tp: int = 1,
                           cp: int = 1, sequence_parallel: bool = False, attention: str = "sdpa",
                           recompute: str = "none", stats_bytes: int | None = None,
                           parallelized: bool = True, dropout: bool = False,
                           shard_inputs: bool = False, fused_norm: bool = False) -> float:
    """Bytes one micro-batch leaves on a stage holding `layers` (default cut: dt's layer list)."""
    return sum(layer_activation_bytes(a, i, sequences, itemsize, tp, cp, sequence_parallel, attention,
                                      recompute, stats_bytes, parallelized, dropout, shard_inputs, fused_norm)
               for i in layers)
