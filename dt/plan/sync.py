"""The gradient sync and the optimizer's collectives as dt.train.step.TrainStep runs them, priced.

    DDP (zero 0)  each model chunk's buckets (stage.bucket_ready: backward's order, 1 MB
                  first, 25 MB cap) all-reduced over dp x cp on dt's one gradient thread,
                  each launched as its last gradient arrives during the chunk's last
                  micro-batch's backward (only that one syncs), strictly in order; backward
                  ends waiting for them all: what runs past its end is exposed
    ZeRO 2        the same buckets reduce-scattered during every micro-batch's backward
                  (ZeRO's hooks have no no_sync), exposed likewise; then, after Adam on
                  the shard, an all-gather of the updated parameters
                  (a tied word table two stages hold kept out of them: summed across the
                  stages after backward, then reduce-scattered once before Adam)
    ZeRO 1        one reduce-scatter of the flat gradient inside the optimizer's step,
                  after backward (nothing overlaps it), Adam on the shard, the all-gather
    ZeRO 3        FSDP per stage (each chunk's units over the stage's dp x cp, experts' over
                  edp): each unit all-gathered before its forward, again before its backward,
                  its gradient reduce-scattered there; what of them the compute does not hide
                  (the stack's prefetch: dt.plan.stage.fsdp_exposed) is priced in the stage's
                  forward and backward (dt.plan.stage.fsdp_units), none here
    experts       without ZeRO, TrainStep's own sync (no DDP wraps the chunks): the buckets
                  all-reduced one after another after the last backward, then the experts' over
                  their replicas; with ZeRO 1-2, ZeroParts: each collective above on the dense
                  part over dp x cp and on the experts over their replicas (edp)

A backward's gradients are taken to arrive at an even pace per number (the
head's backward is heavier than its one matrix says; for the small models
this machine runs, all of a chunk is one bucket, ready at its end anyway).
The overlapped collectives also take turns on the cores with backward's
compute, which this model does not charge.
"""

from __future__ import annotations

from typing import NamedTuple

from dt.parallel.zero.memory import SHARD_ALGORITHM
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds
from dt.plan.layouts import Layout
from dt.plan.pipeline import Action
from dt.plan.stage import Charge, PlannedBucket, RankGroups, StageWork, bucket_bytes, bucket_ready

__all__ = ["BucketCall", "after_backward", "backward_exposed", "optimizer_collectives", "thread_end"]


class BucketCall(NamedTuple):
    """One bucket's collective on the gradient thread."""

    seconds: float
    ready: float  # the fraction of the backward done when it may start (its last gradient arrived)


def thread_end(start: float, end: float, buckets: list[BucketCall] | list[tuple[float, float]]) -> float:
    """When the gradient thread finishes: buckets (seconds, ready fraction of the backward that runs
    from `start` to `end`) run one after another, each no earlier than its last gradient."""
    t = start
    for seconds, ready in buckets:
        t = max(t, start + ready * (end - start)) + seconds
    return t


def backward_exposed(cluster: Cluster, layout: Layout, work: StageWork, groups: RankGroups,
                     actions: list[Action]) -> float:
    """Seconds this stage's backwards wait on their overlapped sync (DDP, ZeRO 2); 0 otherwise."""
    if len(groups.dp_cp) < 2 or layout.zero == 3 or layout.zero == 1 and not _zero1_bucketed(cluster) \
            or work.experts and not layout.zero:
        return 0.0
    collective = "all_reduce" if layout.zero == 0 else "reduce_scatter"
    algorithm = "auto" if layout.zero == 0 else SHARD_ALGORITHM  # DDP's auto, ZeRO 2's ring
    behind = cluster.gpu is None or cluster.stack.overlap_grad_reduce  # else each waits for backward's end
    priced: dict[tuple[int, int], float] = {}  # most buckets are the cap's size: price each size once

    def seconds(nbytes: int, group: tuple[int, ...]) -> float:
        if (nbytes, len(group)) not in priced:
            priced[nbytes, len(group)] = collective_seconds(cluster, collective, nbytes, group, algorithm)
        return priced[nbytes, len(group)]

    # one sync, in each chunk's last micro-batch's backward (else in every micro-batch's)
    once = layout.zero in (0, 1) or cluster.gpu is not None and cluster.stack.reduce_once
    exposed = 0.0
    for chunk, dense in enumerate(_bucketed(layout, work)):
        buckets = [BucketCall(seconds(bucket.nbytes, groups.dp_cp), bucket.ready)
                   for bucket in bucket_ready(dense, cluster.grad_itemsize)]
        buckets += [BucketCall(seconds(bucket.nbytes, groups.edp), bucket.ready)
                    for bucket in _expert_buckets(cluster, work, groups)]
        buckets.sort(key=lambda call: call.ready)  # both parts' buckets share dt's one gradient thread
        if not behind:
            buckets = [BucketCall(call.seconds, 1.0) for call in buckets]
        backs = [(a.micro_batch, a.end - a.start) for a in actions if a.kind == "B" and a.chunk == chunk]
        if once and backs:
            backs = [max(backs)]  # the chunk's last micro-batch: the only one that syncs
        durations: dict[float, int] = {}  # a chunk's backwards mostly last alike: play each once
        for _, duration in backs:
            durations[duration] = durations.get(duration, 0) + 1
        exposed += sum(count * max(0.0, thread_end(0.0, duration, buckets) - duration)
                       for duration, count in durations.items())
    return exposed


