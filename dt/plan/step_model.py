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

from dataclasses import dataclass, field
from types import SimpleNamespace

from dt.parallel.buckets import MB, make_buckets
from dt.parallel.mesh import layout as mesh_groups
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds, send_seconds
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.pipeline import play
from dt.plan.stage import Groups, StageWork, stage_work

__all__ = ["ADAM_BYTES_PER_NUMBER", "Prediction", "Span", "predict"]

# Adam's pass reads parameter, gradient and both moments and writes parameter and
# both moments: 7 numbers of memory traffic per parameter.
ADAM_NUMBERS = 7
ADAM_BYTES_PER_NUMBER = ADAM_NUMBERS
BUCKET_CAP = 25 * MB  # all_reduce_buckets' default cap (first bucket the same)
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


def _groups(lay: Layout, stage: int) -> Groups:
    g = mesh_groups(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.tp_across)
    pick = lambda kind: next(x for x in g[kind] if any(_stage_of(lay, r) == stage for r in x))  # noqa: E731
    return Groups(pick("tp"), pick("cp"), pick("ep"), pick("dp_cp"), pick("edp"), g["pp"][0], g["embed"][0])


def _stage_of(lay: Layout, rank: int) -> int:
    g = mesh_groups(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.tp_across)["pp"]
    return next(pp.index(rank) for pp in g if rank in pp)


class _Sized:
    """A tensor's size for make_buckets (numel, element_size, dtype), without the tensor."""

    def __init__(self, numel: int, itemsize: int):
        self._n, self._i, self.dtype = numel, itemsize, itemsize

    def numel(self) -> int:
        return self._n

    def element_size(self) -> int:
        return self._i


def _sync_spans(c: Cluster, lay: Layout, w: StageWork, g: Groups, t0: float) -> list[Span]:
    """The gradient sync after the pipeline: bucketed all-reduces, or ZeRO-1's reduce-scatter + all-gather."""
    spans, t = [], t0
    item = c.itemsize
    sized = [_Sized(n, item) for n in w.dense]
    if lay.zero:
        total = sum(w.dense) * item
        for kind, op in (("dp", "reduce_scatter"), ("dp", "all_gather")):
            d = collective_seconds(c, op, total, g.dp_cp)
            spans.append(Span(kind, t, t + d, f"ZeRO-1 {op.replace('_', '-')}"))
            t += d
        return spans
    for i, idx in enumerate(make_buckets(sized, BUCKET_CAP, BUCKET_CAP) if len(g.dp_cp) > 1 else []):
        d = collective_seconds(c, "all_reduce", sum(w.dense[j] for j in idx) * item, g.dp_cp)
        spans.append(Span("dp", t, t + d, f"bucket {i} all-reduce"))
        t += d
    if w.experts and len(g.edp) > 1:
        d = collective_seconds(c, "all_reduce", w.experts * item, g.edp)
        spans.append(Span("dp", t, t + d, "experts' all-reduce"))
    return spans


def predict(c: Cluster, model: ModelShape, lay: Layout, batch: int, seq: int) -> Prediction:
    """The step of `lay` on `c`: each stage's first rank's timeline, the parts, the bytes per level."""
    groups = [_groups(lay, s) for s in range(lay.pp)]
    works = [stage_work(c, model, lay, groups[s], batch, seq, s) for s in range(lay.pp)]
    b = batch // lay.dp // lay.micro_batches
    act = b * (seq // lay.cp) * model.n_embd * c.itemsize
    send = send_seconds(c, act, groups[0].pp[0], groups[0].pp[1]) if lay.pp > 1 else 0.0
    fwd = tuple(sum(w.fwd.values()) / lay.virtual for w in works)
    bwd = tuple(sum(w.bwd.values()) / lay.virtual for w in works)
    played, stash = play(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, fwd, bwd, send)
    no_send = max(a[-1][4] for a in play(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, fwd, bwd, 0.0)[0])
    pp_exposed = max(a[-1][4] for a in played) - no_send
    timelines: dict[int, list[Span]] = {}
    ends = []
    for s, acts in enumerate(played):
        spans: list[Span] = []
        w = works[s]
        for kind, chunk, i, start, _ in acts:
            t = start
            for k, sec in (w.fwd if kind == "F" else w.bwd).items():
                if sec > 0:
                    spans.append(Span(k, t, t + sec / lay.virtual, f"{kind} chunk {chunk} micro-batch {i}"))
                    t += sec / lay.virtual
        spans += _sync_spans(c, lay, w, groups[s], acts[-1][4])
        ends.append(spans[-1].end if spans else 0.0)
        timelines[groups[s].pp[s]] = spans
    t_sync = max(ends)
    tail = _tail(c, model, lay, works, groups, t_sync)
    step = t_sync + sum(d for _, d, _ in tail[0]) + max(tail[1])
    parts = {k: 0.0 for k in KINDS}
    for s, (rank, spans) in enumerate(timelines.items()):
        t = t_sync
        for kind, d, label in tail[0]:
            spans.append(Span(kind, t, t + d, label))
            t += d
        opt = tail[1][s]
        spans.append(Span("compute", step - opt, step, "Adam"))  # the wait lines up, then Adam
        for sp in spans:
            parts[sp.kind] += (sp.end - sp.start) / lay.pp
    busy = sum(parts.values())
    parts["pp"] = min(pp_exposed, max(0.0, step - busy))
    parts["bubble"] = max(0.0, step - busy - parts["pp"])
    levels = _bytes_per_level(c, lay, works[0], groups[0], b, seq, model)
    return Prediction(lay, step, parts, timelines, levels, stash)


def _tail(c: Cluster, model: ModelShape, lay: Layout, works: list[StageWork], groups: list[Groups],
          t0: float) -> tuple[list[tuple[str, float, str]], list[float]]:
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
