"""Every layout priced and ranked: enumerate (dt.plan.layouts), drop what does not fit, predict the rest.

Memory first: a layout's peak (dt.plan.memory) needs only the schedule's order, not its
durations, so layouts that cannot fit are dropped before their step is priced. A catalogue
GPU holds its own HBM less the headroom asked for; on this machine (CPU) every rank's bytes
come out of one machine's memory.

On a catalogue cluster the grid runs to millions of layouts at thousands of GPUs, so it is
searched by bound: a layout's step is at least its busiest stage's compute over the step's
micro-batches (and the tensor-parallel messages its stack does not hide), which costs a few
cached kernel sums. Layouts are priced in the order of that bound, and the search stops where
the bound passes the step of the last row asked for: every layout it skips is slower than
every row it shows, so the ranking of what is shown is exact.

Rows whose steps differ by less than the ranking's noise (TIE on a catalogue cluster; the
spread of the timed stages on this machine) are ties: they are ordered by memory, and marked.
"""

from __future__ import annotations

import functools
import heapq
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from dt.cost.flops import train_flops_per_token
from dt.parallel.pipeline.schedules import stage_layers
from dt.plan.cluster import Cluster
from dt.plan.compute import StageShape, catalogue_stage
from dt.plan.layouts import Layout, grid, train_args
from dt.plan.memory import peak_bytes, state_floor
from dt.plan.model import ModelShape
from dt.plan.stage import layer_cut, micro_batch_sizes
from dt.plan.step_model import Prediction, predict
from dt.train.layouts import layout_error
from dt.units import fmt_bytes

__all__ = ["HEADROOM", "TIE", "Ranking", "Row", "lower_bound", "model_flops", "rank_layouts", "row_of"]

TIE = 0.02  # catalogue steps closer than this are ties: below what the model's inputs are known to
HEADROOM = 0.05  # the fraction of a GPU's memory kept free by default (allocator spikes, other processes)


@dataclass
class Row:
    layout: Layout
    prediction: Prediction
    memory: list[dict[str, int]]  # per stage
    tokens_per_s: float
    mfu: float | None  # None where the cluster's peak is unknown (this machine)
    tie: bool = False  # within the ranking's noise of the row above it

    @property
    def peak(self) -> int:
        return max(stage["peak"] for stage in self.memory)


@dataclass
class Ranking:
    rows: list[Row]  # fitting layouts, fastest first (ties by memory)
    grid: int  # layouts the grid holds
    accepted: int  # of them, the layouts dt train accepts
    dropped: dict[str, int] = field(default_factory=dict)  # why the others were dropped, how many
    skipped: int = 0  # bounded slower than every row shown: never priced
    seconds: float = 0.0
    noise: float = 0.0  # steps closer than this share are ties (TIE, or here the timed stages' spread)


def model_flops(model: ModelShape, batch: int, seq: int) -> float:
    """FLOPs one step needs, unsharded, without recompute: 3 x the forward (backward is 2x)."""
    return train_flops_per_token(model.decoder(seq)) * batch * seq


def _fits(cluster: Cluster, layout: Layout, memory: list[dict[str, int]], headroom: float) -> str | None:
    peak = max(stage["peak"] for stage in memory)
    if cluster.shared_memory:
        total = sum(stage["peak"] for stage in memory) * layout.world // layout.pp
        return None if not cluster.memory or total <= cluster.memory else (
            f"the ranks' peaks add up to more than this machine's {fmt_bytes(cluster.memory)}: "
            f"{fmt_bytes(total)}")
    return None if peak <= cluster.memory * (1 - headroom) else _over(cluster, headroom, peak)


def _over(cluster: Cluster, headroom: float, peak: float) -> str:
    return (f"peak per rank over the device's {fmt_bytes(cluster.memory)} less {headroom:.0%} headroom: "
            f"{fmt_bytes(peak)}")


