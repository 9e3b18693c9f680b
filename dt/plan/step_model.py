"""One layout's training step, predicted: a timeline per rank whose sum is the step.

What `dt train` runs per step (dt.train.step.TrainStep, --experts included), in order,
on every rank of pipeline stage s:

1. the pipeline: the schedule's actions (dt.plan.pipeline plays them with
   this stage's forward / backward seconds per micro-batch: compute, then
   its tp, cp and ep messages, which block), activations sent between stages;
   the gradient sync overlapped with backward (dt.plan.sync: DDP's buckets
   during each chunk's last backward, ZeRO 2's during every backward): only
   what runs past a backward's end is exposed, added at the stage's end;
2. the tied embedding's gradient sum between the first and last stage, the
   loss's all-reduce and broadcast, clipping's norm all-reduce over pp x tp
   (these line the stages up: what a stage waits for the slowest is idle,
   counted as bubble), first the wait for the slowest rank's compute (skew:
   the ranks' compute times spread, dt.plan.compute.slowest_rank);
3. the optimizer's step: ZeRO 1's reduce-scatter, clipping's pass over the
   gradients and Adam's over this rank's (ZeRO: its shard's) numbers, ZeRO's
   all-gather of the parameters.

Parts: compute, exposed communication by kind (tp, cp, ep, pp, dp, tied,
loss, norm), skew and bubble (idle). The spans of each rank tile [0, step] exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace

from dt.cost.overheads import overheads
from dt.parallel.mesh import mesh_groups
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds, send_seconds
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.optimizer import adam_step_seconds
from dt.plan.pipeline import Action, last_end, play
from dt.plan.stage import RankGroups, StageWork, fsdp_bytes_sent, stage_work
from dt.plan.sync import after_backward, backward_exposed, optimizer_collectives

__all__ = ["KINDS", "Prediction", "Span", "predict", "stage_groups"]

KINDS = ("compute", "tp", "cp", "ep", "pp", "dp", "tied", "loss", "norm", "skew", "bubble")


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


def stage_groups(lay: Layout) -> list[RankGroups]:
    """Per stage, one group of each kind its ranks belong to (the first such: a stage's groups of
    one kind sit alike on the hosts, the mesh numbering being regular)."""
    return _mesh_groups(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.tp_across)


@functools.lru_cache(maxsize=1024)
def _mesh_groups(dp: int, tp: int, pp: int, cp: int, ep: int, across: bool) -> list[RankGroups]:
    lay = Layout(dp, tp, pp, cp, ep, tp_across=across)
    g = mesh_groups(dp, tp, pp, cp, ep, across)
    stage = {r: s for pp in g["pp"] for s, r in enumerate(pp)}
    first = {kind: {} for kind in g}
    for kind, groups in g.items():
        for x in groups:
            first[kind].setdefault(stage[x[0]], x)
    pipe = set(g["pp"][0])  # stage s's rank of the first pipeline, and its tp peers: pp x tp
    norm = tuple(sorted(r for t in g["tp"] if pipe & set(t) for r in t))
    return [RankGroups(first["tp"][s], first["cp"][s], first["ep"][s], first["dp_cp"][s], first["edp"][s],
                   g["pp"][0], g["embed"][0], norm) for s in range(lay.pp)]


def _sync_spans(c: Cluster, lay: Layout, w: StageWork, g: RankGroups, acts: list[Action],
                t0: float) -> list[Span]:
    """After the stage's last action: its backwards' exposed sync, or the experts' run's whole sync."""
    spans, t = [], t0
    if w.hooks > 0:  # on the rank's own thread, inside the synchronised backward
        spans.append(Span("dp", t, t + w.hooks, "DDP hooks: bucket copies, launches, wait (timed here)"))
        t += w.hooks
    exposed = backward_exposed(c, lay, w, g, acts)
    if exposed > 0:
        label = "DDP buckets' all-reduce, exposed" if lay.zero == 0 else "ZeRO-2 reduce-scatter, exposed"
        spans.append(Span("dp", t, t + exposed, label))
        t += exposed
    for label, d in after_backward(c, lay, w, g):
        spans.append(Span("dp", t, t + d, label))
        t += d
    return spans


def _action_spans(acts: list[Action], w: StageWork, v: int) -> list[Span]:
    """A stage's pipeline actions as spans: each one's compute, then its blocking messages by kind."""
    spans = []
    for action in acts:
        t = action.start
        label = f"{action.kind} chunk {action.chunk} micro-batch {action.micro_batch}"
        for k, sec in (w.fwd if action.kind == "F" else w.bwd).items():
            if sec > 0:
                spans.append(Span(k, t, t + sec / v, label))
                t += sec / v
    return spans


def predict(c: Cluster, model: ModelShape, lay: Layout, batch: int, seq: int,
            timelines: bool = False) -> Prediction:
    """The step of `lay` on `c`: its parts and bytes per level; with `timelines`, one rank's spans
    per pipeline stage (the other ranks of a stage do the same work at the same times)."""
    groups = stage_groups(lay)
    works = [stage_work(c, model, lay, groups[s], batch, seq, s) for s in range(lay.pp)]
    b = batch / lay.dp / lay.micro_batches  # the mean micro-batch (dt train's may differ by one)
    act = b * (seq // lay.cp) * model.n_embd * c.itemsize
    carried = act / lay.tp if c.gpu is not None and c.stack.scatter_gather_p2p else act
    send = send_seconds(c, carried, groups[0].pp[0], groups[0].pp[1]) if lay.pp > 1 else 0.0
    fwd = tuple(sum(w.fwd.values()) / lay.virtual for w in works)
    bwd = tuple(sum(w.bwd.values()) / lay.virtual for w in works)
    terms = _message_terms(c, send)
    played, stash = play(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, fwd, bwd, send, *terms)
    # The fill and the drain cross every stage boundary of the virtual pipeline once each way;
    # the sends of the steady state overlap other stages' work, but not what each message costs
    # the cores at its ends or a sleeping receiver's wake-up: the pipeline's end moves by those.
    pp_exposed = 2 * (lay.pp * lay.virtual - 1) * send if lay.pp > 1 else 0.0
    if lay.pp > 1 and terms[:2] != (0.0, 0.0):  # no terms (a catalogue cluster): the same play
        bare, _ = play(lay.schedule, lay.pp, lay.micro_batches, lay.virtual, fwd, bwd, send)
        pp_exposed += max(0.0, last_end(played) - last_end(bare))
    syncs = [_sync_spans(c, lay, works[s], groups[s], played[s], played[s][-1].end) for s in range(lay.pp)]
    t_sync = max(sp[-1].end if sp else acts[-1].end for sp, acts in zip(syncs, played))
    tail = [_skew(lay, works)] + _tail(c, model, lay, groups)
    opt = [_optimizer(c, lay, w, g) for w, g in zip(works, groups)]
    step = t_sync + sum(d for _, d, _ in tail) + max(sum(d for _, d, _ in o) for o in opt)
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
        t = step - sum(d for _, d, _ in opt[s])  # the wait lines up, then the optimizer's step
        for kind, d, label in opt[s]:
            spans.append(Span(kind, t, t + d, label))
            t += d
        for sp in spans[-(len(syncs[s]) + len(tail) + len(opt[s])):]:
            parts[sp.kind] += (sp.end - sp.start) / lay.pp
        if timelines:
            lines[groups[s].pp[s]] = spans
    busy = sum(parts.values())
    parts["pp"] = min(pp_exposed, max(0.0, step - busy))
    parts["bubble"] = max(0.0, step - busy - parts["pp"])
    levels = _bytes_per_level(c, lay, works[0], groups[0], b, seq, model)
    return Prediction(lay, step, parts, lines, levels, stash)


def _message_terms(c: Cluster, send: float) -> tuple[float, float, float]:
    """(post, wake, spin) of a pipeline message on this machine's shared-memory wire, as `dt tune`
    measured them (dt.cost.overheads); on a catalogue cluster none (NCCL's sends run beside the
    compute), unless the stack's sends block its stage: then each end is held the message's time."""
    if not c.shared_memory:
        return (send if c.stack.blocking_p2p else 0.0), 0.0, float("inf")
    t = overheads("shm", c.per_host)
    return t.post, t.wake, t.spin


def _skew(lay: Layout, works: list[StageWork]) -> tuple[str, float, str]:
    """The wait at the first line-up for the slowest rank's compute: the spread of a rank's compute
    (StageWork.slowest) over a step's micro-batches, on the stage where it is largest."""
    wait = max(lay.micro_batches * (w.fwd["compute"] + w.bwd["compute"]) * (w.slowest - 1) for w in works)
    return "skew", wait, "waiting for the slowest rank's compute (its spread)"


