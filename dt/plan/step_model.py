"""One layout's training step, predicted: a timeline per rank whose sum is the step.

What `dt train` runs per step (dt.models.gpt.ParallelGPT.train_step, then
the optimizer), in order, on every rank of pipeline stage s:

1. the pipeline: the schedule's actions (dt.plan.pipeline plays them with
   this stage's forward / backward seconds per micro-batch: compute, then
   its tp, cp and ep messages, which block), activations sent between stages;
2. the data-parallel gradient sync after the pipeline: make_buckets' buckets
   (25 MB cap, dt.parallel.buckets) all-reduced one after another over
   dp x cp (experts over their replicas), not overlapped: ParallelGPT runs
   it after the last backward; under ZeRO-1 the optimizer reduce-scatters
   the gradients and all-gathers the updated shards instead;
3. the tied embedding's gradient all-reduce between the first and last
   stage, the loss's all-reduce and broadcast (which line the stages up:
   what a stage waits for the slowest is idle, counted as bubble);
4. Adam: an elementwise pass over this rank's (ZeRO: its shard's) numbers.

Parts: compute, exposed communication by kind (tp, cp, ep, pp, dp, tied,
loss), bubble (idle). The spans of each rank tile [0, step] exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace

from dt.parallel.mesh import layout as mesh_groups
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds, send_seconds
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.pipeline import play
from dt.plan.stage import Groups, StageWork, bucket_bytes, stage_work

__all__ = ["KINDS", "Prediction", "Span", "predict"]

KINDS = ("compute", "tp", "cp", "ep", "pp", "dp", "tied", "loss", "bubble")


@dataclass(frozen=True)
class Span:
    kind: str  # one of KINDS
    start: float
    end: float
    label: str = ""


@dataclass
class Prediction:
    layout: Layout
    step: float  # seconds
    parts: dict[str, float]  # mean over stages' ranks, summing to step
    timelines: dict[int, list[Span]]  # rank -> spans (one rank per pipeline stage)
    bytes_per_level: dict[str, float] = field(default_factory=dict)  # per rank per step
    stash: list[int] = field(default_factory=list)  # peak in-flight micro-batches per stage


def _groups(lay: Layout) -> list[Groups]:
    """Per stage, one group of each kind its ranks belong to (the first such: a stage's groups of
    one kind sit alike on the hosts, the mesh numbering being regular)."""
    return _mesh_groups(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.tp_across)


@functools.lru_cache(maxsize=1024)
def _mesh_groups(dp: int, tp: int, pp: int, cp: int, ep: int, across: bool) -> list[Groups]:
    lay = Layout(dp, tp, pp, cp, ep, tp_across=across)
    g = mesh_groups(dp, tp, pp, cp, ep, across)
    stage = {r: s for pp in g["pp"] for s, r in enumerate(pp)}
    first = {kind: {} for kind in g}
    for kind, groups in g.items():
        for x in groups:
            first[kind].setdefault(stage[x[0]], x)
    return [Groups(first["tp"][s], first["cp"][s], first["ep"][s], first["dp_cp"][s], first["edp"][s],
                   g["pp"][0], g["embed"][0]) for s in range(lay.pp)]


def _sync_spans(c: Cluster, lay: Layout, w: StageWork, g: Groups, t0: float) -> list[Span]:
    """The gradient sync after the pipeline: bucketed all-reduces, or ZeRO-1's reduce-scatter + all-gather."""
    spans, t = [], t0
    item = c.itemsize
    if lay.zero:
        total = sum(w.dense) * item
        for kind, op in (("dp", "reduce_scatter"), ("dp", "all_gather")):
            d = collective_seconds(c, op, total, g.dp_cp)
            spans.append(Span(kind, t, t + d, f"ZeRO-1 {op.replace('_', '-')}"))
            t += d
        return spans
    priced: dict[int, float] = {}  # most buckets are the cap's size: price each size once
    for i, nbytes in enumerate(bucket_bytes(w.dense, item) if len(g.dp_cp) > 1 else []):
        if nbytes not in priced:
            priced[nbytes] = collective_seconds(c, "all_reduce", nbytes, g.dp_cp)
        d = priced[nbytes]
        spans.append(Span("dp", t, t + d, f"bucket {i} all-reduce"))
        t += d
    if w.experts and len(g.edp) > 1:
        d = collective_seconds(c, "all_reduce", w.experts * item, g.edp)
        spans.append(Span("dp", t, t + d, "experts' all-reduce"))
    return spans


def _action_spans(acts: list[tuple[str, int, int, float, float]], w: StageWork, v: int) -> list[Span]:
    """A stage's pipeline actions as spans: each one's compute, then its blocking messages by kind."""
    spans = []
    for kind, chunk, i, start, _ in acts:
        t = start
        for k, sec in (w.fwd if kind == "F" else w.bwd).items():
            if sec > 0:
                spans.append(Span(k, t, t + sec / v, f"{kind} chunk {chunk} micro-batch {i}"))
                t += sec / v
    return spans