@functools.lru_cache(maxsize=1 << 16)
def _pipeline_bound(cluster: Cluster, model: ModelShape, seq: int, per_rank: int, family: Layout) -> float:
    """A step no layout of this family undercuts: for each stage, the forwards and backwards of one
    micro-batch-chunk on every stage before it (its input comes through them first, and its last
    gradient goes back through them last) plus its own compute over the step; the largest."""
    sizes = Counter(micro_batch_sizes(per_rank, 1, family.micro_batches))  # at most two sizes: each once
    of_size = {size: _chunk_seconds(cluster, model, seq, size, _Split(family.pp, family.virtual, family.tp,
                                                                      family.cp, family.sequence_parallel,
                                                                      family.recompute))
               for size in sizes}
    before = bound = 0.0
    for stage in range(family.pp):
        total = sum(count * sum(of_size[size][stage]) for size, count in sizes.items())
        bound = max(bound, before + total)
        before += min(min(of_size[size][stage]) for size in sizes)
    return bound


class _Split(NamedTuple):
    """What a stage's compute per micro-batch depends on, beyond the micro-batch's size."""

    pp: int
    virtual: int
    tp: int
    cp: int
    sequence_parallel: bool
    recompute: str


@functools.lru_cache(maxsize=1 << 16)
def _chunk_seconds(cluster: Cluster, model: ModelShape, seq: int, sequences: int,
                   split: _Split) -> tuple[tuple[float, ...], ...]:
    """Per stage, each of its chunks' forward + backward seconds for one micro-batch of `sequences`
    (layouts differing in dp, ZeRO, schedule or micro-batch count share them)."""
    return tuple(tuple(sum(catalogue_stage(cluster, model, StageShape(
        sequences=sequences, seq=seq, tp=split.tp, cp=split.cp, blocks=blocks, head=head, embed=embed,
        sequence_parallel=split.sequence_parallel, recompute=split.recompute)))
        for blocks, head, embed in chunks)
        for chunks in _stage_chunks(model, split.pp, split.virtual, cluster.stack.partition))


@functools.lru_cache(maxsize=1 << 12)
def _stage_chunks(model: ModelShape, pp: int, virtual: int,
                  partition: str) -> tuple[tuple[tuple[int, bool, bool], ...], ...]:
    """Per stage, each chunk's (blocks, holds the head, holds the embedding) under the stack's cut."""
    layers = model.n_layer + 2
    cut = layer_cut(model, pp, virtual, partition)
    return tuple(tuple((sum(1 for layer in chunk if 0 < layer < layers - 1), layers - 1 in chunk, 0 in chunk)
                       for chunk in stage_layers(layers, pp, stage, cut, virtual))
                 for stage in range(pp))


