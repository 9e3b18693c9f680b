"""One layout's peak bytes per rank: what a stage holds at the worst moment of its step.

    state        parameters, gradients and Adam's two moments of this rank's
                 tensors (dt.parallel.zero.zero_memory_parts: ZeRO-1 shards
                 the moments over dp); mixed precision (bf16/fp16): 2 + 2 bytes
                 of weight and gradient and 12 of fp32 master and moments
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
from dt.plan.stage import FsdpUnits, bucket_bytes, fsdp_units, stage_tensors

__all__ = ["peak_bytes"]


def _decoder(model: ModelShape, seq: int) -> Decoder:
    return model.decoder(seq)


@functools.lru_cache(maxsize=65536)
def _stash_bytes(name: str, p: int, s: int, m: int, chunks: tuple[float, ...]) -> float:
    return peak_stash_bytes(name, p, s, m, chunks)  # many layouts (ZeRO, placement) share one


@functools.lru_cache(maxsize=65536)
def _chunk_activations(model: ModelShape, seq: int, pp: int, stage: int, virtual: int, b: int, item: int,
                       tp: int, cp: int, recompute: str) -> list[float]:
    """Activation bytes of each chunk of `stage` (layouts differing in ZeRO or schedule share them)."""
    a = _decoder(model, seq)
    return [stage_activation_bytes(a, r, b, item, tp, cp, recompute=recompute)
            for r in stage_layers(model.n_layer + 2, pp, stage, None, virtual)]


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


def peak_bytes(c: Cluster, model: ModelShape, lay: Layout, batch: int, seq: int) -> list[dict[str, int]]:
    """Per pipeline stage: {state, scratch, activations, buffers, peak} bytes of one of its ranks."""
    item = c.itemsize
    mixed = c.precision in ("bf16", "fp16")
    b = batch // lay.dp // lay.micro_batches
    a = _decoder(model, seq)
    recompute = "full" if lay.recompute else "none"
    out = []
    for s in range(lay.pp):
        dense, experts, _, head, embed = stage_tensors(model, lay, seq, s)
        # ZeRO shards the dense part over the whole data plane, dp x cp (dt.train.step's dp group),
        # the experts over their replicas (dt.parallel.zero.parts)
        n = lay.dp * lay.cp
        # ZeRO 2 keeps a word table's full gradient two stages sum (dt.parallel.zero.optimizer)
        tied = model.tied and lay.pp > 1 and head != embed
        kept = model.vocab // lay.tp * model.n_embd if tied and lay.zero == 2 else 0
        state = zero_memory_parts([(sum(dense), n), (experts, n // lay.ep)], lay.zero,
                                  k=12 if mixed else 2 * item, param_bytes=2 if mixed else item,
                                  grad_bytes=2 if mixed else item, kept=kept)
        chunks = _chunk_activations(model, seq, lay.pp, s, lay.virtual, b, item, lay.tp, lay.cp, recompute)
        acts = _stash_bytes(lay.schedule, lay.pp, s, lay.micro_batches, tuple(chunks))
        if lay.recompute:  # one block's whole set, rebuilt for its backward
            acts += recompute_peak_bytes(a, b, item, lay.tp, lay.cp)
        buffers, scratch = max(bucket_bytes(dense, item), default=0) if n > 1 else 0, 0
        if lay.zero and n > 1:
            buffers = 0  # no DDP buckets: ZeRO 1's flat gradient is in the state
            parts = ((tuple(_without(dense, kept)), n), ((experts,) if experts else (), n // lay.ep))
            scratch = _zero_scratch(lay.zero, parts, kept, n, item) if lay.zero < 3 else \
                _fsdp_scratch(fsdp_units(model, lay, seq, s), n, n // lay.ep, item)
        if lay.zero == 2 and n > 1:  # every bucket's flat copy, made in backward, freed at its end
            acts += (sum(dense) - kept + experts) * item
        if lay.zero == 3 and n > 1:  # this stage's units gathered whole as they run
            units = fsdp_units(model, lay, seq, s)
            acts += fsdp_gathered_formula(units.root, list(units.dense + units.experts), item)  # and grads
        row = {"state": int(sum(state.values())), "scratch": int(scratch), "activations": int(acts),
               "buffers": int(buffers)}
        row["peak"] = row["state"] + row["scratch"] + max(row["activations"], row["buffers"])
        out.append(row)
    return out
