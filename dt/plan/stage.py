"""What one pipeline stage of a layout holds and does: its tensors, its layers' seconds and messages.

Tensor sizes follow dt's GPT (dt.models.gpt) as gpt_plan shards it over tp: the embedding
and head are vocabulary-parallel (V / tp rows), every block's qkv and first
MLP matrix are column-parallel (output / tp) and the projections row-parallel
(input / tp), LayerNorms and row-parallel biases replicated; an MoE block's
experts split over ep. Messages per block and micro-batch, one activation of
b x t x C numbers each (b sequences, t = T / cp local tokens):

    tp   2 all-reduces forward (attention's g, the MLP's g), 2 backward (the f's)
    cp   ring: cp-1 hops of this rank's k and v forward, cp hops of k/v and
         their gradients backward; Ulysses: an all-to-all of q, k, v and one
         of the output forward, the same two backward (dt.cost.context)
    ep   dispatch and combine all-to-alls forward, the same two backward (dt.cost.moe),
         each of the b t top_k routed rows; routing assumed uniform (no imbalance term:
         dt's runs drop nothing, and the test model's router is near uniform)

plus the embedding's forward all-reduce, the head's backward one and the
vocabulary-parallel cross-entropy's three small all-reduces on tp.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

from dt.cost import ring_reduce_scatter
from dt.cost.flops import block_tensors
from dt.cost.stack import Stack
from dt.layout import split_sizes
from dt.parallel.buckets import MB, make_buckets
from dt.parallel.pipeline.schedules import stage_layers
from dt.parallel.zero.memory import SHARD_ALGORITHM, zero_traffic_formula
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds
from dt.plan.compute import StageShape, catalogue_stage, ddp_hooks, slowest_rank, stage_compute
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape

__all__ = ["BUCKET_CAP", "FIRST_BUCKET", "Charge", "FsdpUnits", "PlannedBucket", "RankGroups", "StageTensors",
           "StageWork", "bucket_bytes", "bucket_ready", "chunk_tensors", "fsdp_bytes_sent", "fsdp_exposed",
           "fsdp_units", "layer_cut", "micro_batch_sizes", "stage_tensors", "stage_work"]

BUCKET_CAP = 25 * MB  # DDP's and ZeRO 2's bucket cap (dt.parallel.data_parallel, dt.parallel.zero)
FIRST_BUCKET = 1 * MB  # their first bucket: small, so communication starts early in backward


class _Sized:
    """A tensor's size for make_buckets (numel, element_size, dtype), without the tensor."""

    def __init__(self, numel: int, itemsize: int):
        self._numel, self._itemsize, self.dtype = numel, itemsize, itemsize

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return self._itemsize


class PlannedBucket(NamedTuple):
    """A gradient bucket as the planner prices it (dt.parallel.buckets cuts the real ones alike)."""

    nbytes: int
    ready: float  # the fraction of its chunk's backward done when its last gradient arrives


class Charge(NamedTuple):
    """Seconds a stage's rank spends on one piece of its step outside the pipeline, by kind."""

    kind: str  # one of dt.plan.step_model.KINDS
    seconds: float
    label: str


def bucket_bytes(dense: list[int], itemsize: int) -> list[int]:
    """Bytes of each gradient bucket DDP (and ZeRO 2) makes of these tensors, in launch order."""
    return [bucket.nbytes for bucket in bucket_ready(dense, itemsize)]


def bucket_ready(dense: list[int], itemsize: int) -> list[PlannedBucket]:
    """Each bucket in launch order: make_buckets over the parameters reversed (backward's order),
    1 MB first, 25 MB cap; `ready` is the fraction of the chunk's backward done when its last
    gradient arrives, backward's pace taken as even per number."""
    return list(_buckets(tuple(dense), itemsize))


@functools.lru_cache(maxsize=4096)
def _buckets(dense: tuple[int, ...], itemsize: int) -> tuple[PlannedBucket, ...]:
    backward = dense[::-1]
    total = sum(backward) or 1
    done = [sum(backward[:i + 1]) / total for i in range(len(backward))]
    sized = [_Sized(numel, itemsize) for numel in backward]
    return tuple(PlannedBucket(sum(backward[i] for i in members) * itemsize, max(done[i] for i in members))
                 for members in make_buckets(sized, FIRST_BUCKET, BUCKET_CAP))


