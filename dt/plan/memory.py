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
                 plus one block's whole set while it is recomputed; under cp, dt's own
                 ring attention or Ulysses, the larger of that and the moment a chunk's
                 top block's attention core runs backward; under gradient accumulation
                 with dt's DDP, each chunk's summed .grad beside the buckets from its
                 first backward to its last (both below)
    scratch      ZeRO's reduce-scatters' ring scratch, kept between steps (the optimizer's
                 and FSDP's own comm_scratch_formula: about 1.5x the largest one's input)
    optimizer    the optimizer step's temporaries: the stack's working copies
                 (dt.cost.stack's optimizer_copies: dt's Adam one, a fused kernel none)
                 of the largest tensor it steps (under ZeRO the flat shard; optimizer.py's
                 adam_tensors), made after backward, when the activations are gone
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
max(activations, buffers, optimizer): the buckets are built after the last backward,
when the activations are gone, and the optimizer steps after them.

Context parallel's backward holds far more than its activations for a moment: its working set
(dt.cost.context_backward.context_backward_peak_bytes: 18 times a q's bytes at cp 2 while a
rank's tokens are at most about the head dimension, more with longer score blocks and from cp 3).
Measured around dt train's step, the step's peak is then mostly inside a chunk's top block's
attention backward, and it is the stash, less what that micro-batch's backward has already
freed (the block's parts above the core: the projection's input, the second norm, the MLP; in
the chunk holding the head, the head's), plus what recompute rebuilt (the block, or the core's
output), the residual stream's gradient (and in any other chunk the gradient received from the
next position), and the working set, its incoming gradient included. Only for a stack whose
context-parallel attention is dt's block-wise one (dt.cost.stack's blockwise_cp_attention: dt's
own, here or on a GPU, where it is priced at the autocast dtype, unmeasured there); fused
ring-flash kernels hold tiles, not score blocks, and are not priced here. Where the moment is
below the stash (a short sequence, a wide MLP or vocabulary freed first) the stash stays the
figure.

