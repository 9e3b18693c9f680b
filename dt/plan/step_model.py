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
from typing import NamedTuple

from dt.cost.overheads import overheads
from dt.parallel.mesh import mesh_groups
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds, send_seconds
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.optimizer import adam_step_seconds
from dt.plan.pipeline import Action, last_end, play
from dt.plan.stage import TP_ALL_REDUCES, Charge, RankGroups, StageWork, fsdp_bytes_sent, stage_work
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


def stage_groups(layout: Layout) -> list[RankGroups]:
    """Per stage, one group of each kind its ranks belong to (the first such: a stage's groups of
    one kind sit alike on the hosts, the mesh numbering being regular)."""
    return _mesh_groups(layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.tp_across)


@functools.lru_cache(maxsize=1024)
def _mesh_groups(dp: int, tp: int, pp: int, cp: int, ep: int, across: bool) -> list[RankGroups]:
    groups = mesh_groups(dp, tp, pp, cp, ep, across)
    stage_of = {rank: stage for pipeline in groups["pp"] for stage, rank in enumerate(pipeline)}
    first: dict[str, dict[int, tuple[int, ...]]] = {kind: {} for kind in groups}
    for kind, of_kind in groups.items():
        for group in of_kind:
            first[kind].setdefault(stage_of[group[0]], group)
    pipe = set(groups["pp"][0])  # stage s's rank of the first pipeline, and its tp peers: pp x tp
    norm = tuple(sorted(rank for peers in groups["tp"] if pipe & set(peers) for rank in peers))
    return [RankGroups(tp=first["tp"][s], cp=first["cp"][s], ep=first["ep"][s], dp_cp=first["dp_cp"][s],
                       edp=first["edp"][s], pp=groups["pp"][0], embed=groups["embed"][0], norm=norm)
            for s in range(pp)]


def _sync_spans(cluster: Cluster, layout: Layout, work: StageWork, groups: RankGroups, actions: list[Action],
                start: float) -> list[Span]:
    """After the stage's last action: its backwards' exposed sync, or the experts' run's whole sync."""
    spans, t = [], start
    if work.hooks > 0:  # on the rank's own thread, inside the synchronised backward
        spans.append(Span("dp", t, t + work.hooks, "DDP hooks: bucket copies, launches, wait (timed here)"))
        t += work.hooks
    exposed = backward_exposed(cluster, layout, work, groups, actions)
    if exposed > 0:
        label = "DDP buckets' all-reduce, exposed" if layout.zero == 0 else "ZeRO-2 reduce-scatter, exposed"
        spans.append(Span("dp", t, t + exposed, label))
        t += exposed
    return spans + _laid_out(after_backward(cluster, layout, work, groups), t)


def _laid_out(charges: list[Charge], start: float) -> list[Span]:
    """The charges as spans one after another from `start`."""
    spans, t = [], start
    for charge in charges:
        spans.append(Span(charge.kind, t, t + charge.seconds, charge.label))
        t += charge.seconds
    return spans


def _action_spans(actions: list[Action], work: StageWork, virtual: int) -> list[Span]:
    """A stage's pipeline actions as spans: each one's compute, then its blocking messages by kind."""
    spans = []
    for action in actions:
        t = action.start
        label = f"{action.kind} chunk {action.chunk} micro-batch {action.micro_batch}"
        for kind, seconds in (work.fwd if action.kind == "F" else work.bwd).items():
            if seconds > 0:
                spans.append(Span(kind, t, t + seconds / virtual, label))
                t += seconds / virtual
    return spans


class _Pipeline(NamedTuple):
    """The schedule played out with the stages' predicted seconds."""

    actions: list[list[Action]]  # each stage's, in order
    stash: list[int]  # each stage's peak in-flight micro-batches
    exposed: float  # seconds of its messages between stages that no other stage's work hides


