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

Context parallel's backward working set (context_backward_peak_bytes). Ring attention and
Ulysses keep no s^2 term for backward, but their backward itself holds many buffers at once,
none of them kept from the forward, so nothing above counts them; dt.plan.memory adds them at
the moment they peak. The figure is the most bytes live at once during one attention call's
backward above what it found (the forward's saved tensors), from its incoming gradient (the
output projection's input gradient, counted) until its q, k, v gradients are whole. Per cp
rank, Q = e b (a/t) s_r d bytes (one q of the rank's s_r tokens), L = Q / d (its lse), and a
block of scores e b (a/t) n_q n_k (n_q queries by the n_k keys they see):

ring (dt.parallel.context.ring_attention, hop by hop):
    incoming   the output's gradient, Q, which autograd holds until the backward returns
    dout       its contiguous copy, Q: dt's layers hand it back transposed (with one head the
               transpose moves nothing and there is no copy)
    delta      rowsum(dout * out), L, after a Q product
    dq dk dv   the running gradients, 3Q; the last hop's block gradients dq_b dk_b dv_b stay
               bound while the next hop's block_backward makes its own (3 blocks each)
    kv         k and v stacked, 2Q; from hop 0 on, the receive buffer they are read from
    send       a hop's one message: the held k/v block and, from hop 1, its dk/dv so far (2 or
               4 blocks), concatenated; the last hop's is freed only as the next is made
    recv       the next message, the same size, made while the last one is still read
    dkv        the stacked dk/dv of the block just processed, 2 blocks
    scores     per chunk of queries in each block_backward: q k^T, its scaled and masked copies,
               less the lse and exp (3 blocks of scores at once), then dout v^T less delta and ds
               (3 again, the probabilities kept), dq's and dk's products and their scaled
               copies, k and v concatenated when the chunk sees keys of two chunks (zig-zag),
               and the last chunk's probabilities, ds, dv_c and dk_c until their names are bound
               again
    masks      each hop's causal masks, one byte per query-key pair of a chunk pair the diagonal
               cuts, compared from int64 positions
    home       the last hop: dk + home[0] and dv + home[1], 2Q, before the old ones go
With cp = 2 and score blocks no bigger than q (s_r up to about d) the peak is the last hop:
incoming, dout, delta, dq dk dv, hop 0's receive buffer, its dq_b dk_b dv_b, dkv, the send and
receive buffers and home, 18 Q + L. From cp = 3 it is mostly a middle hop's block_backward: with
even blocks 21 Q + L before its scores, which grow as s_r / d; 20 to 34 Q in the tests' shapes.

Ulysses (dt.parallel.context.ulysses, node by node as torch's autograd engine runs them), F =
e b (a/t/cp) S d the gathered tensors (Q when the sequence splits evenly):
    output back  the incoming Q, each rank's heads of it flattened (copies, Q: the incoming goes
                 with its last view), concatenated (Q), exchanged (F), joined along the sequence
                 into dout (F)
    attention    delta and blocks.block_backward over the whole sequence on the rank's heads:
                 dq dk dv (3F) and the scores as above, a query chunk seeing up to S keys
    saved        the gathered q, k, v, the output and lse (4F + lse) go as the attention's node ends
    selects      dq, dk and dv each put into a zeroed [3, b, a/t/cp, S, d] (3F) and summed out of
                 place: 10F at once
    q, k, v back each rank's piece flattened (3F), concatenated (3F), exchanged (3Q), each rank's
                 heads put into a zeroed [3, b, a/t, s_r, d] (3Q) and summed out of place: up to
                 12 Q from cp = 3
The attention's scores, growing as s_r / d, usually hold the peak: 10 to 16 Q in the tests' shapes.