Gradient accumulation under dt's DDP (dt.cost.stack's grad_beside_buckets): the micro-batches
before a chunk's last sum their gradients in .grad beside the buckets, so each chunk's gradients
are held twice from its first backward until its last, replayed with the stash action by action
(dt.parallel.pipeline.stash.peak_stash_bytes).
"""

from __future__ import annotations

import functools
from dataclasses import replace

from dt.cost.activations import (
    block_above_core_bytes,
    layer_activation_bytes,
    recompute_peak_bytes,
    stage_activation_bytes,
)
from dt.cost.context_backward import context_backward_peak_bytes
from dt.layout import split_sizes
from dt.parallel.pipeline.schedules import stage_layers
from dt.parallel.pipeline.stash import peak_stash_bytes
from dt.parallel.zero.memory import comm_scratch_formula, fsdp_gathered_formula, zero_memory_parts
from dt.plan.cluster import Cluster
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.optimizer import adam_tensors
from dt.plan.stage import (
    FsdpUnits,
    StageTensors,
    bucket_bytes,
    fsdp_units,
    layer_cut,
    micro_batch_sizes,
    stage_tensors,
)

__all__ = ["MEMORY_SCOPES", "counted", "peak_bytes", "state_floor"]


@functools.lru_cache(maxsize=65536)
def _stash_bytes(name: str, stages: int, stage: int, micro_batches: int, chunks: tuple[float, ...],
                 gradients: tuple[float, ...] | None = None) -> float:
    # many layouts (ZeRO, placement) share one
    return peak_stash_bytes(name, stages, stage, micro_batches, chunks, gradients)


@functools.lru_cache(maxsize=65536)
def _chunk_activations(model: ModelShape, seq: int, pp: int, stage: int, virtual: int, sequences: int,
                       item: int, tp: int, cp: int, recompute: str, sequence_parallel: bool = False,
                       attention: str = "sdpa", dropout: bool = False, partition: str = "layers",
                       shard_inputs: bool = False, fused_norm: bool = False) -> list[float]:
    """Activation bytes of each chunk of `stage` (layouts differing in ZeRO or schedule share them)."""
    decoder = model.decoder(seq)
    cut = layer_cut(model, pp, virtual, partition)
    return [stage_activation_bytes(decoder, layers, sequences, item, tp=tp, cp=cp,
                                   sequence_parallel=sequence_parallel, attention=attention,
                                   recompute=recompute, dropout=dropout, shard_inputs=shard_inputs,
                                   fused_norm=fused_norm)
            for layers in stage_layers(model.n_layer + 2, pp, stage, cut, virtual)]


def _without(dense: list[int], kept: int) -> list[int]:
    """The tensors without the kept word table (ZeRO 2 scatters it apart)."""
    out = list(dense)
    if kept and kept in out:
        out.remove(kept)
    return out


@functools.lru_cache(maxsize=4096)  # thousands of layouts share a few (tensors, ranks): price each once
def _zero_scratch(zero: int, parts: tuple[tuple[tuple[int, ...], int], ...], kept: int, ranks: int,
                  item: int) -> float:
    """The ring's scratch ZeRO 1-2's reduce-scatters keep between steps (comm_scratch_formula),
    each part (its tensors, the ranks that hold it) over its ranks: ZeRO 1 one flat gradient per
    part, ZeRO 2 each bucket and the kept table (over dp x cp's `ranks`). Stage 2's run on dt's
    gradient thread, whose scratch is its own."""
    pieces = []
    for tensors, holders in parts:
        if holders > 1 and tensors:
            if zero == 1:
                sizes = [sum(tensors)]
            else:
                sizes = [nbytes // item for nbytes in bucket_bytes(list(tensors), item)]
            pieces += [split_sizes(numel, holders) for numel in sizes]
    if zero == 2 and kept:
        pieces.append(split_sizes(kept, ranks))
    return comm_scratch_formula(pieces, item, 0)


@functools.lru_cache(maxsize=4096)
def _fsdp_scratch(units: FsdpUnits, ranks: int, replicas: int, item: int) -> int:
    """The ring's scratch FSDP's unit reduce-scatters keep (comm_scratch_formula): each unit cut
    over its group, dp x cp's `ranks` or the experts' `replicas`, one pool for both."""
    cuts = [split_sizes(unit, ranks) for unit in units.plane]
    cuts += [split_sizes(unit, replicas) for unit in units.experts] if replicas > 1 else []
    return comm_scratch_formula(cuts, item, 0)


def _state(cluster: Cluster, layout: Layout, dense: list[int], experts: int, ranks: int, kept: int) -> float:
    """Weights, gradients and the optimizer's state of this rank's tensors, sharded over dp x cp's
    `ranks`: on a GPU (a catalogue one, or this host's under --timed: dt train's stack there) the
    stack's bytes per parameter (dt.cost.stack) and its autocast copies (ZeRO 3's of its shards: a
    unit's whole copy is made while it is gathered); here dt's float32 (or float64)."""
    groups = [(sum(dense), ranks), (experts, ranks // layout.ep)]  # dense over dp x cp, experts over edp
    if cluster.device is not None:
        stack = cluster.stack
        parts = zero_memory_parts(groups, layout.zero, k=stack.master_bytes + stack.moment_bytes,
                                  param_bytes=stack.weight_bytes, grad_bytes=stack.grad_bytes, kept=kept)
        copies = sum(numbers / (holders if layout.zero == 3 else 1) for numbers, holders in groups)
        return sum(parts.values()) + stack.cast_bytes * copies
    item = cluster.itemsize
    # Adam's two moments at the weights' own precision
    parts = zero_memory_parts(groups, layout.zero, k=2 * item, param_bytes=item, grad_bytes=item, kept=kept)
    return sum(parts.values())


def _activation_kind(cluster: Cluster) -> tuple[str, bool]:
    """(dt.cost.activations' attention, dropout) as the cluster's stack runs them: a fused kernel
    keeps no score matrix ("sdpa"), an unfused one keeps it ("dt"); here dt's own layers."""
    if cluster.gpu is None:
        return "sdpa", False
    return ("dt" if cluster.stack.attention == "unfused" else "sdpa"), cluster.stack.dropout


def _activations(cluster: Cluster, model: ModelShape, layout: Layout, seq: int, stage: int, sequences: int,
                 sequence_parallel: bool, accumulated: tuple[float, ...] | None = None) -> float:
    """The stage's activations at its peak stash of its largest micro-batch (`sequences`), with
    recompute's rebuilt block; `accumulated`: each chunk's gradient bytes held twice from its first
    backward until its last (gradient accumulation under dt's DDP)."""
    item = cluster.itemsize
    attention, dropout = _activation_kind(cluster)
    fused_norm = cluster.gpu is not None and cluster.stack.fused_norm
    chunks = _chunk_activations(model, seq, layout.pp, stage, layout.virtual, sequences, item, tp=layout.tp,
                                cp=layout.cp, recompute=layout.recompute, sequence_parallel=sequence_parallel,
                                attention=attention, dropout=dropout, partition=cluster.stack.partition,
                                shard_inputs=cluster.stack.sp_shard_inputs, fused_norm=fused_norm)
    stash = _stash_bytes(layout.schedule, layout.pp, stage, layout.micro_batches, tuple(chunks), accumulated)
    acts = stash
    if layout.recompute == "full":  # one block's whole set, rebuilt for its backward
        acts += recompute_peak_bytes(model.decoder(seq), sequences, item, layout.tp, layout.cp,
                                     sequence_parallel, attention, fused_norm=fused_norm)
    if layout.cp > 1 and cluster.stack.blockwise_cp_attention:  # dt's own ring attention or Ulysses
        acts = max(acts, stash + _context_backward(cluster, model, layout, seq, stage, sequences,
                                                   sequence_parallel))
    return acts


def _context_backward(cluster: Cluster, model: ModelShape, layout: Layout, seq: int, stage: int,
                      sequences: int, sequence_parallel: bool) -> float:
    """What the stash changes by while a chunk's top block's attention core runs backward under cp,
    on the chunk where that is most: its recompute rebuilt, less what that micro-batch's backward
    has freed above the core (the block's parts above it; the head's in the chunk that holds it),
    plus the gradients in flight (the residual stream's; in any other chunk the one received from
    the next position) and the core's working set, its incoming gradient included
    (dt.cost.context_backward.context_backward_peak_bytes). 0 for a stage without blocks."""
    cut = layer_cut(model, layout.pp, layout.virtual, cluster.stack.partition)
    chunks = stage_layers(model.n_layer + 2, layout.pp, stage, cut, layout.virtual)
    heads = [model.n_layer + 1 in chunk for chunk in chunks if any(1 <= n <= model.n_layer for n in chunk)]
    if not heads:
        return 0.0
    decoder, item, tp, cp = model.decoder(seq), cluster.itemsize, layout.tp, layout.cp
    rebuilt = recompute_peak_bytes(decoder, sequences, item, tp, cp, sequence_parallel,
                                   recompute=layout.recompute)
    above = block_above_core_bytes(decoder, sequences, item, tp, cp, sequence_parallel)
    head = layer_activation_bytes(decoder, model.n_layer + 1, sequences, item, tp, cp, sequence_parallel)
    residual = item * seq / cp * sequences * model.n_embd / (tp if sequence_parallel else 1)
    working = context_backward_peak_bytes(decoder, sequences, item, tp, cp, layout.cp_attention)
    # the chunk holding the head frees it first and receives nothing; any other receives a gradient
    moment = max(-head if holds_head else residual for holds_head in heads)
    return rebuilt - above + residual + working + moment


def _sharding(model: ModelShape, layout: Layout, tensors: StageTensors) -> tuple[int, int]:
    """(ranks ZeRO shards the dense part over, numbers of a tied word table kept whole)."""
    # ZeRO shards the dense part over the whole data plane, dp x cp (dt.train.step's dp group),
    # the experts over their replicas (dt.parallel.zero.parts)
    ranks = layout.dp * layout.cp
    # ZeRO 2 keeps a word table's full gradient two stages sum (dt.parallel.zero.optimizer)
    tied = model.tied and layout.pp > 1 and tensors.head != tensors.embed
    return ranks, model.vocab // layout.tp * model.n_embd if tied and layout.zero == 2 else 0


def _stage_peak(cluster: Cluster, model: ModelShape, layout: Layout, seq: int, stage: int, sequences: int,
                tensors: StageTensors) -> dict[str, int]:
    """{state, scratch, activations, buffers, optimizer, fragmentation, runtime, peak} bytes of one rank
    of `stage`."""
    dense, experts, cut = tensors.dense, tensors.experts, cluster.stack.partition
    ranks, kept = _sharding(model, layout, tensors)
    state = _state(cluster, layout, dense, experts, ranks, kept)
    sequence_parallel = layout.sequence_parallel and layout.tp > 1
    grad_item = cluster.grad_itemsize
    acts = _activations(cluster, model, layout, seq, stage, sequences, sequence_parallel,
                        _accumulated(cluster, model, layout, ranks, tensors))
    buffers, scratch = max(bucket_bytes(dense, grad_item), default=0) if ranks > 1 else 0, 0
    if layout.zero and ranks > 1:
        buffers = 0  # no DDP buckets: ZeRO 1's flat gradient is in the state
        parts = ((tuple(_without(dense, kept)), ranks), ((experts,) if experts else (), ranks // layout.ep))
        scratch = _zero_scratch(layout.zero, parts, kept, ranks, grad_item) if layout.zero < 3 else \
            _fsdp_scratch(fsdp_units(model, layout, seq, stage, cut), ranks, ranks // layout.ep, grad_item)
    if layout.zero == 2 and ranks > 1:  # every bucket's flat copy, made in backward, freed at its end
        acts += (sum(dense) - kept + experts) * grad_item
    if layout.zero == 3 and ranks > 1:  # this stage's units gathered whole as they run
        units = fsdp_units(model, layout, seq, stage, cut)
        acts += fsdp_gathered_formula(units.root, list(units.dense + units.experts), cluster.param_itemsize)
    row = {"state": int(state), "scratch": int(scratch), "activations": int(acts), "buffers": int(buffers),
           "optimizer": _optimizer_working(cluster, model, layout, seq, stage, tensors, ranks)}
    live = row["state"] + row["scratch"] + max(row["activations"], row["buffers"], row["optimizer"])
    catalogue = cluster.device is not None  # this machine's processes: the live bytes only
    row["fragmentation"] = int((cluster.stack.fragmentation - 1) * live) if catalogue else 0
    row["runtime"] = int(cluster.stack.runtime_bytes) if catalogue else 0
    row["peak"] = live + row["fragmentation"] + row["runtime"]
    return row


def _optimizer_working(cluster: Cluster, model: ModelShape, layout: Layout, seq: int, stage: int,
                       tensors: StageTensors, ranks: int) -> int:
    """Bytes of the optimizer step's temporaries: the stack's working copies of the largest tensor
    it steps, in the precision it steps them (the master's on a catalogue GPU, here dt's own)."""
    copies = cluster.stack.optimizer_copies
    if not copies:
        return 0
    fsdp = fsdp_units(model, layout, seq, stage, cluster.stack.partition) if layout.zero == 3 and ranks > 1 \
        else None
    sizes = adam_tensors(layout, tensors.dense, tensors.experts, fsdp, ranks, max(1, ranks // layout.ep))
    item = (cluster.stack.master_bytes or cluster.stack.weight_bytes) if cluster.device is not None \
        else cluster.itemsize
    return copies * max(sizes, default=0) * item


def _accumulated(cluster: Cluster, model: ModelShape, layout: Layout, ranks: int,
                 tensors: StageTensors) -> tuple[float, ...] | None:
    """Gradient bytes dt's DDP holds twice under gradient accumulation: the micro-batches before a
    chunk's last sum their gradients in .grad (no_sync), beside the buckets sized for the whole
    gradient (the state's copy); the last one's hooks copy the sum in, and .grad then points at
    the buckets. Only a stack whose DDP keeps its buckets apart from .grad (dt's), which a model
    with experts does not use."""
    ddp = layout.zero == 0 and ranks > 1 and not model.experts and cluster.stack.grad_beside_buckets
    if not ddp or layout.micro_batches == 1:
        return None
    return tuple(sum(chunk) * cluster.grad_itemsize for chunk in tensors.chunks)


def state_floor(cluster: Cluster, model: ModelShape, layout: Layout, seq: int) -> float:
    """A peak per rank that no micro-batching, schedule or recompute of this layout goes under: its
    largest stage's state, with the runtime's bytes and the allocator's share of it (a catalogue GPU;
    0 here). A search drops a layout whose floor is over the memory without pricing the rest."""
    if cluster.device is None:
        return 0.0
    return _state_floor(cluster, model, replace(layout, micro_batches=1, recompute="none",
                                                sequence_parallel=False, schedule="1f1b"), seq)


@functools.lru_cache(maxsize=1 << 14)
def _state_floor(cluster: Cluster, model: ModelShape, layout: Layout, seq: int) -> float:
    stack = cluster.stack
    floor = 0.0
    for stage in range(layout.pp):
        tensors = stage_tensors(model, layout, seq, stage, stack.partition)
        state = _state(cluster, layout, tensors.dense, tensors.experts, *_sharding(model, layout, tensors))
        floor = max(floor, state * stack.fragmentation + stack.runtime_bytes)
    return floor


def peak_bytes(cluster: Cluster, model: ModelShape, layout: Layout, batch: int,
               seq: int) -> list[dict[str, int]]:
    """Per pipeline stage: {state, scratch, activations, buffers, optimizer, fragmentation, runtime, peak}
    bytes of one of its ranks. On a catalogue GPU the peak is what the caching allocator reserves (the live
    bytes and the stack's fragmentation over them) plus the runtime's own (CUDA context, NCCL's
    buffers): what nvidia-smi shows (MEMORY_SCOPES below: what other measurements count)."""
    largest = max(micro_batch_sizes(batch, layout.dp, layout.micro_batches))
    return [_stage_peak(cluster, model, layout, seq, stage,
                        largest, stage_tensors(model, layout, seq, stage, cluster.stack.partition))
            for stage in range(layout.pp)]


# What a measured peak counts, widest first, and which of peak_bytes' parts it leaves out.
MEMORY_SCOPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "device": ("everything on the GPU, as nvidia-smi shows it: the CUDA context and NCCL's buffers "
               "included", ()),
    "reserved": ("torch.cuda.max_memory_reserved: the caching allocator's blocks (tensors and the "
                 "fragmentation between them), not the CUDA context or NCCL's buffers", ("runtime",)),
    "allocated": ("torch.cuda.max_memory_allocated: the live tensors alone (on this machine's CPU, "
                  "dt.device_memory.LiveBytes')", ("runtime", "fragmentation")),
}


def counted(stage: dict[str, int], scope: str) -> int:
    """A stage's predicted peak (a peak_bytes row) as a measurement of `scope` counts it: torch's
    allocator sees neither the CUDA context nor NCCL's buffers, its allocated bytes not the
    fragmentation either."""
    return stage["peak"] - sum(stage[part] for part in MEMORY_SCOPES[scope][1])
