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

from dt.parallel.zero.memory import SHARD_ALGORITHM
from dt.plan.cluster import Cluster
from dt.plan.comm import collective_seconds
from dt.plan.layouts import Layout
from dt.plan.pipeline import Action
from dt.plan.stage import RankGroups, StageWork, bucket_bytes, bucket_ready

__all__ = ["after_backward", "backward_exposed", "optimizer_collectives", "thread_end"]


def thread_end(b0: float, b1: float, buckets: list[tuple[float, float]]) -> float:
    """When the gradient thread finishes: buckets (seconds, ready fraction of [b0, b1]) run one
    after another, each no earlier than its last gradient."""
    t = b0
    for seconds, ready in buckets:
        t = max(t, b0 + ready * (b1 - b0)) + seconds
    return t


def backward_exposed(c: Cluster, lay: Layout, w: StageWork, g: RankGroups, acts: list[Action]) -> float:
    """Seconds this stage's backwards wait on their overlapped sync (DDP, ZeRO 2); 0 otherwise."""
    if len(g.dp_cp) < 2 or lay.zero == 3 or lay.zero == 1 and not _zero1_bucketed(c) \
            or w.experts and not lay.zero:
        return 0.0
    op = "all_reduce" if lay.zero == 0 else "reduce_scatter"
    algorithm = "auto" if lay.zero == 0 else SHARD_ALGORITHM  # DDP's auto, ZeRO 2's ring
    behind = c.gpu is None or c.stack.overlap_grad_reduce  # else each bucket waits for backward's end
    priced: dict[tuple[int, int], float] = {}  # most buckets are the cap's size: price each size once

    def seconds(nbytes: int, group: tuple[int, ...]) -> float:
        if (nbytes, len(group)) not in priced:
            priced[nbytes, len(group)] = collective_seconds(c, op, nbytes, group, algorithm)
        return priced[nbytes, len(group)]

    exposed = 0.0
    for chunk, dense in enumerate(_bucketed(lay, w)):
        buckets = [(seconds(nbytes, g.dp_cp), ready)
                   for nbytes, ready in bucket_ready(dense, c.grad_itemsize)]
        buckets += [(seconds(nbytes, g.edp), ready) for nbytes, ready in _expert_buckets(c, w, g)]
        buckets.sort(key=lambda b: b[1])  # both parts' buckets share dt's one gradient thread
        if not behind:
            buckets = [(seconds_, 1.0) for seconds_, _ in buckets]
        backs = [(a.micro_batch, a.end - a.start) for a in acts if a.kind == "B" and a.chunk == chunk]
        once = lay.zero in (0, 1) or c.gpu is not None and c.stack.reduce_once  # else every micro-batch
        if once and backs:
            backs = [max(backs)]  # the chunk's last micro-batch: the only one that syncs
        durations: dict[float, int] = {}  # a chunk's backwards mostly last alike: play each once
        for _, d in backs:
            durations[d] = durations.get(d, 0) + 1
        exposed += sum(k * max(0.0, thread_end(0.0, d, buckets) - d) for d, k in durations.items())
    return exposed


def _zero1_bucketed(c: Cluster) -> bool:
    """Whether ZeRO 1's reduce-scatter runs in backward's buckets (Megatron's distributed optimizer,
    DeepSpeed's stage 1) rather than in the optimizer's step on one flat gradient (dt's)."""
    return c.gpu is not None and c.stack.zero1_in_backward


def _bucketed(lay: Layout, w: StageWork) -> list[list[int]]:
    """Each chunk's tensors its buckets carry: ZeRO 2 keeps a tied word table out (it is summed
    across stages after backward, then reduce-scattered once: optimizer_collectives), the
    embedding's the first tensor of the stage's first chunk, the head's the last of its last."""
    chunks = [list(d) for d in w.chunks]
    if lay.zero == 2 and w.tied:
        if w.embed:
            chunks[0] = chunks[0][1:]
        if w.head:
            chunks[-1] = chunks[-1][:-1]
    return chunks


def _expert_buckets(c: Cluster, w: StageWork, g: RankGroups) -> list[tuple[int, float]]:
    """ZeRO 2's buckets of one chunk's experts (their own ZeroOptimizer over edp, dt.parallel.zero.parts):
    the experts taken as alike per block and spread evenly over the stage's chunks."""
    if not w.experts or len(g.edp) < 2 or not w.blocks:
        return []
    per_block = w.experts // w.blocks
    return bucket_ready([per_block] * (w.blocks // len(w.chunks) or 1), c.grad_itemsize)


def after_backward(c: Cluster, lay: Layout, w: StageWork, g: RankGroups) -> list[tuple[str, float]]:
    """(label, seconds) of the experts' run's sync after the pipeline without ZeRO (ZeRO's parts do
    their own: optimizer_collectives): nothing overlaps it."""
    if not w.experts or lay.zero:
        return []
    item = c.grad_itemsize
    out = [(f"bucket {i} all-reduce", collective_seconds(c, "all_reduce", nbytes, g.dp_cp))
           for i, nbytes in enumerate(bucket_bytes(w.dense, item) if len(g.dp_cp) > 1 else [])]
    if len(g.edp) > 1:
        out.append(("experts' all-reduce", collective_seconds(c, "all_reduce", w.experts * item, g.edp)))
    return out


def optimizer_collectives(c: Cluster, lay: Layout, w: StageWork,
                          g: RankGroups) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """ZeRO's collectives inside the optimizer's step: (before Adam, after Adam), (label, seconds).
    With experts, per part (dt.parallel.zero.parts): the dense over dp x cp, the experts over edp."""
    if lay.zero in (0, 3) or len(g.dp_cp) < 2:  # zero 3's collectives are in forward and backward
        return [], []
    parts = [("", sum(w.dense), g.dp_cp)]
    if w.experts and len(g.edp) > 1:
        parts.append((" (experts)", w.experts, g.edp))
    ring = SHARD_ALGORITHM
    grad, param = c.grad_itemsize, c.param_itemsize
    before = [(f"ZeRO-1 reduce-scatter{tag}", collective_seconds(c, "reduce_scatter", n * grad, group, ring))
              for tag, n, group in parts] if lay.zero == 1 and not _zero1_bucketed(c) else []
    if lay.zero == 2 and w.tied:  # the kept word table's summed gradient, scattered once a step
        before.append(("ZeRO-2 tied reduce-scatter",
                       collective_seconds(c, "reduce_scatter", w.tied * grad, g.dp_cp, ring)))
    if c.gpu is not None and c.stack.overlap_param_gather:  # behind the next step's forward
        return before, []
    after = [(f"ZeRO-{lay.zero} all-gather{tag}", collective_seconds(c, "all_gather", n * param, group, ring))
             for tag, n, group in parts]
    return before, after