def _tail(c: Cluster, model: ModelShape, lay: Layout,
          groups: list[RankGroups]) -> list[tuple[str, float, str]]:
    """The collectives every stage waits on after the pipeline: tied sum, loss, clipping's norm."""
    item = c.itemsize
    tail = []
    if model.tied and lay.pp > 1:  # the word table's gradient, as the data-parallel sync reduces it
        table = model.vocab // lay.tp * model.n_embd * c.grad_itemsize
        tail.append(("tied", collective_seconds(c, "all_reduce", table, groups[0].embed),
                     "tied embedding all-reduce"))
    tail.append(("loss", collective_seconds(c, "all_reduce", item, groups[-1].dp_cp)
                 + (collective_seconds(c, "all_reduce", item, groups[0].pp) if lay.pp > 1 else 0.0),
                 "loss all-reduce, broadcast"))
    if lay.clip and lay.pp * lay.tp > 1:
        norm = collective_seconds(c, "all_reduce", item, groups[0].norm)
        tail.append(("norm", norm, "clip: norm all-reduce"))
    return tail


def _optimizer(c: Cluster, lay: Layout, w: StageWork, g: RankGroups) -> list[tuple[str, float, str]]:
    """This stage's optimizer step in order: ZeRO 1's reduce-scatter, clipping's pass, Adam (timed
    here, memory-bound on a catalogue device: dt.plan.optimizer), ZeRO's all-gather. Under ZeRO
    clipping reads this rank's shard and sums its norm over dp x cp first (dt.train.clip)."""
    before, after = optimizer_collectives(c, lay, w, g)
    shards = len(g.dp_cp) if lay.zero else 1
    # ZeRO shards the dense numbers over dp x cp and the experts' over their replicas (edp), as
    # ZeroParts holds them: the numbers clipping reads on this rank
    numbers = sum(w.dense) / shards + w.experts / (len(g.edp) if lay.zero else 1)
    out = [("dp", d, label) for label, d in before]
    if lay.clip and shards > 1:
        out.append(("norm", collective_seconds(c, "all_reduce", c.itemsize, g.dp_cp), "clip: shards' norm"))
    if lay.clip:  # the squares' sum reads every gradient; the scaling reads and writes each (as kept)
        out.append(("compute", 3 * numbers * c.grad_itemsize / c.mem_bw, "clip"))
    out.append(("compute", adam_step_seconds(c, lay, w, len(g.dp_cp), len(g.edp)), "Adam"))
    return out + [("dp", d, label) for label, d in after]