@dataclass(frozen=True)
class RankGroups:
    """One group of each kind this stage's rank belongs to (global ranks)."""

    tp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    dp_cp: tuple[int, ...]
    edp: tuple[int, ...]
    pp: tuple[int, ...]
    embed: tuple[int, ...]
    norm: tuple[int, ...] = ()  # pp x tp: clipping's global norm (dt.train.step's norm_group)


@dataclass(frozen=True)
class StageWork:
    """Seconds of one stage's work per micro-batch (all its chunks), split by kind."""

    fwd: dict[str, float]
    bwd: dict[str, float]
    dense: list[int]  # numbers of each dense tensor, in parameter order (gradient buckets)
    chunks: list[list[int]]  # the same, per model chunk (each chunk's DDP has its own buckets)
    experts: int  # numbers of this rank's expert weights
    blocks: int  # transformer blocks on this stage
    head: bool
    embed: bool
    fsdp: FsdpUnits | None = None  # zero 3 over more than one rank: its FSDP units (fsdp_units)
    tied: int = 0  # numbers of a word table this stage shares with another (the embedding's or head's)
    hooks: float = 0.0  # seconds DDP's hooks add to the synchronised backward (compute.ddp_hooks)
    slowest: float = 1.0  # the slowest rank's compute over the median's (compute.slowest_rank)


@dataclass(frozen=True)
class StageTensors:
    """What one rank of a pipeline stage holds: its tensors' sizes and which layers it has."""

    chunks: tuple[tuple[int, ...], ...]  # dense tensor sizes of each model chunk, in parameter order
    experts: int  # expert numbers on this rank (its share of ep)
    blocks: int  # transformer blocks
    head: bool
    embed: bool

    @property
    def dense(self) -> list[int]:
        """Every chunk's dense tensor sizes, in parameter order."""
        return [numel for chunk in self.chunks for numel in chunk]


def layer_cut(model: ModelShape, pp: int, virtual: int, partition: str = "layers") -> tuple[int, ...] | None:
    """Layers of each of the pp x virtual model chunks (dt.parallel.pipeline.stage_layers' `sizes`):
    None for dt train's cut (every layer counts one, the embedding and head included); "blocks" for
    Megatron's: the blocks split evenly, the embedding with the first chunk and the head with the last;
    "weights" for nanotron's: layers weighed by their matmuls' weights (weighed_cut)."""
    chunks = pp * virtual
    if partition == "layers" or chunks == 1 or chunks > model.n_layer:
        return None
    if partition == "weights":
        weighed = weighed_cut(model, chunks)
        if weighed is not None:
            return weighed
    sizes = split_sizes(model.n_layer, chunks)
    sizes[0] += 1
    sizes[-1] += 1
    return tuple(sizes)


def weighed_cut(model: ModelShape, chunks: int) -> tuple[int, ...] | None:
    """nanotron's cut (its build_model with get_block_compute_costs): each layer weighs its matmuls'
    weights (a block its own, the head V x h, the embedding's lookup nothing), and a chunk takes layers
    until their running weight passes its share of the total, the layer that passes it included. With
    a head heavy against the blocks this leaves the last stage fewer blocks than the first. None where
    a chunk would be left empty (the split nanotron cannot build)."""
    block = sum(block_tensors(model.decoder(1))[0])
    weights = [0] + [block] * model.n_layer + [model.vocab * model.n_embd]
    total, running, chunk = sum(weights), 0, 0
    sizes = [0] * chunks
    for weight in weights:
        sizes[chunk] += 1
        running += weight
        if running * chunks > total * (chunk + 1) and chunk < chunks - 1:
            chunk += 1
    return tuple(sizes) if min(sizes) > 0 else None


def _block_tensors(model: ModelShape, tp: int) -> tuple[list[int], int]:
    """(dense tensor sizes, expert numbers on one rank before ep) of one block: dt.cost.flops'
    count, the one layer_params sums (a block's tensors do not depend on the sequence)."""
    return block_tensors(model.decoder(1), tp)


@dataclass(frozen=True)
class FsdpUnits:
    """Numbers of each FSDP unit one rank of a stage holds (dt.parallel.zero.fsdp over each of its
    chunks: one unit per module's own parameters, its experts' apart), by the group it is sharded
    over (dt.parallel.plan._fully_sharded)."""

    root: int = 0  # a one-stage model's tied word table: gathered for the whole forward, and backward
    dense: tuple[int, ...] = ()  # over the stage's dp x cp, in the order they run
    experts: tuple[int, ...] = ()  # this rank's experts' fc_in and fc_out, over their replicas (edp)

    @property
    def plane(self) -> tuple[int, ...]:
        """The units over dp x cp: the root's first."""
        return ((self.root,) if self.root else ()) + self.dense

    @property
    def every(self) -> tuple[int, ...]:
        return self.plane + self.experts


