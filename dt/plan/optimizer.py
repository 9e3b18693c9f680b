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
from dt.plan.compute import DTYPES, oversubscribed, rank_threads
from dt.plan.layouts import Layout
from dt.plan.stage import FsdpUnits, StageWork

__all__ = ["adam_step_seconds", "adam_tensors"]

# Adam untimed, by its bytes: every number's weight read and written and its gradient read, and the
# two moments read and written for each number it steps (the shard, under ZeRO): 7 passes unsharded
WEIGHT_PASSES = 3
MOMENT_PASSES = 4


def adam_tensors(layout: Layout, dense: list[int], experts: int, fsdp: FsdpUnits | None, shards: int,
                 expert_shards: int = 1) -> tuple[int, ...]:
    """Numbers of each tensor this rank's Adam steps, of a stage's `dense` tensors and `experts`
    numbers (ZeRO: its flat shard, ceil(psi / N); zero 3: each FSDP unit's shard in `fsdp`, an
    expert's over its replicas)."""
    if fsdp is not None:
        return (tuple(-(-numel // shards) for numel in fsdp.plane)
                + tuple(-(-numel // expert_shards) for numel in fsdp.experts))
    if layout.zero and shards > 1:  # with experts two parts (ZeroParts): the dense, this rank's experts
        flat = (-(-sum(dense) // shards),)
        return flat + ((-(-experts // expert_shards),) if experts else ())
    return tuple(dense) + ((experts,) if experts else ())


def adam_step_seconds(cluster: Cluster, layout: Layout, work: StageWork, shards: int,
                      expert_shards: int = 1) -> float:
    """Seconds of this rank's Adam step: timed here, or its bytes at the catalogue's bandwidth."""
    sizes = adam_tensors(layout, work.dense, work.experts, work.fsdp, shards, expert_shards)
    if cluster.gpu is not None:  # each number it steps: the stack's bytes read and written at HBM's rate
        return optimizer_bytes(cluster.stack) * sum(sizes) / cluster.mem_bw
    if cluster.timed == "cuda":  # dt train's Adam on the GPU: its float32 state, one kernel launch per op
        from dt.plan.timed import adam_seconds

        return adam_seconds(sizes, 1, "float32", "cuda")
    if cluster.timed == "cpu":
        from dt.plan.timed import adam_within_budget

        threads = rank_threads(layout.world)
        seconds = adam_within_budget(sizes, threads, DTYPES[cluster.itemsize])
        if seconds is not None:
            return seconds * oversubscribed(layout.world)
    # untimed (past the timing budget): its passes over the weights and the moments at the memcpy rate
    numbers = sum(work.dense) + work.experts
    return (WEIGHT_PASSES * numbers + MOMENT_PASSES * sum(sizes)) * cluster.itemsize / cluster.mem_bw
