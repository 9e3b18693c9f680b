"""How many micro-batches' activations a stage holds at once: the schedule's own order, replayed.

The runtime (runtime.py) stashes (chunk, micro-batch) at each forward and pops it at
its backward, in the order schedules.schedule gives; replaying that order without tensors
gives the same counts the runtime measures (PipelineStepStats.peak_stash):

    GPipe        m on every stage (every forward before any backward)
    1F1B         min(p - s, m) on stage s: p on the first stage, 1 on the last
    interleaved  min(2 (p-s-1) + (v-1) p + 1, v m) on stage s when p divides m: p v + p - 1
                 on the first stage once m >= 2p, Megatron's p (1 + (p-1)/(p v)) micro-batches
                 of a stage's layers (each chunk holds 1/v of them); fewer when p does not
                 divide m (the last group is shorter)

Memory is the bytes, not the count: with v chunks of different layers a stash of one
chunk's micro-batch weighs what that chunk keeps (dt.cost.activations per chunk), so
peak_stash_bytes weighs each (chunk, micro-batch) and takes the peak of the running sum.
"""

from __future__ import annotations

from collections.abc import Sequence

from dt.parallel.pipeline.schedules import schedule

__all__ = ["peak_stash", "peak_stash_bytes", "stash_profile"]


def stash_profile(name: str, p: int, s: int, m: int, v: int = 1,
                  chunk_bytes: Sequence[float] | None = None) -> list[float]:
    """The stash of stage s after each of its actions: a count, or bytes when chunk_bytes
    (one micro-batch's activations through each of the v chunks) is given."""
    weight = [1.0] * v if chunk_bytes is None else list(chunk_bytes)
    if len(weight) != v:
        raise ValueError(f"chunk_bytes needs one figure per chunk ({v}), got {len(weight)}")
    held, out = 0.0, []
    for kind, c, _ in schedule(name, p, s, m, v):
        held += weight[c] if kind == "F" else -weight[c]
        out.append(held)
    return out


def peak_stash(name: str, p: int, s: int, m: int, v: int = 1) -> int:
    """The most (chunk, micro-batch) activations stage s holds at once."""
    return int(max(stash_profile(name, p, s, m, v)))


def peak_stash_bytes(name: str, p: int, s: int, m: int, chunk_bytes: Sequence[float],
                     chunk_gradients: Sequence[float] | None = None) -> float:
    """The most activation bytes stage s holds at once, chunk c's micro-batch weighing chunk_bytes[c];
    with chunk_gradients, also chunk c's chunk_gradients[c] from its first backward until its last
    begins: gradient accumulation's summed .grad beside DDP's buckets, which the last backward's
    sync folds into them (dt.parallel.data_parallel's no_sync)."""
    profile = stash_profile(name, p, s, m, len(chunk_bytes), chunk_bytes)
    if chunk_gradients is None or not any(chunk_gradients):
        return max(profile)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (kind, chunk, _) in enumerate(schedule(name, p, s, m, len(chunk_bytes))):
        if kind == "B":
            first.setdefault(chunk, i)
            last[chunk] = i
    return max(held + sum(chunk_gradients[c] for c in first if first[c] <= i < last[c])
               for i, held in enumerate(profile))