def _block_units(model: ModelShape, tp: int, ep: int) -> tuple[list[int], list[int]]:
    """(dense units, this rank's expert units) of one block."""
    width = model.n_embd
    dense, _ = _block_tensors(model, tp)
    if model.family == "llama":  # q, k, v, o, gate, up, down apart; the norms one tensor each
        norm1, qkv, out, norm2, gate_up, down = dense
        kv = (qkv - width * width // tp) // 2
        return [norm1, qkv - 2 * kv, kv, kv, out, norm2, gate_up // 2, gate_up // 2, down], []
    # every LayerNorm and Linear holds a weight and a bias: one unit of both
    block = [dense[i] + dense[i + 1] for i in range(0, len(dense) - 1, 2)]
    if not model.experts:
        return block, []
    hidden = model.hidden  # the router's weight alone, then each of this rank's experts' two Linears
    router = dense[-1]
    return block + [router], [width * hidden + hidden, hidden * width + width] * -(-model.experts // ep)


def fsdp_units(model: ModelShape, layout: Layout, seq: int, stage: int,
               partition: str = "layers") -> FsdpUnits:
    """The FSDP units of `stage`'s rank: its chunks' layers' (embedding, blocks, head). A tied word
    table is the root's on one stage; with pp > 1 a unit of its own on both its stages."""
    return _fsdp_units(model, layout.tp, layout.pp, layout.virtual, layout.ep, seq, stage, partition)


@functools.lru_cache(maxsize=4096)
def _fsdp_units(model: ModelShape, tp: int, pp: int, virtual: int, ep: int, seq: int,
                stage: int, partition: str) -> FsdpUnits:
    width, layers, llama = model.n_embd, model.n_layer + 2, model.family == "llama"
    root = model.vocab // tp * width if model.tied and pp == 1 else 0
    word = [] if root else [model.vocab // tp * width]  # the embedding's, and the head's (tied: its copy)
    block, experts = _block_units(model, tp, ep)
    dense: list[int] = []
    moe: list[int] = []
    chunks = stage_layers(layers, pp, stage, layer_cut(model, pp, virtual, partition), virtual)
    for layer in (layer for chunk in chunks for layer in chunk):
        if layer == 0:
            dense += word + ([] if llama else [seq * width])  # rotary: no position table
        elif layer == layers - 1:
            dense += [width if llama else 2 * width] + word  # the final norm, then the head
        else:
            dense += block
            moe += experts
    return FsdpUnits(root, tuple(dense), tuple(moe))


def stage_tensors(model: ModelShape, layout: Layout, seq: int, stage: int,
                  partition: str = "layers") -> StageTensors:
    """The tensors of `stage`'s rank, each model chunk's apart, and which layers it holds."""
    return _tensors(model, layout.tp, layout.pp, layout.virtual, layout.ep, seq, stage, partition)


def chunk_tensors(model: ModelShape, layout: Layout, seq: int, stage: int,
                  partition: str = "layers") -> list[list[int]]:
    """Dense tensor sizes of each model chunk of `stage` (each chunk has its own DDP buckets)."""
    return [list(chunk) for chunk in stage_tensors(model, layout, seq, stage, partition).chunks]


@functools.lru_cache(maxsize=16384)
def _tensors(model: ModelShape, tp: int, pp: int, virtual: int, ep: int, seq: int, stage: int,
             partition: str = "layers") -> StageTensors:
    layers = model.n_layer + 2
    chunks = stage_layers(layers, pp, stage, layer_cut(model, pp, virtual, partition), virtual)
    held = [layer for chunk in chunks for layer in chunk]
    out: list[tuple[int, ...]] = []
    experts = 0
    blocks = 0
    for chunk in chunks:
        dense: list[int] = []
        for layer in chunk:
            if layer == 0:
                dense += [model.vocab // tp * model.n_embd]
                dense += [seq * model.n_embd] if model.family != "llama" else []  # rotary: no table
            elif layer == layers - 1:
                dense += [model.n_embd] * (1 if model.family == "llama" else 2)
                if not model.tied or pp > 1 and 0 not in held:
                    dense.append(model.vocab // tp * model.n_embd)
            else:
                block, block_experts = _block_tensors(model, tp)
                dense += block
                experts += block_experts // max(1, ep)
                blocks += 1
        out.append(tuple(dense))
    return StageTensors(chunks=tuple(out), experts=experts, blocks=blocks, head=layers - 1 in held,
                        embed=0 in held)


def _attention_messages(cluster: Cluster, layout: Layout, groups: RankGroups, act: float,
                        kv_share: float) -> tuple[float, float]:
    """(forward, backward) seconds of one block's context-parallel attention messages; act: one
    rank's activation bytes of all heads, kv_share: the keys' and values' heads over all heads."""
    if layout.cp == 1:
        return 0.0, 0.0
    if layout.cp_attention == "ulysses":
        qkv = collective_seconds(cluster, "all_to_all", (1 + 2 * kv_share) * act, groups.cp)
        out = collective_seconds(cluster, "all_to_all", act, groups.cp)
        return qkv + out, qkv + out
    from dt.plan.comm import send_seconds

    kv = kv_share * act
    neighbour = groups.cp[0], groups.cp[1]
    hop = send_seconds(cluster, 2 * kv, *neighbour)  # forward: k and v; backward: with their gradients
    return (layout.cp - 1) * hop, layout.cp * send_seconds(cluster, 4 * kv, *neighbour)


def _units(model: ModelShape, layout: Layout, groups: RankGroups, seq: int, stage: int,
           partition: str) -> FsdpUnits | None:
    if layout.zero != 3 or len(groups.dp_cp) < 2:
        return None
    return fsdp_units(model, layout, seq, stage, partition)


def _fsdp_seconds(cluster: Cluster, units: FsdpUnits | None, groups: RankGroups) -> tuple[float, float]:
    """(all-gathers, reduce-scatters) of one micro-batch's FSDP units (zero 3), each on the group
    it is sharded over: a forward gathers every unit, a backward gathers each again and
    reduce-scatters its gradient (what of them the compute hides: fsdp_exposed); 0 without zero 3."""
    if units is None:
        return 0.0, 0.0

    def each(collective: str) -> float:  # FSDP's ring (SHARD_ALGORITHM), as dt.parallel.zero.fsdp runs it
        ring = SHARD_ALGORITHM  # a model's units repeat (every block alike): each size priced once
        item = cluster.param_itemsize if collective == "all_gather" else cluster.grad_itemsize
        return (sum(count * collective_seconds(cluster, collective, numel * item, groups.dp_cp, ring)
                    for numel, count in Counter(units.plane).items())
                + sum(count * collective_seconds(cluster, collective, numel * item, groups.edp, ring)
                      for numel, count in Counter(units.experts).items()))

    return each("all_gather"), each("reduce_scatter")


def fsdp_bytes_sent(units: FsdpUnits, dp_cp: int, edp: int, itemsize: int, micro_batches: int,
                    dp_cp_rank: int = 0, edp_rank: int = 0,
                    grad_itemsize: int | None = None) -> tuple[int, int]:
    """Bytes one rank sends per step in FSDP's collectives, (over dp x cp, over edp): per unit and
    micro-batch two ring all-gathers of its `itemsize` weights and a ring reduce-scatter of its
    gradient (`grad_itemsize`, default the weights') over its group (zero_traffic_formula, as
    dt.parallel.zero.fsdp's expected_bytes_sent); `*_rank`: the rank's place in each group (the
    shards of a unit its group does not divide differ by one)."""
    grad = itemsize if grad_itemsize is None else grad_itemsize

    def over(sizes: tuple[int, ...], ranks: int, rank: int) -> int:
        if ranks < 2:
            return 0  # the formula sums over the units: each distinct size once, times its count
        return sum(count * _unit_bytes(numel, ranks, rank, itemsize, grad, micro_batches)
                   for numel, count in Counter(sizes).items())

    return over(units.plane, dp_cp, dp_cp_rank), over(units.experts, edp, edp_rank)


@functools.lru_cache(maxsize=65536)
def _unit_bytes(numel: int, ranks: int, rank: int, itemsize: int, grad_itemsize: int,
                micro_batches: int) -> int:
    """One FSDP unit's bytes sent by `rank` per step (zero_traffic_formula of its shards), its
    reduce-scatters' elements counted at the gradient's itemsize."""
    shards = split_sizes(numel, ranks)
    total = zero_traffic_formula([shards], rank, stage=3, itemsize=itemsize, micro_batches=micro_batches)
    scattered = ring_reduce_scatter(shards, 1, rank).bytes_sent * micro_batches  # elements
    return total + scattered * (grad_itemsize - itemsize)


def micro_batch_sizes(batch: int, dp: int, micro_batches: int) -> list[int]:
    """Sequences in each micro-batch of one rank, as dt train cuts them: the rank's batch / dp
    split by tensor_split into `micro_batches` (the first ones one longer where it does not divide)."""
    return split_sizes(batch // dp, micro_batches)


def _mean_over(sizes: list[int], price: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
    """(forward, backward) seconds of a micro-batch averaged over the step's sizes (at most two)."""
    total_fwd = total_bwd = 0.0
    for size, count in Counter(sizes).items():
        fwd, bwd = price(size)
        total_fwd, total_bwd = total_fwd + count * fwd, total_bwd + count * bwd
    return total_fwd / len(sizes), total_bwd / len(sizes)


def _compute(cluster: Cluster, model: ModelShape, layout: Layout, sizes: list[int], seq: int,
             tensors: StageTensors) -> tuple[float, float]:
    """(forward, backward) compute seconds of the stage's mean micro-batch: kernel by kernel on a
    catalogue GPU (dt.plan.compute.catalogue_stage), else timed or from FLOPs (stage_compute)."""
    if cluster.gpu is not None:
        def kernels(size: int) -> tuple[float, float]:
            shape = StageShape(sequences=size, seq=seq, tp=layout.tp, cp=layout.cp, blocks=tensors.blocks,
                               head=tensors.head, embed=tensors.embed,
                               sequence_parallel=layout.sequence_parallel, recompute=layout.recompute)
            return catalogue_stage(cluster, model, shape)

        return _mean_over(sizes, kernels)

    def measured(size: int) -> tuple[float, float]:
        return stage_compute(cluster, model, sequences=size, tokens=seq // layout.cp, keys=seq, tp=layout.tp,
                             world=layout.world, blocks=tensors.blocks, head=tensors.head,
                             embed=tensors.embed, recompute=layout.recompute == "full",
                             cp_kind=layout.cp_attention)

    return _mean_over(sizes, measured)


def _exposed(messages: float, compute: float, overlapped: bool) -> float:
    """Seconds of tensor parallel's messages the compute does not hide: all of them, unless the
    stack overlaps them with its GEMMs (then what runs past the compute)."""
    return max(0.0, messages - compute) if overlapped else messages


def fsdp_exposed(stack: Stack, gather: float, scatter: float, fwd: float, bwd: float) -> tuple[float, float]:
    """(forward, backward) seconds of ZeRO 3's collectives the compute does not hide: a forward
    gathers every unit, a backward gathers them again (unless the stack keeps them gathered from
    forward to backward) and reduce-scatters their gradients; with prefetch each runs behind the
    neighbouring unit's compute, so only what outlasts the compute waits."""
    regather = gather if stack.reshard_after_forward else 0.0
    if not stack.fsdp_prefetch:
        return gather, regather + scatter
    if stack.fsdp_scatter_behind:
        return max(0.0, gather - fwd), max(0.0, regather + scatter - bwd)
    return max(0.0, gather - fwd), max(0.0, regather - bwd) + scatter


TP_ALL_REDUCES = 2  # per block each way: forward attention's g and the MLP's g, backward their f's
NORM_GRADS_PER_BLOCK = 2  # a block's two norms, under sequence parallel on each rank's tokens only
LOSS_ALL_REDUCES = 3  # the vocabulary-parallel cross-entropy's small ones: max, target logit, sum
EP_ALL_TO_ALLS = 2  # per block each way: the experts' dispatch and combine


def _messages(cluster: Cluster, model: ModelShape, layout: Layout, groups: RankGroups, mean: float, seq: int,
              tensors: StageTensors) -> tuple[dict[str, float], dict[str, float]]:
    """(forward, backward) seconds of one mean micro-batch's blocking messages on tp, cp and ep (tp's
    whole: what of them an overlapping stack hides is _exposed's)."""
    tokens = seq // layout.cp
    act = mean * tokens * model.n_embd * cluster.itemsize
    activation = collective_seconds(cluster, "all_reduce", act, groups.tp)
    small = collective_seconds(cluster, "all_reduce", mean * tokens * cluster.itemsize, groups.tp)
    # a block's f and g: all-reduces, or under sequence parallel an all-gather in and a reduce-scatter
    # out each (the same bytes on a ring, twice the calls)
    sp = layout.sequence_parallel and layout.tp > 1
    block_pair = (collective_seconds(cluster, "all_gather", act, groups.tp)
                  + collective_seconds(cluster, "reduce_scatter", act, groups.tp)) if sp else activation
    per_norm = 1 if model.family == "llama" else 2  # RMSNorm's weight; LayerNorm's weight and bias
    norm_grad = collective_seconds(cluster, "all_reduce", model.n_embd * 4, groups.tp)  # float32 grads
    each = sp and cluster.stack.sp_norm_grads_each
    norm_grads = NORM_GRADS_PER_BLOCK * per_norm * norm_grad if each else 0.0
    kv_share = model.kv_heads / model.n_head
    cp_fwd, cp_bwd = _attention_messages(cluster, layout, groups, act / layout.tp, kv_share)
    routed = mean * tokens * model.top_k * model.n_embd * cluster.itemsize
    all_to_all = collective_seconds(cluster, "all_to_all", routed, groups.ep) if model.experts else 0.0
    blocks = tensors.blocks
    tp_fwd = (TP_ALL_REDUCES * blocks * block_pair + (activation if tensors.embed else 0.0)
              + (LOSS_ALL_REDUCES * small if tensors.head else 0.0))
    rerun = TP_ALL_REDUCES * blocks * block_pair if layout.recompute == "full" else 0.0  # forward's again
    tp_bwd = (TP_ALL_REDUCES * blocks * block_pair + blocks * norm_grads
              + (activation if tensors.head else 0.0) + rerun)
    ep = EP_ALL_TO_ALLS * all_to_all * blocks
    return {"tp": tp_fwd, "cp": cp_fwd * blocks, "ep": ep}, {"tp": tp_bwd, "cp": cp_bwd * blocks, "ep": ep}


def stage_work(cluster: Cluster, model: ModelShape, layout: Layout, groups: RankGroups, batch: int, seq: int,
               stage: int) -> StageWork:
    """One (mean) micro-batch through every chunk of `stage`, forward and backward, by kind."""
    cut = cluster.stack.partition
    tensors = stage_tensors(model, layout, seq, stage, cut)
    sizes = micro_batch_sizes(batch, layout.dp, layout.micro_batches)
    compute_fwd, compute_bwd = _compute(cluster, model, layout, sizes, seq, tensors)
    mean = sum(sizes) / len(sizes)
    messages_fwd, messages_bwd = _messages(cluster, model, layout, groups, mean, seq, tensors)
    units = _units(model, layout, groups, seq, stage, cut)
    gather, scatter = _fsdp_seconds(cluster, units, groups)
    overlap = cluster.gpu is not None and cluster.stack.overlap_tp
    # here the ranks' cores all compute: the gathering thread takes turns with them, hiding nothing
    stack = cluster.stack if cluster.gpu is not None else replace(cluster.stack, fsdp_prefetch=False)
    fsdp_fwd, fsdp_bwd = fsdp_exposed(stack, gather, scatter, compute_fwd, compute_bwd)
    fwd = {"compute": compute_fwd, "tp": _exposed(messages_fwd["tp"], compute_fwd, overlap),
           "cp": messages_fwd["cp"], "ep": messages_fwd["ep"], "dp": fsdp_fwd}
    bwd = {"compute": compute_bwd, "tp": _exposed(messages_bwd["tp"], compute_bwd, overlap),
           "cp": messages_bwd["cp"], "ep": messages_bwd["ep"], "dp": fsdp_bwd}
    shared = model.tied and layout.pp > 1 and tensors.head != tensors.embed
    tied = model.vocab // layout.tp * model.n_embd if shared else 0
    # the integer micro-batch the timed paths measure, at one rank's tokens
    timed = {"sequences": max(1, min(sizes)), "tokens": seq // layout.cp, "keys": seq, "tp": layout.tp,
             "world": layout.world, "blocks": tensors.blocks, "head": tensors.head, "embed": tensors.embed,
             "cp_kind": layout.cp_attention}
    ddp = layout.zero == 0 and len(groups.dp_cp) > 1 and not model.experts  # DDP wraps the chunks
    hooks = ddp_hooks(cluster, model, **timed) if ddp else 0.0
    slowest = slowest_rank(cluster, model, **timed)
    chunks = chunk_tensors(model, layout, seq, stage, cut)
    return StageWork(fwd=fwd, bwd=bwd, dense=tensors.dense, chunks=chunks, experts=tensors.experts,
                     blocks=tensors.blocks, head=tensors.head, embed=tensors.embed,
                     fsdp=units, tied=tied, hooks=hooks, slowest=slowest)
