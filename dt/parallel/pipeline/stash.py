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

__all__ = ["peak_stash", "peak_stash_bytes", "peak_stash_bytes_after_first_backward", "stash_profile"]


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


def peak_stash_bytes(name: str, p: int, s: int, m: int, chunk_bytes: Sequence[float]) -> float:
    """The most activation bytes stage s holds at once, chunk c's micro-batch weighing chunk_bytes[c]."""
    return max(stash_profile(name, p, s, m, len(chunk_bytes), chunk_bytes))


def peak_stash_bytes_after_first_backward(name: str, p: int, s: int, m: int,
                                          chunk_bytes: Sequence[float]) -> float:
    """The most activation bytes stage s holds once its first backward has run (0 if it runs no
    backward): what a gradient accumulated from that backward on sits beside (gradient accumulation
    under DDP, dt.parallel.data_parallel's no_sync)."""
    kinds = [kind for kind, _, _ in schedule(name, p, s, m, len(chunk_bytes))]
    if "B" not in kinds:
        return 0.0
    return max(stash_profile(name, p, s, m, len(chunk_bytes), chunk_bytes)[kinds.index("B"):])