def predict(c: Cluster, model: ModelShape, lay: Layout, batch: int, seq: int,
            timelines: bool = False) -> Prediction:
    """The step of `lay` on `c`: its parts and bytes per level; with `timelines`, one rank's spans
    per pipeline stage (the other ranks of a stage do the same work at the same times)."""
    groups = _groups(lay)
    works = [stage_work(c, model, lay, groups[s], batch, seq, s) for s in range(lay.pp)]
    b = batch // lay.dp // lay.micro_batches
    act = b * (seq // lay.cp) * model.n_embd * c.itemsize
    send = send_seconds(c, act, groups[0].pp[0], groups[0].pp[1]) if lay.pp > 1 else 0.0
    fwd = tuple(sum(w.fwd.values()) / lay.virtual for w in works)
    bwd = tuple(sum(w.bwd.values()) / lay.virtual for w in works)
    played, stash = play(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, fwd, bwd, send)
    # The fill and the drain cross every stage boundary of the virtual pipeline once each way;
    # the sends of the steady state overlap other stages' work.
    pp_exposed = 2 * (lay.pp * lay.virtual - 1) * send if lay.pp > 1 else 0.0
    syncs = [_sync_spans(c, lay, works[s], groups[s], played[s][-1][4]) for s in range(lay.pp)]
    t_sync = max(sp[-1].end if sp else acts[-1][4] for sp, acts in zip(syncs, played))
    tail, adam = _tail(c, model, lay, works, groups)
    step = t_sync + sum(d for _, d, _ in tail) + max(adam)
    parts = {k: 0.0 for k in KINDS}
    lines: dict[int, list[Span]] = {}
    for s, w in enumerate(works):
        for k in w.fwd:
            parts[k] += lay.micro_batches * (w.fwd[k] + w.bwd[k]) / lay.pp
        spans = _action_spans(played[s], w, lay.virtual) if timelines else []
        spans += syncs[s]
        t = t_sync
        for kind, d, label in tail:
            spans.append(Span(kind, t, t + d, label))
            t += d
        spans.append(Span("compute", step - adam[s], step, "Adam"))  # the wait lines up, then Adam
        for sp in spans[-(len(syncs[s]) + len(tail) + 1):]:
            parts[sp.kind] += (sp.end - sp.start) / lay.pp
        if timelines:
            lines[groups[s].pp[s]] = spans
    busy = sum(parts.values())
    parts["pp"] = min(pp_exposed, max(0.0, step - busy))
    parts["bubble"] = max(0.0, step - busy - parts["pp"])
    levels = _bytes_per_level(c, lay, works[0], groups[0], b, seq, model)
    return Prediction(lay, step, parts, lines, levels, stash)


def _tail(c: Cluster, model: ModelShape, lay: Layout, works: list[StageWork],
          groups: list[Groups]) -> tuple[list[tuple[str, float, str]], list[float]]:
    """(the collectives every stage waits on after the sync, each stage's Adam seconds)."""
    item = c.itemsize
    tail = []
    if model.tied and lay.pp > 1:
        tail.append(("tied", collective_seconds(c, "all_reduce", model.vocab // lay.tp * model.n_embd * item,
                                                groups[0].embed), "tied embedding all-reduce"))
    tail.append(("loss", collective_seconds(c, "all_reduce", item, groups[-1].dp_cp)
                 + (collective_seconds(c, "all_reduce", item, groups[0].pp) if lay.pp > 1 else 0.0),
                 "loss all-reduce, broadcast"))
    opt = []
    for w in works:
        numbers = sum(w.dense) + w.experts
        moments = numbers / lay.dp if lay.zero else numbers
        # Adam reads weight, gradient and both moments and writes weight and moments
        opt.append((3 * numbers + 4 * moments) * item / c.mem_bw)
    return tail, opt


def _bytes_per_level(c: Cluster, lay: Layout, w: StageWork, g: Groups, b: int, seq: int,
                     model: ModelShape) -> dict[str, float]:
    """Bytes one rank of stage 0 sends per step, by the level its groups sit on (ring counts)."""
    from dt.plan.comm import group_hosts

    item = c.itemsize
    act = b * (seq // lay.cp) * model.n_embd * item
    out = {"intra": 0.0, "inter": 0.0}

    def add(ranks: tuple[int, ...], nbytes: float) -> None:
        p = len(ranks)
        if p > 1:
            out["inter" if max(group_hosts(c, ranks)) > 0 else "intra"] += nbytes

    m = lay.micro_batches
    add(g.tp, m * 4 * w.blocks * 2 * (lay.tp - 1) / lay.tp * act)
    add(g.dp_cp, 2 * (len(g.dp_cp) - 1) / len(g.dp_cp) * sum(w.dense) * item)
    if lay.pp > 1:
        add(g.pp[:2], 2 * m * act)
    return out


def describe(p: Prediction) -> SimpleNamespace:
    """The figures a row of the table shows."""
    return SimpleNamespace(step=p.step, **p.parts)
