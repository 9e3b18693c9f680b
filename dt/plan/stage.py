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
from dataclasses import dataclass

from dt.cost import ring_reduce_scatter
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

__all__ = ["BUCKET_CAP", "FIRST_BUCKET", "FsdpUnits", "RankGroups", "StageWork", "bucket_bytes",
           "bucket_ready", "chunk_tensors", "fsdp_bytes_sent", "fsdp_exposed", "fsdp_units", "layer_cut",
           "micro_batch_sizes", "stage_tensors", "stage_work"]

BUCKET_CAP = 25 * MB  # DDP's and ZeRO 2's bucket cap (dt.parallel.data_parallel, dt.parallel.zero)
FIRST_BUCKET = 1 * MB  # their first bucket: small, so communication starts early in backward


class _Sized:
    """A tensor's size for make_buckets (numel, element_size, dtype), without the tensor."""

    def __init__(self, numel: int, itemsize: int):
        self._n, self._i, self.dtype = numel, itemsize, itemsize

    def numel(self) -> int:
        return self._n

    def element_size(self) -> int:
        return self._i


def bucket_bytes(dense: list[int], itemsize: int) -> list[int]:
    """Bytes of each gradient bucket DDP (and ZeRO 2) makes of these tensors, in launch order."""
    return [nbytes for nbytes, _ in bucket_ready(dense, itemsize)]


def bucket_ready(dense: list[int], itemsize: int) -> list[tuple[int, float]]:
    """(bytes, ready) of each bucket in launch order: make_buckets over the parameters reversed
    (backward's order), 1 MB first, 25 MB cap; `ready` is the fraction of the chunk's backward
    done when its last gradient arrives, backward's pace taken as even per number."""
    return list(_buckets(tuple(dense), itemsize))


@functools.lru_cache(maxsize=4096)
def _buckets(dense: tuple[int, ...], itemsize: int) -> tuple[tuple[int, float], ...]:
    back = dense[::-1]
    total = sum(back) or 1
    done = [sum(back[:i + 1]) / total for i in range(len(back))]
    return tuple((sum(back[i] for i in idx) * itemsize, max(done[i] for i in idx))
                 for idx in make_buckets([_Sized(n, itemsize) for n in back], FIRST_BUCKET, BUCKET_CAP))


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


def layer_cut(model: ModelShape, pp: int, virtual: int, partition: str = "layers") -> tuple[int, ...] | None:
    """Layers of each of the pp x virtual model chunks (dt.parallel.pipeline.stage_layers' `sizes`):
    None for dt train's cut (every layer counts one, the embedding and head included); "blocks" for
    Megatron's: the blocks split evenly, the embedding with the first chunk and the head with the last."""
    chunks = pp * virtual
    if partition == "layers" or chunks == 1 or chunks > model.n_layer:
        return None
    sizes = split_sizes(model.n_layer, chunks)
    sizes[0] += 1
    sizes[-1] += 1
    return tuple(sizes)


