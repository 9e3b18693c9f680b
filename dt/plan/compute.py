"""What a stage's compute costs: on a catalogue GPU its kernels priced, on this machine its layers timed.

On a catalogue cluster each kernel of the stage (dt.cost.kernels: GEMMs, attention, the
memory-bound ops, as the cluster's stack runs them) is priced by dt.plan.pricing, forward and
backward apart (recompute's rerun kernels in the backward), unless it is timed on this host's
GPU (`dt plan --device h200 --timed`): then dt's GPT stages are timed there as below, under
the precision's autocast. On this machine, for dt's GPT, a stage's real layers are timed
together (dt.plan.timed: dt train's modules at this rank's tp shard) with the threads each rank
gets (cores / world), split between forward and backward by their FLOPs (dt.cost.flops;
recompute adds the blocks' forward share to backward), within the process's timing budget
(past it, a stage's FLOPs at the rate the timed ones ran at). Elsewhere on this machine (Llama,
experts, context parallel of an uneven split) one stand-in block (Shard) and the head are timed
and the FLOPs divided by that time; tiny layers are bound by the ops' fixed costs, not by
arithmetic, and timing catches both.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from dt.cost.compute_rate import matmul_rate
from dt.cost.flops import step_flops
from dt.cost.kernels import Kernel, block_kernels, embedding_kernels, head_kernels
from dt.plan.cluster import TRAIN_PRECISION, Cluster
from dt.plan.model import ModelShape
from dt.plan.pricing import kernels_seconds

__all__ = ["DTYPES", "Shard", "StageShape", "TimedShape", "catalogue_stage", "ddp_hooks", "layer_flops",
           "layer_seconds", "oversubscribed", "rank_threads", "stage_compute", "stage_kernels"]

DTYPES = {4: "float32", 8: "float64"}  # this machine's precision by its bytes per number: dt train's dtype


@functools.cache
def _shard_shape(model: ModelShape, tp: int) -> tuple[int, int, int]:
    return model.n_embd, model.n_head // tp, model.hidden // tp


@functools.cache
def layer_flops(model: ModelShape, seq: int, layer: int, sequences: int, tp: int, cp: int,
                recompute: bool) -> tuple[float, float]:
    """(forward, backward + recompute) FLOPs of one layer on one rank (dt.cost.flops.step_flops)."""
    flops = step_flops(model.decoder(seq), sequences, range(layer, layer + 1), tp, cp,
                       "full" if recompute else "none")
    return flops.forward, flops.backward + flops.recompute


class Shard(nn.Module):
    """One rank's slice of a block (tp-sharded widths), for timing only: the same matmuls and sizes."""

    def __init__(self, width: int, heads: int, head_dim: int, hidden: int, gated: bool):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * heads * head_dim), nn.Linear(heads * head_dim, width)
        self.up = nn.Linear(width, (2 if gated else 1) * hidden)
        self.down = nn.Linear(hidden, width)
        self.gated = gated

    def forward(self, inputs: torch.Tensor, keys: int) -> torch.Tensor:
        batch, tokens, _ = inputs.shape
        qkv = self.qkv(self.ln1(inputs)).view(batch, tokens, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if keys != tokens:  # ring attention: this rank's queries against every key (as many blocks)
            k, v = k.repeat(1, 1, keys // tokens, 1), v.repeat(1, 1, keys // tokens, 1)
        attended = F.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5, dim=-1) @ v
        hidden = inputs + self.proj(attended.transpose(1, 2).reshape(batch, tokens, -1))
        up = self.up(self.ln2(hidden))
        if self.gated:
            gate, value = up.chunk(2, -1)
            up = F.silu(gate) * value
        else:
            up = F.gelu(up)
        return hidden + self.down(up)


def _time(run: Callable[[], object], reps: int = 7) -> float:
    """The median of `reps` timings (dt.plan.timed's rule: the run it predicts is a median too)."""
    run()  # warm: allocations, kernels chosen
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


@functools.cache
def _measured(kind: str, model: ModelShape, sequences: int, tokens: int, keys: int, tp: int, threads: int,
              dtype: str) -> float:
    """Seconds of forward + backward of one layer of this shard, timed here (the median of 7)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        torch_dtype = getattr(torch, dtype)
        width, heads, hidden = _shard_shape(model, tp)
        # This machine's CPU is what is timed.
        inputs = torch.randn(sequences, tokens, width, dtype=torch_dtype, device="cpu", requires_grad=True)
        if kind == "block":
            layer = Shard(width, heads, model.n_embd // model.n_head, hidden, model.gated).to(torch_dtype)
            run = lambda: layer(inputs, keys).sum().backward()  # noqa: E731
        else:
            words = torch.randn(model.vocab // tp or 1, width, dtype=torch_dtype, device="cpu",
                                requires_grad=True)
            run = lambda: F.linear(F.layer_norm(inputs, (width,)), words).logsumexp(-1).sum().backward()  # noqa: E731
        return _time(run)
    finally:
        torch.set_num_threads(old)


@dataclass(frozen=True)
class StageShape:
    """What one rank of a pipeline stage computes per micro-batch: its layers and how they are split."""

    sequences: int  # sequences in the micro-batch
    seq: int  # tokens per sequence (the whole sequence: cp splits it)
    tp: int = 1
    cp: int = 1
    blocks: int = 0
    head: bool = False
    embed: bool = False
    sequence_parallel: bool = False
    recompute: str = "none"


def _parts(model: ModelShape, shape: StageShape,
           cluster: Cluster) -> list[tuple[int, tuple[list[Kernel], list[Kernel]]]]:
    """(how many, (forward, backward) kernels) of each kind of layer the stage holds."""
    decoder, item, stack = model.decoder(shape.seq), cluster.itemsize, cluster.stack
    sequence_parallel = shape.sequence_parallel and shape.tp > 1
    parts = []
    if shape.embed:
        parts.append((1, embedding_kernels(decoder, shape.sequences, shape.cp, item)))
    if shape.blocks:
        parts.append((shape.blocks, block_kernels(decoder, shape.sequences, stack, shape.tp, shape.cp,
                                                  sequence_parallel, shape.recompute, item)))
    if shape.head:
        parts.append((1, head_kernels(decoder, shape.sequences, shape.tp, shape.cp, item)))
    return parts


def stage_kernels(model: ModelShape, shape: StageShape,
                  cluster: Cluster) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) kernels of one micro-batch through the stage on one rank (dt.cost.kernels),
    as the cluster's stack runs them, in the order they run."""
    parts = _parts(model, shape, cluster)
    fwd = [kernel for count, (forward, _) in parts for kernel in forward * count]
    bwd = [kernel for count, (_, backward) in reversed(parts) for kernel in backward * count]
    return fwd, bwd


@functools.lru_cache(maxsize=1 << 15)
def catalogue_stage(cluster: Cluster, model: ModelShape, shape: StageShape) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch through the stage on a catalogue GPU, each
    kernel priced (dt.plan.pricing); backward includes recompute's rerun forward kernels."""
    device, precision, item = cluster.gpu, cluster.precision, cluster.itemsize
    attention = cluster.stack.attention
    fwd = bwd = 0.0
    for count, (forward, backward) in _parts(model, shape, cluster):
        fwd += count * kernels_seconds(forward, device, precision, attention, item)
        bwd += count * kernels_seconds(backward, device, precision, attention, item)
    return fwd, bwd


def rank_threads(world: int) -> int:
    """Torch threads a rank of `world` gets here: dt train's default, cores // processes."""
    return max(1, (os.cpu_count() or 1) // world)


def oversubscribed(world: int) -> float:
    """More ranks than cores: they take turns on them."""
    cores = os.cpu_count() or 1
    return max(1.0, world * rank_threads(world) / cores)


def _timed_here(cluster: Cluster, model: ModelShape, tokens: int, keys: int) -> bool:
    """Whether dt train's real layers are timed for this stage (dt.plan.timed): dt's GPT on this
    machine, context parallel included when the zig-zag split is even (every rank's blocks of one
    size: dt.plan.timed_cp); Llama and experts keep the per-layer stand-in."""
    cp = keys // tokens
    even = keys == tokens or (keys == cp * tokens and keys % (2 * cp) == 0)
    return bool(cluster.timed) and model.family == "gpt" and not model.experts and even


def timed_dtype(cluster: Cluster) -> tuple[str, str]:
    """(the weights' dtype, the autocast dtype or "") dt train runs the cluster's precision in."""
    if cluster.timed == "cuda":
        autocast = TRAIN_PRECISION[cluster.precision]
        return "float32", "" if autocast == "float32" else autocast
    return DTYPES[cluster.itemsize], ""


def turns(cluster: Cluster, world: int) -> float:
    """How many ranks take turns on each processor: on this machine's cores (oversubscribed); on
    GPUs none (one per rank)."""
    return oversubscribed(world) if cluster.timed == "cpu" else 1.0


class TimedShape(NamedTuple):
    """One rank's stage as dt.plan.timed.time_stage times it (its arguments, in order): the shapes,
    the threads and dtype, where it runs."""

    n_embd: int
    n_head: int
    vocab: int
    sequences: int  # in the micro-batch
    tokens: int  # of each sequence on this rank (seq / cp)
    tp: int
    blocks: int
    head: bool
    embed: bool
    threads: int
    dtype: str
    cp: int
    cp_kind: str
    device: str
    autocast: str


def timed_shape(cluster: Cluster, model: ModelShape, sequences: int, tokens: int, keys: int, tp: int,
                world: int, blocks: int, head: bool, embed: bool, cp_kind: str = "ring") -> TimedShape | None:
    """The shape dt.plan.timed.stage_timing times this stage at (one rank's shapes, its threads and
    dtype); None where the stage is not timed here (_timed_here)."""
    if not _timed_here(cluster, model, tokens, keys):
        return None
    dtype, autocast = timed_dtype(cluster)
    threads = rank_threads(world) if cluster.timed == "cpu" else torch.get_num_threads()
    return TimedShape(n_embd=model.n_embd, n_head=model.n_head, vocab=model.vocab, sequences=sequences,
                      tokens=tokens, tp=tp, blocks=blocks, head=head, embed=embed, threads=threads,
                      dtype=dtype, cp=keys // tokens, cp_kind=cp_kind, device=cluster.timed,
                      autocast=autocast)


def stage_compute(cluster: Cluster, model: ModelShape, sequences: int, tokens: int, keys: int, tp: int,
                  world: int, blocks: int, head: bool, embed: bool, recompute: bool = False,
                  cp_kind: str = "ring") -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch through a stage's layers on one rank
    (tokens: its share of each sequence, keys: the whole sequence; cp = keys / tokens, its
    attention `cp_kind`).

    On this machine (dt's GPT) the stage's real layers are timed together (dt.plan.timed) and
    split between forward and backward by their FLOPs; else the sum of layer_seconds."""
    if not _timed_here(cluster, model, tokens, keys):
        layer = {"sequences": sequences, "tokens": tokens, "keys": keys, "tp": tp, "world": world}
        block_fwd, block_bwd = layer_seconds(cluster, "block", model, **layer, recompute=recompute)
        head_fwd, head_bwd = layer_seconds(cluster, "head", model, **layer) if head else (0.0, 0.0)
        return blocks * block_fwd + head_fwd, blocks * block_bwd + head_bwd
    cp = keys // tokens
    flops_fwd, flops_bwd = _stage_flops(model, keys, sequences, tp, cp, blocks, head)
    flops = flops_fwd + flops_bwd
    shape = timed_shape(cluster, model, sequences=sequences, tokens=tokens, keys=keys, tp=tp, world=world,
                        blocks=blocks, head=head, embed=embed, cp_kind=cp_kind)
    total = _stage_seconds(cluster, model, shape, flops) * turns(cluster, world)
    share = flops_fwd / flops if flops > 0 else 1 / 3  # an embedding alone: backward 2x
    fwd, bwd = total * share, total * (1 - share)
    if recompute and blocks:  # backward runs every block's forward again: the blocks' share of it
        blocks_fwd = blocks * layer_flops(model, keys, 1, sequences, tp, cp, False)[0]
        bwd += fwd * blocks_fwd / flops_fwd
    return fwd, bwd


FALLBACK_RATE = 1e10  # FLOP/s per thread assumed before any stage was timed and with no dt tune figure


def _stage_seconds(cluster: Cluster, model: ModelShape, shape: TimedShape, flops: float) -> float:
    """The stage timed (dt.plan.timed.timed_within_budget), or, past the timing budget or over its
    memory share, its FLOPs at the rate the timed stages ran at (else dt tune's, else FALLBACK_RATE)."""
    from dt.plan.timed import BUDGET, timed_within_budget

    if cluster.timed == "cuda":
        from dt.plan.timed import stage_seconds

        return stage_seconds(*shape)
    seconds = timed_within_budget(shape, flops, _stage_bytes(cluster, model, shape))
    if seconds is not None:
        return seconds
    rows = shape.sequences * shape.tokens
    rate = (BUDGET.rate() or matmul_rate(rows, model.n_embd, model.n_embd, shape.threads)
            or FALLBACK_RATE * shape.threads)
    return flops / rate


# About what a block keeps per token for backward, in numbers of the width (dt.cost.activations
# counts it exactly; this only bounds what timing a stage may hold)
SAVED_WIDTHS = 20
COPIES = 3  # the weights, their gradients and the optimizer's working copies


def _stage_bytes(cluster: Cluster, model: ModelShape, shape: TimedShape) -> float:
    """About what timing the stage holds: its weights, gradients and their copies, its activations."""
    tp, blocks, words = shape.tp, shape.blocks, shape.head or shape.embed
    layers = blocks * model.block_params() // tp + (model.vocab * model.n_embd // tp if words else 0)
    per_token = model.n_embd * SAVED_WIDTHS * blocks + (model.vocab // tp if shape.head else 0)
    acts = shape.sequences * shape.tokens * per_token * cluster.itemsize
    return COPIES * layers * cluster.itemsize + acts


def slowest_rank(cluster: Cluster, model: ModelShape, sequences: int, tokens: int, keys: int, tp: int,
                 world: int, blocks: int, head: bool, embed: bool, cp_kind: str = "ring") -> float:
    """How much longer the slowest of the step's `world` ranks takes over its compute than the
    median rank: the expected largest of `world` draws from the stage's own timed repetitions
    over their median (dt.plan.timed.slowest_of). The ranks line up after the pipeline (the loss's
    all-reduce, the optimizer's collectives), so the step waits for the slowest; on this machine
    a stage's repetitions spread 10-40% (its speed drifts), and that spread is the wait. 1 where
    the stage is not timed here (a catalogue device: priced without noise, stated so)."""
    shape = timed_shape(cluster, model, sequences=sequences, tokens=tokens, keys=keys, tp=tp, world=world,
                        blocks=blocks, head=head, embed=embed, cp_kind=cp_kind)
    if world < 2 or shape is None:
        return 1.0
    from dt.plan.timed import slowest_of, stage_timing, was_timed

    if not was_timed(shape):  # priced by rate (the timing budget): no repetitions to spread
        return 1.0
    times = stage_timing(*shape)
    middle = statistics.median(times)
    return slowest_of(times, world) / middle if middle > 0 else 1.0


def ddp_hooks(cluster: Cluster, model: ModelShape, sequences: int, tokens: int, keys: int, tp: int,
              world: int, blocks: int, head: bool, embed: bool, cp_kind: str = "ring") -> float:
    """Seconds DDP's hooks add to a stage's synchronised backward on the rank's own thread (a hook
    and a bucket copy per gradient, the launches, the end-of-backward wait: dt.plan.timed), timed
    where the stage's layers are on this machine; 0 on a GPU (priced as nothing beside its kernels:
    not timed there yet)."""
    if cluster.timed != "cpu" or not _timed_here(cluster, model, tokens, keys):
        return 0.0
    from dt.plan.timed import ddp_hooks_within_budget, was_timed

    shape = timed_shape(cluster, model, sequences=sequences, tokens=tokens, keys=keys, tp=tp, world=world,
                        blocks=blocks, head=head, embed=embed, cp_kind=cp_kind)
    if not was_timed(shape):  # the stage itself past the timing budget: its hooks are not timed either
        return 0.0
    seconds = ddp_hooks_within_budget(shape, _stage_bytes(cluster, model, shape))
    return 0.0 if seconds is None else seconds * oversubscribed(world)


def _stage_flops(model: ModelShape, seq: int, sequences: int, tp: int, cp: int, blocks: int,
                 head: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs of a stage's blocks and head on one rank: how its timed seconds split."""
    block_fwd, block_bwd = layer_flops(model, seq, 1, sequences, tp, cp, False)
    head_fwd, head_bwd = (layer_flops(model, seq, model.n_layer + 1, sequences, tp, cp, False) if head
                          else (0.0, 0.0))
    return blocks * block_fwd + head_fwd, blocks * block_bwd + head_bwd


def layer_seconds(cluster: Cluster, kind: str, model: ModelShape, sequences: int, tokens: int, keys: int,
                  tp: int, world: int, recompute: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of one block or head on one rank of `cluster` (backward
    includes the block's recomputed forward when `recompute`)."""
    cp = keys // tokens
    layer = 1 if kind == "block" else model.n_layer + 1
    fwd, bwd = layer_flops(model, keys, layer, sequences, tp, cp, recompute and kind == "block")
    if cluster.flops > 0:
        return fwd / cluster.flops, bwd / cluster.flops
    threads = rank_threads(world)
    total = _measured(kind, model, sequences, tokens, keys, tp, threads, DTYPES[cluster.itemsize])
    total *= oversubscribed(world)
    rate = 3 * fwd / total  # FLOP/s this shape sustains here, forward and backward (2x) alike
    return fwd / rate, bwd / rate