def _bytes_per_level(c: Cluster, lay: Layout, w: StageWork, g: RankGroups, b: float, seq: int,
                     model: ModelShape) -> dict[str, float]:
    """Bytes one rank of stage 0 sends per step, by the level its groups sit on (ring counts)."""
    from dt.plan.comm import group_hosts

    act = b * (seq // lay.cp) * model.n_embd * c.itemsize
    grad, param = c.grad_itemsize, c.param_itemsize  # the sync's gradients and ZeRO's weights, as kept
    out = {"intra": 0.0, "inter": 0.0}

    def add(ranks: tuple[int, ...], nbytes: float) -> None:
        """A ring over the group in rank order: of its p links, those joining two hosts carry the
        inter-host share of every rank's bytes (each rank sends alike around the ring)."""
        p = len(ranks)
        if p > 1:
            hosts = group_hosts(c, ranks)
            across = sum(hosts[i] != hosts[(i + 1) % p] for i in range(p)) / p
            out["inter"] += nbytes * across
            out["intra"] += nbytes * (1 - across)

    m = lay.micro_batches
    add(g.tp, m * 4 * w.blocks * 2 * (lay.tp - 1) / lay.tp * act)
    share = (len(g.dp_cp) - 1) / len(g.dp_cp)  # of the whole a ring's rank sends, per pass
    if w.fsdp is not None:  # FSDP: each unit's two all-gathers and reduce-scatter a micro-batch
        plane, experts = fsdp_bytes_sent(w.fsdp, len(g.dp_cp), len(g.edp), param, m, grad_itemsize=grad)
        add(g.dp_cp, plane)
        add(g.edp, experts)
    elif lay.zero == 0:  # DDP: one all-reduce of the gradients (a reduce-scatter and an all-gather)
        add(g.dp_cp, 2 * share * sum(w.dense) * grad)
    else:  # ZeRO 1-2: the gradients reduce-scattered (ZeRO 2: every micro-batch), the weights gathered
        once = lay.zero == 1 or c.gpu is not None and c.stack.reduce_once
        add(g.dp_cp, share * sum(w.dense) * ((1 if once else m) * grad + param))
    if lay.pp > 1:
        add(g.pp[:2], 2 * m * act)
    return out


def describe(p: Prediction) -> SimpleNamespace:
    """The figures a row of the table shows."""
    return SimpleNamespace(step=p.step, **p.parts)