def lower_bound(cluster: Cluster, model: ModelShape, layout: Layout, batch: int, seq: int) -> float:
    """A step no shorter than the layout's (catalogue clusters only): _pipeline_bound."""
    family = replace(Layout(), pp=layout.pp, virtual=layout.virtual, tp=layout.tp, cp=layout.cp,
                     micro_batches=layout.micro_batches, sequence_parallel=layout.sequence_parallel,
                     recompute=layout.recompute)
    return _pipeline_bound(cluster, model, seq, batch // layout.dp, family)


PROGRESS_FROM = 200  # layouts to price past which a progress line is shown (fewer take a moment)
PROGRESS_EVERY = 100  # layouts between its updates


def _progress(total: int) -> Callable[[int], None]:
    """A progress line on stderr when it is a terminal (none in pipes and logs)."""
    if not sys.stderr.isatty() or total < PROGRESS_FROM:
        return lambda done: None
    start = time.perf_counter()

    def show(done: int) -> None:
        if done % PROGRESS_EVERY == 0 or done == total:
            took = time.perf_counter() - start
            sys.stderr.write(f"\rdt plan: {done}/{total} layouts priced ({took:.0f} s)")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()
    return show


def _stack_runs(cluster: Cluster, layout: Layout) -> bool:
    """Whether the cluster's stack runs the layout (dt train runs every layout of the grid)."""
    return cluster.stack.runs(layout.schedule, layout.pp, layout.tp, layout.cp, layout.zero, layout.recompute,
                              layout.sequence_parallel)


def _accepted(model: ModelShape, layout: Layout, batch: int, seq: int) -> bool:
    return layout_error(train_args(layout, model, batch, seq)) is None


def _price(cluster: Cluster, model: ModelShape, layout: Layout, batch: int, seq: int, flops: float,
           headroom: float, dropped: dict[str, int]) -> Row | None:
    floor = state_floor(cluster, model, layout, seq)  # its state alone: no need to price the rest
    memory = [] if floor > cluster.memory * (1 - headroom) else peak_bytes(cluster, model, layout, batch, seq)
    why = _fits(cluster, layout, memory, headroom) if memory else _over(cluster, headroom, floor)
    if why is not None:
        reason = why.split(":")[0]
        dropped[reason] = dropped.get(reason, 0) + 1
        return None
    return row_of(cluster, layout, predict(cluster, model, layout, batch, seq), memory, batch, seq, flops)


def row_of(cluster: Cluster, layout: Layout, prediction: Prediction, memory: list[dict[str, int]], batch: int,
           seq: int, flops: float) -> Row:
    """A priced layout's row: its tokens/s and MFU (`flops`: model_flops of the step)."""
    mfu = flops / (prediction.step * cluster.world * cluster.peak) if cluster.peak else None
    return Row(layout, prediction, memory, batch * seq / prediction.step, mfu)


class _Candidate(NamedTuple):
    bound: float  # a step the layout cannot undercut (0: not bounded)
    index: int  # its place in the grid: equal bounds are priced in the grid's order
    layout: Layout


def _candidates(cluster: Cluster, model: ModelShape, layouts: list[Layout], batch: int, seq: int,
                bounded: bool) -> list[_Candidate]:
    """The layouts in the order they are priced: by lower_bound when the search is bounded."""
    if not bounded:
        return [_Candidate(0.0, i, layout) for i, layout in enumerate(layouts)]
    candidates = [_Candidate(lower_bound(cluster, model, layout, batch, seq), i, layout)
                  for i, layout in enumerate(layouts)]
    return sorted(candidates, key=lambda candidate: (candidate.bound, candidate.index))


def rank_layouts(cluster: Cluster, model: ModelShape, batch: int, seq: int,
                 recompute: tuple[str, ...] = ("none",), clip: bool = False, top: int | None = None,
                 headroom: float = HEADROOM, tie: float | None = None, until: float | None = None) -> Ranking:
    """Every layout of the grid dt train accepts, priced and ranked, fastest first.

    top: on a catalogue cluster, price in the order of lower_bound and stop once the bound passes
    the `top`-th fastest step found (None: price every layout); until: stop once it passes this
    step instead (a rank among all: every skipped layout is slower)."""
    t0 = time.perf_counter()
    flops = model_flops(model, batch, seq)
    every = list(grid(cluster.world, batch, cluster.hosts, model.experts, recompute, clip, seq))
    layouts = [layout for layout in every
               if _stack_runs(cluster, layout) and _accepted(model, layout, batch, seq)]
    dropped: dict[str, int] = {}
    rows: list[Row] = []
    skipped = 0
    bounded = cluster.gpu is not None and (top is not None or until is not None)
    best: list[float] = []  # a max-heap (negated) of the `top` fastest steps found
    show = _progress(len(layouts))
    for done, candidate in enumerate(_candidates(cluster, model, layouts, batch, seq, bounded), 1):
        limit = until if until is not None else (-best[0] if top and len(best) >= top else None)
        if bounded and limit is not None and candidate.bound > limit * (1 + (tie or TIE)):
            skipped = len(layouts) - done + 1
            break
        show(done)
        row = _price(cluster, model, candidate.layout, batch, seq, flops, headroom, dropped)
        if row is not None:
            rows.append(row)
            if top:
                heapq.heappush(best, -row.prediction.step)
                if len(best) > top:
                    heapq.heappop(best)
    tolerance = tie if tie is not None else TIE if cluster.gpu is not None else _timing_noise()
    return Ranking(_with_ties(rows, tolerance), len(every), len(layouts), dropped, skipped,
                   time.perf_counter() - t0, tolerance)


def _timing_noise() -> float:
    """dt.plan.timed.timing_noise (imported here: the timed stages' module builds dt's layers)."""
    from dt.plan.timed import timing_noise

    return timing_noise()


def _with_ties(rows: list[Row], tolerance: float) -> list[Row]:
    """Fastest first; rows within `tolerance` of the first of their group are ties, by memory."""
    rows = sorted(rows, key=lambda row: (row.prediction.step, row.peak))
    out: list[Row] = []
    i = 0
    while i < len(rows):
        lead = rows[i].prediction.step
        j = i
        while j < len(rows) and rows[j].prediction.step <= lead * (1 + tolerance):
            j += 1
        group = sorted(rows[i:j], key=lambda row: (row.peak, row.prediction.step))
        for k, row in enumerate(group):
            row.tie = k > 0
        out += group
        i = j
    return out
