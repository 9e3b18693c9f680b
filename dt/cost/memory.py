"""Memory that communication itself holds: the collectives' scratch buffers.

A reduction cannot receive straight into its result, so the ring lands
incoming chunks in scratch buffers (dt.collectives.scratch), kept between
calls because fresh pages cost a fifth of a big all-reduce. That memory is
real: ZeRO's and FSDP's `memory()` count it, and these functions predict it.

The ring's buffers, per thread, per dtype and device (the cache keeps the
largest size each slot was asked for, up to MAX_CACHED_BYTES):

    slot 0, 1  two landing buffers of the largest chunk received in a reducing lap
    slot 2     reduce-scatter: the chunks reduced on the way (the whole input's size)
"""

from __future__ import annotations

from dt.layout import ring_received

__all__ = ["MAX_CACHED_BYTES", "ring_reduce_scatter_scratch", "scratch_held"]

MAX_CACHED_BYTES = 256 << 20  # a bigger one-off buffer is freed after its call, not kept


def ring_reduce_scatter_scratch(chunk_numels: list[int], itemsize: int, rank: int) -> dict[int, int]:
    """Bytes per scratch slot one ring reduce-scatter asks for on `rank` (gloo's posting)."""
    p = len(chunk_numels)
    slots = {2: sum(chunk_numels) * itemsize}
    if p > 1:
        # a lap of p - 1 steps receives every chunk but the one a p-th step would bring: the
        # largest of the others (the planner asks this for every layout: no per-step loop)
        skip = ring_received(rank, p, p - 1, -1)
        biggest = max(chunk_numels[:skip] + chunk_numels[skip + 1:])
        for slot in range(min(2, p - 1)):
            slots[slot] = biggest * itemsize
    return slots


def scratch_held(calls: list[dict[int, int]]) -> int:
    """Bytes a thread holds after `calls` (each {slot: bytes}): per slot, the largest kept."""
    held: dict[int, int] = {}
    for call in calls:
        for slot, nbytes in call.items():
            if nbytes <= MAX_CACHED_BYTES:
                held[slot] = max(held.get(slot, 0), nbytes)
    return sum(held.values())