def _pipeline(cluster: Cluster, model: ModelShape, layout: Layout, works: list[StageWork],
              groups: list[RankGroups], sequences: float, seq: int) -> _Pipeline:
    """The schedule played with each stage's forward and backward seconds per chunk and the
    activation's (or its gradient's) message between stages."""
    act = sequences * (seq // layout.cp) * model.n_embd * cluster.itemsize
    carried = act / layout.tp if cluster.gpu is not None and cluster.stack.scatter_gather_p2p else act
    first = groups[0].pp
    send = send_seconds(cluster, carried, first[0], first[1]) if layout.pp > 1 else 0.0
    fwd = tuple(sum(work.fwd.values()) / layout.virtual for work in works)
    bwd = tuple(sum(work.bwd.values()) / layout.virtual for work in works)
    schedule = (layout.schedule, layout.pp, layout.micro_batches, layout.virtual, fwd, bwd, send)
    terms = _message_terms(cluster, send)
    played = play(*schedule, *terms)
    # The fill and the drain cross every stage boundary of the virtual pipeline once each way;
    # the sends of the steady state overlap other stages' work, but not what each message costs
    # the cores at its ends or a sleeping receiver's wake-up: the pipeline's end moves by those.
    exposed = 2 * (layout.pp * layout.virtual - 1) * send if layout.pp > 1 else 0.0
    if layout.pp > 1 and (terms.post, terms.wake) != (0.0, 0.0):  # none (a catalogue cluster): the same play
        exposed += max(0.0, last_end(played.actions) - last_end(play(*schedule).actions))
    return _Pipeline(played.actions, played.stash, exposed)


def predict(cluster: Cluster, model: ModelShape, layout: Layout, batch: int, seq: int,
            timelines: bool = False) -> Prediction:
    """The step of `layout` on `cluster`: its parts and bytes per level; with `timelines`, one rank's
    spans per pipeline stage (the other ranks of a stage do the same work at the same times)."""
    groups = stage_groups(layout)
    works = [stage_work(cluster, model, layout, groups[s], batch, seq, s) for s in range(layout.pp)]
    sequences = batch / layout.dp / layout.micro_batches  # the mean micro-batch (dt train's differ by one)
    pipeline = _pipeline(cluster, model, layout, works, groups, sequences, seq)
    syncs = [_sync_spans(cluster, layout, works[s], groups[s], actions, actions[-1].end)
             for s, actions in enumerate(pipeline.actions)]
    t_sync = max(spans[-1].end if spans else actions[-1].end
                 for spans, actions in zip(syncs, pipeline.actions))
    tail = [_skew(layout, works)] + _tail(cluster, model, layout, groups)
    optimizer = [_optimizer(cluster, layout, work, group) for work, group in zip(works, groups)]
    step = (t_sync + sum(charge.seconds for charge in tail)
            + max(sum(charge.seconds for charge in steps) for steps in optimizer))
    parts = {kind: 0.0 for kind in KINDS}
    lines: dict[int, list[Span]] = {}
    for s, work in enumerate(works):
        for kind in work.fwd:
            parts[kind] += layout.micro_batches * (work.fwd[kind] + work.bwd[kind]) / layout.pp
        # the wait lines the stages up, then each runs its optimizer's step to the step's end
        opt_start = step - sum(charge.seconds for charge in optimizer[s])
        after = syncs[s] + _laid_out(tail, t_sync) + _laid_out(optimizer[s], opt_start)
        for span in after:
            parts[span.kind] += (span.end - span.start) / layout.pp
        if timelines:
            lines[groups[s].pp[s]] = _action_spans(pipeline.actions[s], work, layout.virtual) + after
    busy = sum(parts.values())
    parts["pp"] = min(pipeline.exposed, max(0.0, step - busy))
    parts["bubble"] = max(0.0, step - busy - parts["pp"])
    levels = _bytes_per_level(cluster, layout, works[0], groups[0], sequences, seq, model)
    return Prediction(layout, step, parts, lines, levels, pipeline.stash)


class _MessageTerms(NamedTuple):
    """What a pipeline message costs beside its flight (dt.cost.overheads' terms)."""

    post: float  # each end's core, posting the send or taking the receive
    wake: float  # a receiver that slept, waking once the message lands
    spin: float  # how long a receiver waits awake before it sleeps


def _message_terms(cluster: Cluster, send: float) -> _MessageTerms:
    """A pipeline message's terms on this machine's shared-memory wire, as `dt tune` measured them
    (dt.cost.overheads); on a catalogue cluster none (NCCL's sends run beside the compute), unless
    the stack's sends block its stage: then each end is held the message's time."""
    if not cluster.shared_memory:
        return _MessageTerms(send if cluster.stack.blocking_p2p else 0.0, 0.0, float("inf"))
    measured = overheads("shm", cluster.per_host)
    return _MessageTerms(measured.post, measured.wake, measured.spin)


def _skew(layout: Layout, works: list[StageWork]) -> Charge:
    """The wait at the first line-up for the slowest rank's compute: the spread of a rank's compute
    (StageWork.slowest) over a step's micro-batches, on the stage where it is largest."""
    wait = max(layout.micro_batches * (work.fwd["compute"] + work.bwd["compute"]) * (work.slowest - 1)
               for work in works)
    return Charge("skew", wait, "waiting for the slowest rank's compute (its spread)")


def _tail(cluster: Cluster, model: ModelShape, layout: Layout, groups: list[RankGroups]) -> list[Charge]:
    """The collectives every stage waits on after the pipeline: tied sum, loss, clipping's norm."""
    item = cluster.itemsize
    tail = []
    if model.tied and layout.pp > 1:  # the word table's gradient, as the data-parallel sync reduces it
        table = model.vocab // layout.tp * model.n_embd * cluster.grad_itemsize
        tail.append(Charge("tied", collective_seconds(cluster, "all_reduce", table, groups[0].embed),
                           "tied embedding all-reduce"))
    broadcast = collective_seconds(cluster, "all_reduce", item, groups[0].pp) if layout.pp > 1 else 0.0
    loss = collective_seconds(cluster, "all_reduce", item, groups[-1].dp_cp) + broadcast
    tail.append(Charge("loss", loss, "loss all-reduce, broadcast"))
    if layout.clip and layout.pp * layout.tp > 1:
        norm = collective_seconds(cluster, "all_reduce", item, groups[0].norm)
        tail.append(Charge("norm", norm, "clip: norm all-reduce"))
    return tail


CLIP_PASSES = 3  # clipping reads every gradient for the squares' sum, then reads and writes it scaled


def _optimizer(cluster: Cluster, layout: Layout, work: StageWork, groups: RankGroups) -> list[Charge]:
    """This stage's optimizer step in order: ZeRO 1's reduce-scatter, clipping's pass, Adam (timed
    here, memory-bound on a catalogue device: dt.plan.optimizer), ZeRO's all-gather. Under ZeRO
    clipping reads this rank's shard and sums its norm over dp x cp first (dt.train.clip)."""
    before, after = optimizer_collectives(cluster, layout, work, groups)
    shards = len(groups.dp_cp) if layout.zero else 1
    # ZeRO shards the dense numbers over dp x cp and the experts' over their replicas (edp), as
    # ZeroParts holds them: the numbers clipping reads on this rank
    numbers = sum(work.dense) / shards + work.experts / (len(groups.edp) if layout.zero else 1)
    out = list(before)
    if layout.clip and shards > 1:
        norm = collective_seconds(cluster, "all_reduce", cluster.itemsize, groups.dp_cp)
        out.append(Charge("norm", norm, "clip: shards' norm"))
    if layout.clip:  # each gradient as kept
        out.append(Charge("compute", CLIP_PASSES * numbers * cluster.grad_itemsize / cluster.mem_bw, "clip"))
    adam = adam_step_seconds(cluster, layout, work, len(groups.dp_cp), len(groups.edp))
    out.append(Charge("compute", adam, "Adam"))
    return out + after


def _bytes_per_level(cluster: Cluster, layout: Layout, work: StageWork, groups: RankGroups, sequences: float,
                     seq: int, model: ModelShape) -> dict[str, float]:
    """Bytes one rank of stage 0 sends per step, by the level its groups sit on (ring counts)."""
    from dt.plan.comm import group_hosts

    act = sequences * (seq // layout.cp) * model.n_embd * cluster.itemsize
    grad, param = cluster.grad_itemsize, cluster.param_itemsize  # the sync's gradients and ZeRO's weights
    out = {"intra": 0.0, "inter": 0.0}

    def add(ranks: tuple[int, ...], nbytes: float) -> None:
        """A ring over the group in rank order: of its p links, those joining two hosts carry the
        inter-host share of every rank's bytes (each rank sends alike around the ring)."""
        p = len(ranks)
        if p > 1:
            hosts = group_hosts(cluster, ranks)
            across = sum(hosts[i] != hosts[(i + 1) % p] for i in range(p)) / p
            out["inter"] += nbytes * across
            out["intra"] += nbytes * (1 - across)

    m = layout.micro_batches
    # tp: its all-reduces each way per block, each a ring's 2 (p - 1) / p of the activation
    add(groups.tp, m * 2 * TP_ALL_REDUCES * work.blocks * 2 * (layout.tp - 1) / layout.tp * act)
    share = (len(groups.dp_cp) - 1) / len(groups.dp_cp)  # of the whole a ring's rank sends, per pass
    if work.fsdp is not None:  # FSDP: each unit's two all-gathers and reduce-scatter a micro-batch
        plane, experts = fsdp_bytes_sent(work.fsdp, len(groups.dp_cp), len(groups.edp), param, m,
                                         grad_itemsize=grad)
        add(groups.dp_cp, plane)
        add(groups.edp, experts)
    elif layout.zero == 0:  # DDP: one all-reduce of the gradients (a reduce-scatter and an all-gather)
        add(groups.dp_cp, 2 * share * sum(work.dense) * grad)
    else:  # ZeRO 1-2: the gradients reduce-scattered (ZeRO 2: every micro-batch), the weights gathered
        once = layout.zero == 1 or cluster.gpu is not None and cluster.stack.reduce_once
        add(groups.dp_cp, share * sum(work.dense) * ((1 if once else m) * grad + param))
    if layout.pp > 1:  # each micro-batch's activation forward and its gradient back
        add(groups.pp[:2], 2 * m * act)
    return out