Both are replayed in the code's order, with Python's lifetimes (a temporary lives until its
expression ends, a name's value until the name is bound again, autograd's inputs until its node
returns): the figure is LiveBytes' measurement to the byte for any sequence of two or more tokens
(tests/test_context_memory.py). It is dt's own implementation's: fused ring-flash kernels hold
blocks of tiles, not of scores (dt.plan.memory prices it only where dt's own layers run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dt.cost.flops import RECOMPUTE, Decoder
from dt.layout import SequenceLayout, ring_hop, visible

__all__ = ["ATTENTION", "CP_KINDS", "AttentionShape", "block_above_core_bytes", "block_activation_bytes",
           "context_backward_peak_bytes",
           "context_backward_rank_bytes", "layer_activation_bytes", "moe_activation_bytes",
           "recompute_peak_bytes", "stage_activation_bytes"]

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
        return {"norms": 2 * _rms_norm_bytes(e, sbh, bs, fused_norm) / rep,
                "matmul_inputs": (5 if sequence_parallel and not shard_inputs else 2) * e * sbh / inputs,
                **core,
                "attention": core["attention"] + rotary, "mlp": 4 * e * s * sequences * a.ffn_hidden / t}
    # under sequence parallel the matmul inputs stay whole: each column-parallel layer keeps its gathered copy
    norms = {"norms": (2 * e * sbh + 4 * st * bs) / rep, "matmul_inputs": 2 * e * sbh / inputs}
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
    """attention: q, k, v, the output (the projection's input); scores: what only the core keeps."""
    sbh, bs = s * sequences * a.n_embd, s * sequences
    if cp > 1:  # ring attention / Ulysses, block-wise: q, k, v, output, its copy into the projection; lse
        return {"attention": 5 * e * sbh / t, "scores": e * a.n_head * bs / t}
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
    mlp_inputs = 2 / 5 if a.gated and sequence_parallel else 1 / 2  # of the matmuls' inputs
    projection = itemsize * a.seq_len / cp * sequences * a.n_embd / tp if cp > 1 else 0.0
    return parts["norms"] / 2 + parts["matmul_inputs"] * mlp_inputs + parts["mlp"] + projection


def stage_activation_bytes(a: Decoder, layers: range, sequences: int, itemsize: int, tp: int = 1,
                           cp: int = 1, sequence_parallel: bool = False, attention: str = "sdpa",
                           recompute: str = "none", stats_bytes: int | None = None,
                           parallelized: bool = True, dropout: bool = False,
                           shard_inputs: bool = False, fused_norm: bool = False) -> float:
    """Bytes one micro-batch leaves on a stage holding `layers` (default cut: dt's layer list)."""
    return sum(layer_activation_bytes(a, i, sequences, itemsize, tp, cp, sequence_parallel, attention,
                                      recompute, stats_bytes, parallelized, dropout, shard_inputs, fused_norm)
               for i in layers)


# Context parallel attention's backward working set, replayed buffer by buffer (the module doc's
# last part).

CP_KINDS = ("ring", "ulysses")
MASK_INDEX_BYTES = 8  # the int64 positions a partial causal mask is compared from


class _Live:
    """Bytes a replayed backward holds now (above what it found) and at most, buffer by buffer."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def make(self, *sizes: int) -> None:
        for size in sizes:
            self.now += size
            self.peak = max(self.peak, self.now)

    def free(self, *sizes: int) -> None:
        self.now -= sum(sizes)


@dataclass(frozen=True)
class AttentionShape:
    """One rank's attention tensors [sequences, heads, tokens, head_dim] of itemsize bytes."""

    sequences: int
    heads: int
    head_dim: int
    itemsize: int

    def tokens(self, count: int) -> int:
        """Bytes of q, k, v, the output or a gradient over `count` tokens."""
        return self.itemsize * self.sequences * self.heads * count * self.head_dim

    def per_token(self, count: int) -> int:
        """Bytes of one number per head and token: the log-sum-exp, delta."""
        return self.itemsize * self.sequences * self.heads * count

    def scores(self, queries: int, keys: int) -> int:
        return self.itemsize * self.sequences * self.heads * queries * keys

    def with_heads(self, heads: int) -> AttentionShape:
        return AttentionShape(self.sequences, heads, self.head_dim, self.itemsize)


def _contiguous(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch's rule: each dim longer than one steps over everything after it (an empty tensor is)."""
    if 0 in sizes:
        return True
    expected = 1
    for size, stride in reversed(list(zip(sizes, strides))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _transposed_is_contiguous(shape: AttentionShape, heads: int, tokens: int) -> bool:
    """Is `heads` of the [b, tokens, H, d] gradient dt's layers hand back, seen as [b, heads,
    tokens, d] (attention's output layout), contiguous? Only when the transpose moves nothing."""
    d, total = shape.head_dim, shape.heads
    return _contiguous((shape.sequences, heads, tokens, d), (tokens * total * d, d, total * d, 1))


@dataclass(frozen=True)
class _QueryChunk:
    """A chunk of queries with something to see: its length, and each key chunk it sees
    (the key chunk's length and 'all' or 'some', dt.layout.visible)."""

    queries: int
    keys: tuple[tuple[int, str], ...]

    @property
    def seen(self) -> int:
        return sum(length for length, _ in self.keys)

    @property
    def masked(self) -> bool:
        return any(kind == "some" for _, kind in self.keys)

    @property
    def gathered(self) -> bool:
        """Keys of several chunks are concatenated (copied); one chunk's are a view."""
        return len(self.keys) > 1


def _block_plan(q_chunks: list[tuple[int, int]], k_chunks: list[tuple[int, int]],
                causal: bool) -> list[_QueryChunk]:
    """dt.parallel.context.blocks.plan's query chunks, by size."""
    out = []
    for q in q_chunks:
        seen = tuple((k[1] - k[0], kind) for k in k_chunks if (kind := visible(q, k, causal)) != "none")
        if seen:
            out.append(_QueryChunk(q[1] - q[0], seen))
    return out


def _make_masks(live: _Live, q_chunks: list[tuple[int, int]], k_chunks: list[tuple[int, int]],
                causal: bool) -> int:
    """blocks.plan's masks (one byte per query-key pair): per query chunk each visible key chunk's
    (compared from two int64 position ranges where the diagonal cuts it) and, where any is partial,
    their concatenation, which the plan keeps. The bytes kept."""
    kept = listed = 0
    for qa, qz in q_chunks:
        live.free(listed)  # the previous query chunk's list of masks
        listed, partial = 0, False
        for ka, kz in k_chunks:
            kind, pairs = visible((qa, qz), (ka, kz), causal), (qz - qa) * (kz - ka)
            if kind == "some":
                positions = MASK_INDEX_BYTES * (kz - ka), MASK_INDEX_BYTES * (qz - qa)
                live.make(*positions, pairs)
                live.free(*positions)
                partial = True
            elif kind == "all":
                live.make(pairs)
            listed += pairs if kind != "none" else 0
        if partial:
            live.make(listed)
            kept += listed
    live.free(listed)
    return kept


@dataclass(frozen=True)
class _ChunkBuffers:
    """What one query chunk of block_backward leaves bound until the next chunk binds its names again."""

    keys_copied: int  # kc and vc, each, when gathered from several key chunks
    scores: int  # probs and ds, each
    key_grads: int  # dv_c and dk_c, each


def _block_backward(live: _Live, shape: AttentionShape, queries: int, keys: int,
                    chunks: list[_QueryChunk]) -> int:
    """blocks.block_backward: the bytes of the dq, dk, dv it returns (left live)."""
    grads = shape.tokens(queries) + 2 * shape.tokens(keys)
    live.make(shape.tokens(queries), shape.tokens(keys), shape.tokens(keys))
    last = _ChunkBuffers(0, 0, 0)
    for chunk in chunks:
        scores, rows = shape.scores(chunk.queries, chunk.seen), shape.tokens(chunk.queries)
        key_rows = shape.tokens(chunk.seen)
        copied = key_rows if chunk.gathered else 0
        live.make(copied, copied)  # kc, vc
        live.free(last.keys_copied, last.keys_copied)
        _probabilities(live, shape, chunk, scores)
        live.free(last.scores)  # the last chunk's probs
        live.make(key_rows)  # dv_c = probs^T dout
        live.free(last.key_grads)
        live.make(scores, scores)  # dout v^T, less delta
        live.free(scores)
        live.make(scores)  # ds = probs * that
        live.free(scores, last.scores)  # the difference; the last chunk's ds
        live.make(rows, rows)  # dq's product ds k, scaled (added in place)
        live.free(rows, rows)
        live.make(key_rows, key_rows)  # dk_c: ds^T q, scaled
        live.free(key_rows, last.key_grads)
        last = _ChunkBuffers(copied, scores, key_rows)
    live.free(2 * last.keys_copied, 2 * last.scores, 2 * last.key_grads)
    return grads


def _probabilities(live: _Live, shape: AttentionShape, chunk: _QueryChunk, scores: int) -> None:
    """blocks._probs with the final lse: q k^T, scaled, masked, less the (finite) lse, exp. Leaves
    the probabilities live."""
    lse = shape.per_token(chunk.queries)
    live.make(scores, scores)  # q k^T, then / sqrt(d)
    live.free(scores)
    if chunk.masked:
        live.make(scores)
        live.free(scores)
    flags = lse // shape.itemsize  # isinf(lse): one byte each
    live.make(flags, lse, lse)  # _finite: the flags, zeros, the where
    live.free(flags, lse)
    live.make(scores)  # s - lse
    live.free(lse)
    live.make(scores)  # exp
    live.free(scores, scores)  # the difference, then s as _probs returns


def _ring_backward(live: _Live, shape: AttentionShape, layout: SequenceLayout, rank: int,
                   causal: bool) -> None:
    """ring_attention._RingAttention.backward, hop by hop."""
    parts, mine = layout.parts, layout.chunks(rank)
    tokens = layout.size(rank)
    block = shape.tokens(tokens)
    live.make(block)  # the incoming gradient, held by autograd's call until backward returns
    if not _transposed_is_contiguous(shape, shape.heads, tokens):
        live.make(block)  # dout.contiguous()
    live.make(block, shape.per_token(tokens))  # dout * out, then delta = its rowsum
    live.free(block)
    masks = _make_masks(live, mine, mine, causal)
    _block_backward(live, shape, tokens, tokens, _block_plan(mine, mine, causal))  # dq, dk, dv
    live.free(masks)
    kv = held = 2 * block  # k and v stacked, then read from the receive buffer `held` (+ dk/dv)
    live.make(held)
    send = dkv = hop_grads = 0  # the last hop's message, stacked dk/dv, and dq_b + dk_b + dv_b
    for hop in range(parts if parts > 1 else 0):
        carries_kv, carries_grad = hop <= parts - 2, hop >= 1
        _, incoming = ring_hop(rank, parts, hop)
        live.make(kv * carries_kv + dkv * carries_grad)  # send: the held block, its dk/dv so far
        live.free(send)
        send = kv * carries_kv + dkv * carries_grad
        one = 2 * shape.tokens(layout.size(incoming))
        recv = one * (int(carries_kv) + int(carries_grad))
        live.make(recv)
        if carries_kv:
            live.free(held)  # kv bound to the new buffer: the stack, or the last hop's buffer, goes
            kv, held = one, recv
            masks = _make_masks(live, mine, layout.chunks(incoming), causal)
            grads = _block_backward(live, shape, tokens, layout.size(incoming),
                                    _block_plan(mine, layout.chunks(incoming), causal))
            live.free(masks, hop_grads)  # the last hop's dq_b, dk_b, dv_b as the names are bound again
            hop_grads = grads
            live.make(one)  # dkv = stack(dk_b, dv_b), the others' added in place
            live.free(dkv)
            dkv = one
        else:  # home: dk + home[0], dv + home[1] before the old dk, dv go
            live.make(block, block)
            live.free(block, block)


def _ulysses_backward(live: _Live, shape: AttentionShape, layout: SequenceLayout, rank: int,
                      causal: bool) -> None:
    """ulysses_attention's backward, node by node as torch's autograd engine runs them; the
    forward's gathered q, k, v, output and lse go when the attention's node ends."""
    parts, tokens, length = layout.parts, layout.size(rank), layout.seq_len
    gathered = shape.with_heads(shape.heads // parts)  # [b, H / cp, S, d]
    mine, whole = shape.tokens(tokens), gathered.tokens(length)
    # the output's all-to-all: each rank's heads of the incoming (transposed) gradient flattened
    # (copies: the incoming goes with its last view), concatenated, exchanged back, and joined
    # along the sequence: the attention's dout
    live.make(mine)  # the incoming gradient
    if not _transposed_is_contiguous(shape, gathered.heads, tokens):
        live.make(mine)  # the flattened copies
        live.free(mine)  # the incoming, its last view copied
    live.make(mine)  # concatenated
    live.free(mine)  # the copies (or the incoming, when its views were flat already)
    live.make(whole)  # exchanged
    live.free(mine)  # the concatenation
    live.make(whole)  # dout: joined along the sequence
    live.free(whole)  # the exchanged
    # blocks._Attention.backward over the whole sequence on this rank's heads
    live.make(whole, gathered.per_token(length))  # dout * out, then delta
    live.free(whole)
    order = [chunk for r in range(parts) for chunk in layout.chunks(r)]
    _block_backward(live, gathered, length, length, _block_plan(order, order, causal))
    live.free(gathered.per_token(length), whole)  # delta, dout
    live.free(3 * whole, whole, gathered.per_token(length))  # saved: the gathered q, k, v, out, lse
    # dq, dk, dv each into a zeroed [3, b, H / cp, S, d] (select_backward), summed out of place
    for select in range(3):
        live.make(3 * whole)
        live.free(whole)  # its dq, dk or dv
        if select:
            live.make(3 * whole)  # the sum so far plus this one
            live.free(6 * whole)
    _qkv_all_to_all_backward(live, shape, gathered, layout, rank)


def _qkv_all_to_all_backward(live: _Live, shape: AttentionShape, gathered: AttentionShape,
                             layout: SequenceLayout, rank: int) -> None:
    """The gradient of the gathered q, k, v (3 whole, live) back to this rank's tokens: each rank's
    piece flattened (a copy: a slice along the sequence), concatenated, exchanged, and each rank's
    slice of heads put into a zeroed [3, b, H, s_r, d] (slice_backward), summed out of place."""
    parts, whole = layout.parts, gathered.tokens(layout.seq_len)
    mine = shape.tokens(layout.size(rank))
    live.make(*(3 * gathered.tokens(size) for size in layout.sizes()))  # each rank's piece, flat
    live.free(3 * whole)  # the gathered gradient, its last piece copied
    live.make(3 * whole)  # concatenated
    live.free(3 * whole)  # the pieces
    live.make(3 * mine)  # exchanged
    live.free(3 * whole)  # the concatenation
    live.make(3 * mine)  # the first rank's heads, zeroed around
    for peer in range(1, parts):
        live.make(3 * mine)
        if peer == parts - 1:
            live.free(3 * mine)  # the exchanged buffer, its last slice read
        live.make(3 * mine)  # the sum so far plus this one
        live.free(6 * mine)


def context_backward_rank_bytes(shape: AttentionShape, layout: SequenceLayout, rank: int, kind: str,
                                causal: bool = True) -> int:
    """The most bytes one context-parallel attention call's backward holds at once on cp rank
    `rank`, above what it found live (its forward's saved tensors, the incoming gradient): the
    module doc's terms, replayed in the code's order. `shape`: the rank's q [b, heads, s_r, d]
    with heads its tensor-parallel share (Ulysses splits them again over cp)."""
    if kind not in CP_KINDS:
        raise ValueError(f"context-parallel attention is one of {', '.join(CP_KINDS)}, got {kind!r}")
    if kind == "ulysses" and shape.heads % layout.parts:
        raise ValueError(f"Ulysses gives each of the {layout.parts} ranks whole heads: {shape.heads} "
                         "do not divide")
    live = _Live()
    replay = _ring_backward if kind == "ring" else _ulysses_backward
    replay(live, shape, layout, rank, causal)
    return live.peak


@functools.lru_cache(maxsize=1024)  # the planner asks for a few shapes over and over; cp 64 takes 0.5 s
def context_backward_peak_bytes(a: Decoder, sequences: int, itemsize: int, tp: int = 1, cp: int = 2,
                                kind: str = "ring") -> int:
    """context_backward_rank_bytes of dt's layers (each tensor-parallel rank's heads, dt train's
    zig-zag split of a.seq_len tokens) on the busiest cp rank."""
    shape = AttentionShape(sequences, a.n_head // tp, a.head_dim, itemsize)
    layout = SequenceLayout(a.seq_len, cp, zigzag=True)
    return max(context_backward_rank_bytes(shape, layout, rank, kind) for rank in range(cp))
