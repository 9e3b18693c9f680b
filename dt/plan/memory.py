"""One layout's peak bytes per rank: what a stage holds at the worst moment of its step.

    state        parameters, gradients and Adam's two moments of this rank's
                 tensors (dt.parallel.zero.zero_memory_parts: ZeRO-1 shards
                 the moments over dp); on a catalogue GPU the stack's bytes per
                 parameter (dt.cost.stack: dt's float32 weights, gradients and
                 moments, 4 + 4 + 8, and autocast's 2-byte copy; Megatron's
                 2 + 4 + 4 + 8), here dt's own float32 (or float64)
    activations  what autograd keeps per layer and micro-batch (below, the head's
                 logits included), times the micro-batches the schedule holds at
                 once (the peak stash: GPipe m, 1F1B p - s on stage s, interleaved
                 more), per chunk; with recompute only each block's input is kept,
                 plus one block's whole set while it is recomputed
    scratch      ZeRO's reduce-scatters' ring scratch, kept between steps (the optimizer's
                 and FSDP's own comm_scratch_formula: about 1.5x the largest one's input)
    buffers      the largest DDP bucket's flat copy (all_reduce_buckets); ZeRO has none:
                 stage 2 adds its buckets' flat copies (all of them, made in backward,
                 freed at its end) to the activations, stage 3 the units it holds
                 gathered whole (dt.parallel.zero.memory.fsdp_gathered_formula of the
                 stage's own units, dt.plan.stage.fsdp_units; its state 16 Psi_stage / N,
                 the experts' part over their N / ep replicas)

Activation bytes per layer are dt.cost.activations' (what dt's layers save,
checked there against saved_tensors_hooks): one micro-batch through a chunk's
layers, times the chunk's peak stash (an MoE block's with uniform routing and
no drops: each rank receives the rows its own tokens chose). Peak = state + scratch +
max(activations, buffers): the buckets are built after the last backward,
when the activations are gone.
"""

from __future__ import annotations

import functools

from dt.cost.activations import recompute_peak_bytes, stage_activation_bytes
from dt.cost.flops import Decoder
from dt.layout import split_sizes
from dt.parallel.pipeline.schedules import stage_layers
from dt.parallel.pipeline.stash import peak_stash_bytes
from dt.parallel.zero.memory import comm_scratch_formula, fsdp_gathered_formula, zero_memory_parts
from dt.plan.cluster import Cluster
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.stage import FsdpUnits, bucket_bytes, fsdp_units, layer_cut, micro_batch_sizes, stage_tensors

__all__ = ["peak_bytes"]


def _decoder(model: ModelShape, seq: int) -> Decoder:
    return model.decoder(seq)


@functools.lru_cache(maxsize=65536)
def _stash_bytes(name: str, p: int, s: int, m: int, chunks: tuple[float, ...]) -> float:
    return peak_stash_bytes(name, p, s, m, chunks)  # many layouts (ZeRO, placement) share one


@functools.lru_cache(maxsize=65536)
def _chunk_activations(model: ModelShape, seq: int, pp: int, stage: int, virtual: int, b: int, item: int,
                       tp: int, cp: int, recompute: str, sequence_parallel: bool = False,
                       attention: str = "sdpa", dropout: bool = False, partition: str = "layers",
                       shard_inputs: bool = False) -> list[float]:
    """Activation bytes of each chunk of `stage` (layouts differing in ZeRO or schedule share them)."""
    a = _decoder(model, seq)
    cut = layer_cut(model, pp, virtual, partition)
    return [stage_activation_bytes(a, r, b, item, tp, cp, sequence_parallel, attention, recompute,
                                   dropout=dropout, shard_inputs=shard_inputs)
            for r in stage_layers(model.n_layer + 2, pp, stage, cut, virtual)]


def _without(dense: list[int], kept: int) -> list[int]:
    """The tensors without the kept word table (ZeRO 2 scatters it apart)."""
    out = list(dense)
    if kept and kept in out:
        out.remove(kept)
    return out