def _zero1_bucketed(cluster: Cluster) -> bool:
    """Whether ZeRO 1's reduce-scatter runs in backward's buckets (Megatron's distributed optimizer,
    DeepSpeed's stage 1) rather than in the optimizer's step on one flat gradient (dt's)."""
    return cluster.gpu is not None and cluster.stack.zero1_in_backward


def _bucketed(layout: Layout, work: StageWork) -> list[list[int]]:
    """Each chunk's tensors its buckets carry: ZeRO 2 keeps a tied word table out (it is summed
    across stages after backward, then reduce-scattered once: optimizer_collectives), the
    embedding's the first tensor of the stage's first chunk, the head's the last of its last."""
    chunks = [list(dense) for dense in work.chunks]
    if layout.zero == 2 and work.tied:
        if work.embed:
            chunks[0] = chunks[0][1:]
        if work.head:
            chunks[-1] = chunks[-1][:-1]
    return chunks


def _expert_buckets(cluster: Cluster, work: StageWork, groups: RankGroups) -> list[PlannedBucket]:
    """ZeRO 2's buckets of one chunk's experts (their own ZeroOptimizer over edp, dt.parallel.zero.parts):
    the experts taken as alike per block and spread evenly over the stage's chunks."""
    if not work.experts or len(groups.edp) < 2 or not work.blocks:
        return []
    per_block = work.experts // work.blocks
    return bucket_ready([per_block] * (work.blocks // len(work.chunks) or 1), cluster.grad_itemsize)


def after_backward(cluster: Cluster, layout: Layout, work: StageWork, groups: RankGroups) -> list[Charge]:
    """The experts' run's sync after the pipeline without ZeRO (ZeRO's parts do their own:
    optimizer_collectives): nothing overlaps it."""
    if not work.experts or layout.zero:
        return []
    item = cluster.grad_itemsize
    buckets = bucket_bytes(work.dense, item) if len(groups.dp_cp) > 1 else []
    out = [Charge("dp", collective_seconds(cluster, "all_reduce", nbytes, groups.dp_cp),
                  f"bucket {i} all-reduce") for i, nbytes in enumerate(buckets)]
    if len(groups.edp) > 1:
        experts = collective_seconds(cluster, "all_reduce", work.experts * item, groups.edp)
        out.append(Charge("dp", experts, "experts' all-reduce"))
    return out


def optimizer_collectives(cluster: Cluster, layout: Layout, work: StageWork,
                          groups: RankGroups) -> tuple[list[Charge], list[Charge]]:
    """ZeRO's collectives inside the optimizer's step: (before Adam, after Adam). With experts, per
    part (dt.parallel.zero.parts): the dense over dp x cp, the experts over edp."""
    if layout.zero in (0, 3) or len(groups.dp_cp) < 2:  # zero 3's collectives are in forward and backward
        return [], []
    parts = [("", sum(work.dense), groups.dp_cp)]
    if work.experts and len(groups.edp) > 1:
        parts.append((" (experts)", work.experts, groups.edp))
    ring = SHARD_ALGORITHM
    grad, param = cluster.grad_itemsize, cluster.param_itemsize

    def each(collective: str, itemsize: int, label: str) -> list[Charge]:
        return [Charge("dp", collective_seconds(cluster, collective, numbers * itemsize, group, ring),
                       f"{label}{tag}") for tag, numbers, group in parts]

    flat = layout.zero == 1 and not _zero1_bucketed(cluster)
    before = each("reduce_scatter", grad, "ZeRO-1 reduce-scatter") if flat else []
    if layout.zero == 2 and work.tied:  # the kept word table's summed gradient, scattered once a step
        table = collective_seconds(cluster, "reduce_scatter", work.tied * grad, groups.dp_cp, ring)
        before.append(Charge("dp", table, "ZeRO-2 tied reduce-scatter"))
    if cluster.gpu is not None and cluster.stack.overlap_param_gather:  # behind the next step's forward
        return before, []
    return before, each("all_gather", param, f"ZeRO-{layout.zero} all-gather")
