"""The optimizer's step, priced: dt.train.optim.Adam over one rank's tensors.

On a catalogue device Adam is memory-bound: it reads the gradient, the master
weight and both moments and writes them back with the working copy, the stack's
bytes per number (dt.cost.kernels.optimizer_bytes) at the device's sustained
bandwidth (`dt plan --timed`: timed on this host's GPU, as below). On this machine
it is bound by its ops (about ten per tensor: a 0.2M-parameter GPT's 52 tensors
cost 3-6 ms of CPU where their bytes say 1.2 ms), so Adam's own step is timed
(dt.plan.timed, within the process's timing budget; past it, by its bytes) over the
tensors it steps: every dense tensor apart without ZeRO, one flat shard of
psi / N numbers with it (ZeroOptimizer's), the experts' weights as one more.
"""

from __future__ import annotations

from dt.cost.kernels import optimizer_bytes
from dt.plan.cluster import Cluster
from dt.plan.compute import oversubscribed, rank_threads
from dt.plan.layouts import Layout
from dt.plan.stage import StageWork

__all__ = ["adam_step_seconds", "adam_tensors"]


def adam_tensors(lay: Layout, w: StageWork, shards: int, expert_shards: int = 1) -> tuple[int, ...]:
    """Numbers of each tensor this rank's Adam steps (ZeRO: its flat shard, ceil(psi / N); zero 3:
    each FSDP unit's shard, an expert's over its replicas)."""
    if w.fsdp is not None:
        return (tuple(-(-n // shards) for n in w.fsdp.plane)
                + tuple(-(-n // expert_shards) for n in w.fsdp.experts))
    if lay.zero and shards > 1:  # with experts two parts (ZeroParts): the dense, this rank's experts
        dense = (-(-sum(w.dense) // shards),)
        return dense + ((-(-w.experts // expert_shards),) if w.experts else ())
    return tuple(w.dense) + ((w.experts,) if w.experts else ())


def adam_step_seconds(c: Cluster, lay: Layout, w: StageWork, shards: int, expert_shards: int = 1) -> float:
    """Seconds of this rank's Adam step: timed here, or its bytes at the catalogue's bandwidth."""
    sizes = adam_tensors(lay, w, shards, expert_shards)
    if c.gpu is not None:  # each number it steps: the stack's bytes read and written at HBM's rate
        return optimizer_bytes(c.stack) * sum(sizes) / c.mem_bw
    if c.timed == "cuda":  # dt train's Adam on the GPU: its float32 state, one kernel launch per op
        from dt.plan.timed import adam_seconds

        return adam_seconds(sizes, 1, "float32", "cuda")
    if c.timed == "cpu":
        from dt.plan.timed import adam_within_budget

        threads = rank_threads(lay.world)
        seconds = adam_within_budget(sizes, threads, {4: "float32", 8: "float64"}[c.itemsize])
        if seconds is not None:
            return seconds * oversubscribed(lay.world)
    # untimed (past the timing budget): the gradients read, and the shard's weights and moments read
    # and written, at the memcpy rate
    numbers = sum(w.dense) + w.experts
    return (3 * numbers + 4 * sum(sizes)) * c.itemsize / c.mem_bw