def _block_tensors(model: ModelShape, tp: int) -> tuple[list[int], int]:
    """(dense tensor sizes, expert numbers on one rank before ep) of one block."""
    c, f = model.n_embd, model.hidden
    if model.family == "llama":  # RMSNorm, no biases; q and o of n_head heads, k and v of n_kv_head
        kv = 2 * model.kv_heads * (c // model.n_head) * c // tp
        return [c, c * c // tp + kv, c * c // tp, c, 2 * f * c // tp, f * c // tp], 0
    ln = [c, c]
    attn = [3 * c * c // tp, 3 * c // tp, c * c // tp, c]
    mats = 3 if model.gated else 2
    mlp = [(mats - 1) * f * c // tp, (mats - 1) * f // tp, f * c // tp, c]
    if model.experts:  # the router is dense; the experts' MLPs are not split over tp
        return ln + attn + ln + [c * model.experts], model.experts * (mats * c * f + f + c)
    return ln + attn + ln + mlp, 0


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
    c = model.n_embd
    dense, _ = _block_tensors(model, tp)
    if model.family == "llama":  # q, k, v, o, gate, up, down apart; the norms one tensor each
        norm1, qkv, o, norm2, gate_up, down = dense
        kv = (qkv - c * c // tp) // 2
        return [norm1, qkv - 2 * kv, kv, kv, o, norm2, gate_up // 2, gate_up // 2, down], []
    # every LayerNorm and Linear holds a weight and a bias: one unit of both
    block = [dense[i] + dense[i + 1] for i in range(0, len(dense) - 1, 2)]
    if not model.experts:
        return block, []
    f = model.hidden  # the router's weight alone, then each of this rank's experts' two Linears
    return block + [dense[-1]], [c * f + f, f * c + c] * -(-model.experts // ep)


def fsdp_units(model: ModelShape, lay: Layout, seq: int, stage: int, partition: str = "layers") -> FsdpUnits:
    """The FSDP units of `stage`'s rank: its chunks' layers' (embedding, blocks, head). A tied word
    table is the root's on one stage; with pp > 1 a unit of its own on both its stages."""
    return _fsdp_units(model, lay.tp, lay.pp, lay.virtual, lay.ep, seq, stage, partition)


@functools.lru_cache(maxsize=4096)
def _fsdp_units(model: ModelShape, tp: int, pp: int, virtual: int, ep: int, seq: int,
                stage: int, partition: str) -> FsdpUnits:
    c, n, llama = model.n_embd, model.n_layer + 2, model.family == "llama"
    root = model.vocab // tp * c if model.tied and pp == 1 else 0
    word = [] if root else [model.vocab // tp * c]  # the embedding's, and the head's (tied: its copy)
    block, experts = _block_units(model, tp, ep)
    dense: list[int] = []
    moe: list[int] = []
    chunks = stage_layers(n, pp, stage, layer_cut(model, pp, virtual, partition), virtual)
    for i in (i for r in chunks for i in r):
        if i == 0:
            dense += word + ([] if llama else [seq * c])  # rotary: no position table
        elif i == n - 1:
            dense += [c if llama else 2 * c] + word  # the final norm, then the head
        else:
            dense += block
            moe += experts
    return FsdpUnits(root, tuple(dense), tuple(moe))


def stage_tensors(model: ModelShape, lay: Layout, seq: int, stage: int,
                  partition: str = "layers") -> tuple[list[int], int, int, bool, bool]:
    """(dense tensor sizes, expert numbers, blocks, holds head, holds embedding) of `stage`'s rank."""
    chunks, *rest = _tensors(model, lay.tp, lay.pp, lay.virtual, lay.ep, seq, stage, partition)
    return ([n for c in chunks for n in c], *rest)


def chunk_tensors(model: ModelShape, lay: Layout, seq: int, stage: int,
                  partition: str = "layers") -> list[list[int]]:
    """Dense tensor sizes of each model chunk of `stage` (each chunk has its own DDP buckets)."""
    return [list(c) for c in _tensors(model, lay.tp, lay.pp, lay.virtual, lay.ep, seq, stage, partition)[0]]


@functools.lru_cache(maxsize=16384)
def _tensors(model: ModelShape, tp: int, pp: int, virtual: int, ep: int, seq: int, stage: int,
             partition: str = "layers") -> tuple[tuple[tuple[int, ...], ...], int, int, bool, bool]:
    n = model.n_layer + 2
    chunks = stage_layers(n, pp, stage, layer_cut(model, pp, virtual, partition), virtual)
    layers = [i for r in chunks for i in r]
    out: list[tuple[int, ...]] = []
    experts = 0
    blocks = 0
    for r in chunks:
        dense: list[int] = []
        for i in r:
            if i == 0:
                dense += [model.vocab // tp * model.n_embd]
                dense += [seq * model.n_embd] if model.family != "llama" else []  # rotary: no table
            elif i == n - 1:
                dense += [model.n_embd] * (1 if model.family == "llama" else 2)
                if not model.tied or pp > 1 and 0 not in layers:
                    dense.append(model.vocab // tp * model.n_embd)
            else:
                d, e = _block_tensors(model, tp)
                dense += d
                experts += e // max(1, ep)
                blocks += 1
        out.append(tuple(dense))
    return tuple(out), experts, blocks, n - 1 in layers, 0 in layers


def _attention_messages(c: Cluster, lay: Layout, g: RankGroups, act: float,
                        kv_share: float) -> tuple[float, float]:
    """(forward, backward) seconds of one block's context-parallel attention messages; act: one
    rank's activation bytes of all heads, kv_share: the keys' and values' heads over all heads."""
    if lay.cp == 1:
        return 0.0, 0.0
    if lay.cp_attention == "ulysses":
        qkv = collective_seconds(c, "all_to_all", (1 + 2 * kv_share) * act, g.cp)
        out = collective_seconds(c, "all_to_all", act, g.cp)
        return qkv + out, qkv + out
    from dt.plan.comm import send_seconds

    kv = kv_share * act
    hop = send_seconds(c, 2 * kv, g.cp[0], g.cp[1])
    return (lay.cp - 1) * hop, lay.cp * send_seconds(c, 4 * kv, g.cp[0], g.cp[1])


def _units(model: ModelShape, lay: Layout, g: RankGroups, seq: int, stage: int,
           partition: str) -> FsdpUnits | None:
    if lay.zero != 3 or len(g.dp_cp) < 2:
        return None
    return fsdp_units(model, lay, seq, stage, partition)


def _fsdp_seconds(c: Cluster, units: FsdpUnits | None, g: RankGroups) -> tuple[float, float]:
    """(all-gathers, reduce-scatters) of one micro-batch's FSDP units (zero 3), each on the group
    it is sharded over: a forward gathers every unit, a backward gathers each again and
    reduce-scatters its gradient (what of them the compute hides: fsdp_exposed); 0 without zero 3."""
    if units is None:
        return 0.0, 0.0

    def each(op: str) -> float:  # FSDP's ring (SHARD_ALGORITHM), as dt.parallel.zero.fsdp runs it
        ring = SHARD_ALGORITHM  # a model's units repeat (every block alike): each size priced once
        item = c.param_itemsize if op == "all_gather" else c.grad_itemsize
        return (sum(k * collective_seconds(c, op, n * item, g.dp_cp, ring)
                    for n, k in Counter(units.plane).items())
                + sum(k * collective_seconds(c, op, n * item, g.edp, ring)
                      for n, k in Counter(units.experts).items()))

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
        return sum(k * _unit_bytes(n, ranks, rank, itemsize, grad, micro_batches)
                   for n, k in Counter(sizes).items())

    return over(units.plane, dp_cp, dp_cp_rank), over(units.experts, edp, edp_rank)


@functools.lru_cache(maxsize=65536)
def _unit_bytes(numel: int, ranks: int, rank: int, itemsize: int, grad_itemsize: int,
                micro_batches: int) -> int:
    """One FSDP unit's bytes sent by `rank` per step (zero_traffic_formula of its shards), its
    reduce-scatters' elements counted at the gradient's itemsize."""
    shards = split_sizes(numel, ranks)
    total = zero_traffic_formula([shards], rank, 3, itemsize, micro_batches)
    scattered = ring_reduce_scatter(shards, 1, rank).bytes_sent * micro_batches  # elements
    return total + scattered * (grad_itemsize - itemsize)


def micro_batch_sizes(batch: int, dp: int, micro_batches: int) -> list[int]:
    """Sequences in each micro-batch of one rank, as dt train cuts them: the rank's batch / dp
    split by tensor_split into `micro_batches` (the first ones one longer where it does not divide)."""
    return split_sizes(batch // dp, micro_batches)


def _mean_over(sizes: list[int], price: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
    """(forward, backward) seconds of a micro-batch averaged over the step's sizes (at most two)."""
    total_f = total_b = 0.0
    for size, count in Counter(sizes).items():
        f, b = price(size)
        total_f, total_b = total_f + count * f, total_b + count * b
    return total_f / len(sizes), total_b / len(sizes)


def _compute(c: Cluster, model: ModelShape, lay: Layout, sizes: list[int], seq: int, blocks: int, head: bool,
             embed: bool) -> tuple[float, float]:
    """(forward, backward) compute seconds of the stage's mean micro-batch: kernel by kernel on a
    catalogue GPU (dt.plan.compute.catalogue_stage), else timed or from FLOPs (stage_compute)."""
    t = seq // lay.cp
    if c.gpu is not None:
        shape = lambda b: StageShape(b, seq, lay.tp, lay.cp, blocks, head, embed,  # noqa: E731
                                     lay.sequence_parallel, lay.recompute)
        return _mean_over(sizes, lambda b: catalogue_stage(c, model, shape(b)))
    full = lay.recompute == "full"
    return _mean_over(sizes, lambda b: stage_compute(c, model, b, t, seq, lay.tp, lay.world, blocks, head,
                                                     embed, full, lay.cp_attention))


def _exposed(messages: float, compute: float, overlapped: bool) -> float:
    """Seconds of tensor parallel's messages the compute does not hide: all of them, unless the
    stack overlaps them with its GEMMs (then what runs past the compute)."""
    return max(0.0, messages - compute) if overlapped else messages


def fsdp_exposed(st: Stack, gather: float, scatter: float, fwd: float, bwd: float) -> tuple[float, float]:
    """(forward, backward) seconds of ZeRO 3's collectives the compute does not hide: a forward
    gathers every unit, a backward gathers them again (unless the stack keeps them gathered from
    forward to backward) and reduce-scatters their gradients; with prefetch each runs behind the
    neighbouring unit's compute, so only what outlasts the compute waits."""
    regather = gather if st.reshard_after_forward else 0.0
    if not st.fsdp_prefetch:
        return gather, regather + scatter
    if st.fsdp_scatter_behind:
        return max(0.0, gather - fwd), max(0.0, regather + scatter - bwd)
    return max(0.0, gather - fwd), max(0.0, regather - bwd) + scatter


def stage_work(c: Cluster, model: ModelShape, lay: Layout, g: RankGroups, batch: int, seq: int,
               stage: int) -> StageWork:
    """One (mean) micro-batch through every chunk of `stage`, forward and backward, by kind."""
    cut = c.stack.partition
    dense, experts, blocks, head, embed = stage_tensors(model, lay, seq, stage, cut)
    sizes = micro_batch_sizes(batch, lay.dp, lay.micro_batches)
    b = max(1, min(sizes))  # the integer micro-batch the timed paths measure
    mean = sum(sizes) / len(sizes)
    t = seq // lay.cp
    act = mean * t * model.n_embd * c.itemsize
    cf, cb = _compute(c, model, lay, sizes, seq, blocks, head, embed)
    tp1 = collective_seconds(c, "all_reduce", act, g.tp)
    small = collective_seconds(c, "all_reduce", mean * t * c.itemsize, g.tp)
    cpf, cpb = _attention_messages(c, lay, g, act / lay.tp, model.kv_heads / model.n_head)
    routed = mean * t * model.top_k * model.n_embd * c.itemsize
    ep1 = collective_seconds(c, "all_to_all", routed, g.ep) if model.experts else 0.0
    units = _units(model, lay, g, seq, stage, cut)
    gather, scatter = _fsdp_seconds(c, units, g)
    tp_fwd = 2 * blocks * tp1 + (tp1 if embed else 0.0) + (3 * small if head else 0.0)
    rerun = 2 * blocks * tp1 if lay.recompute == "full" else 0.0  # recompute's forward all-reduces again
    tp_bwd = 2 * blocks * tp1 + (tp1 if head else 0.0) + rerun
    overlap = c.gpu is not None and c.stack.overlap_tp
    fsdp_fwd, fsdp_bwd = fsdp_exposed(c.stack, gather, scatter, cf, cb)
    fwd = {"compute": cf, "tp": _exposed(tp_fwd, cf, overlap),
           "cp": cpf * blocks, "ep": 2 * ep1 * blocks, "dp": fsdp_fwd}
    bwd = {"compute": cb, "tp": _exposed(tp_bwd, cb, overlap),
           "cp": cpb * blocks, "ep": 2 * ep1 * blocks, "dp": fsdp_bwd}
    tied = model.vocab // lay.tp * model.n_embd if model.tied and lay.pp > 1 and head != embed else 0
    ddp = lay.zero == 0 and len(g.dp_cp) > 1 and not model.experts  # DDP wraps the chunks
    hooks = ddp_hooks(c, model, b, t, seq, lay.tp, lay.world, blocks, head, embed,
                      lay.cp_attention) if ddp else 0.0
    slowest = slowest_rank(c, model, b, t, seq, lay.tp, lay.world, blocks, head, embed, lay.cp_attention)
    chunks = chunk_tensors(model, lay, seq, stage, cut)
    return StageWork(fwd, bwd, dense, chunks, experts, blocks, head, embed, units, tied, hooks, slowest)