@functools.lru_cache(maxsize=4096)  # thousands of layouts share a few (tensors, ranks): price each once
def _zero_scratch(zero: int, parts: tuple[tuple[tuple[int, ...], int], ...], kept: int, n: int,
                  item: int) -> float:
    """The ring's scratch ZeRO 1-2's reduce-scatters keep between steps (comm_scratch_formula),
    each part over the ranks that hold it: ZeRO 1 one flat gradient per part, ZeRO 2 each
    bucket and the kept table. Stage 2's run on dt's gradient thread, whose scratch is its own."""
    pieces = []
    for tensors, ranks in parts:
        if ranks > 1 and tensors:
            sizes = [sum(tensors)] if zero == 1 else [b // item for b in bucket_bytes(list(tensors), item)]
            pieces += [split_sizes(k, ranks) for k in sizes]
    if zero == 2 and kept:
        pieces.append(split_sizes(kept, n))
    return comm_scratch_formula(pieces, item, 0)


@functools.lru_cache(maxsize=4096)
def _fsdp_scratch(units: FsdpUnits, n: int, replicas: int, item: int) -> int:
    """The ring's scratch FSDP's unit reduce-scatters keep (comm_scratch_formula): each unit cut
    over its group, dp x cp's `n` or the experts' `replicas`, one pool for both."""
    cuts = [split_sizes(u, n) for u in units.plane]
    cuts += [split_sizes(u, replicas) for u in units.experts] if replicas > 1 else []
    return comm_scratch_formula(cuts, item, 0)


def _state(c: Cluster, lay: Layout, dense: list[int], experts: int, n: int, kept: int) -> float:
    """Weights, gradients and the optimizer's state of this rank's tensors: on a GPU (a catalogue
    one, or this host's under --timed: dt train's stack there) the stack's bytes per parameter
    (dt.cost.stack) and its autocast copies (ZeRO 3's of its shards: a unit's whole copy is made
    while it is gathered); here dt's float32 (or float64)."""
    groups = [(sum(dense), n), (experts, n // lay.ep)]  # the dense part over dp x cp, experts over edp
    if c.device is not None:
        st = c.stack
        parts = zero_memory_parts(groups, lay.zero, k=st.master_bytes + st.moment_bytes,
                                  param_bytes=st.weight_bytes, grad_bytes=st.grad_bytes, kept=kept)
        copies = sum(numbers / (ranks if lay.zero == 3 else 1) for numbers, ranks in groups)
        return sum(parts.values()) + st.cast_bytes * copies
    item = c.itemsize
    parts = zero_memory_parts(groups, lay.zero, k=2 * item, param_bytes=item, grad_bytes=item, kept=kept)
    return sum(parts.values())


def _activation_kind(c: Cluster) -> tuple[str, bool]:
    """(dt.cost.activations' attention, dropout) as the cluster's stack runs them: a fused kernel
    keeps no score matrix ("sdpa"), an unfused one keeps it ("dt"); here dt's own layers."""
    if c.gpu is None:
        return "sdpa", False
    return ("dt" if c.stack.attention == "unfused" else "sdpa"), c.stack.dropout


def peak_bytes(c: Cluster, model: ModelShape, lay: Layout, batch: int, seq: int) -> list[dict[str, int]]:
    """Per pipeline stage: {state, scratch, activations, buffers, runtime, peak} bytes of one of its
    ranks. On a catalogue GPU the peak is what the caching allocator reserves (the stack's
    fragmentation over the live bytes) plus the runtime's own (CUDA context, NCCL's buffers)."""
    item = c.itemsize
    b = max(micro_batch_sizes(batch, lay.dp, lay.micro_batches))  # the largest micro-batch
    a = _decoder(model, seq)
    attention, dropout = _activation_kind(c)
    sp = lay.sequence_parallel and lay.tp > 1
    cut = c.stack.partition
    out = []
    for s in range(lay.pp):
        dense, experts, _, head, embed = stage_tensors(model, lay, seq, s, cut)
        # ZeRO shards the dense part over the whole data plane, dp x cp (dt.train.step's dp group),
        # the experts over their replicas (dt.parallel.zero.parts)
        n = lay.dp * lay.cp
        # ZeRO 2 keeps a word table's full gradient two stages sum (dt.parallel.zero.optimizer)
        tied = model.tied and lay.pp > 1 and head != embed
        kept = model.vocab // lay.tp * model.n_embd if tied and lay.zero == 2 else 0
        state = _state(c, lay, dense, experts, n, kept)
        chunks = _chunk_activations(model, seq, lay.pp, s, lay.virtual, b, item, lay.tp, lay.cp,
                                    lay.recompute, sp, attention, dropout, cut, c.stack.sp_shard_inputs)
        acts = _stash_bytes(lay.schedule, lay.pp, s, lay.micro_batches, tuple(chunks))
        if lay.recompute == "full":  # one block's whole set, rebuilt for its backward
            acts += recompute_peak_bytes(a, b, item, lay.tp, lay.cp, sp, attention)
        grad_item = c.grad_itemsize
        buffers, scratch = max(bucket_bytes(dense, grad_item), default=0) if n > 1 else 0, 0
        if lay.zero and n > 1:
            buffers = 0  # no DDP buckets: ZeRO 1's flat gradient is in the state
            parts = ((tuple(_without(dense, kept)), n), ((experts,) if experts else (), n // lay.ep))
            scratch = _zero_scratch(lay.zero, parts, kept, n, grad_item) if lay.zero < 3 else \
                _fsdp_scratch(fsdp_units(model, lay, seq, s, cut), n, n // lay.ep, grad_item)
        if lay.zero == 2 and n > 1:  # every bucket's flat copy, made in backward, freed at its end
            acts += (sum(dense) - kept + experts) * grad_item
        if lay.zero == 3 and n > 1:  # this stage's units gathered whole as they run
            units = fsdp_units(model, lay, seq, s, cut)
            acts += fsdp_gathered_formula(units.root, list(units.dense + units.experts), c.param_itemsize)
        row = {"state": int(state), "scratch": int(scratch), "activations": int(acts),
               "buffers": int(buffers)}
        live = row["state"] + row["scratch"] + max(row["activations"], row["buffers"])
        runtime = c.stack.runtime_bytes if c.device is not None else 0.0
        fragmentation = c.stack.fragmentation if c.device is not None else 1.0
        row["runtime"] = int(runtime + (fragmentation - 1) * live)
        row["peak"] = live + row["runtime"]
        out.append(row)
    return out
