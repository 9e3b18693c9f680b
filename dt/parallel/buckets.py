"""Gradient buckets: many tensors moved as a few flat buffers.

One collective per gradient tensor pays the per-message cost (alpha, and
the ring's 2(p-1) steps) once per tensor: a model of a hundred small
LayerNorm and bias tensors pays it a hundred times. Packed back to back into
flat buffers, the same bytes go in a few collectives of a few megabytes each,
where bandwidth, not latency, sets the time.

The rule (torch DDP's), in `make_buckets`: walk the tensors in the order
their gradients are produced; a bucket closes once it holds at least its
limit (the first bucket `first_bytes`, small, so the first collective starts
early in backward; then `cap_bytes`), or when the dtype changes (a flat
buffer has one dtype). A tensor larger than the cap gets a bucket alone.

Every bucketed sync in dt cuts its buckets here: DDP (data_parallel.py,
overlapped with backward), ZeRO stage 2 (zero/, reduce-scattered during
backward) and the training step's all-reduces after backward
(`all_reduce_buckets`, dt.train.step: the gradients of a model with experts,
which no DDP wraps, and of a weight two pipeline stages share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dt.collectives import all_reduce, shm_empty
from dt.collectives.ops import ReduceOp
from dt.layout import edges
from dt.transport import resolve_group

__all__ = ["MB", "Bucket", "all_reduce_buckets", "make_buckets"]

MB = 1024 * 1024


def make_buckets(tensors: Sequence[torch.Tensor], first_bytes: int, cap_bytes: int) -> list[list[int]]:
    """Group tensor indices (already in the order their gradients arrive) into buckets.

    A bucket closes once it holds at least its limit (first bucket: first_bytes,
    then cap_bytes), or when the dtype changes. A tensor larger than the cap
    gets a bucket alone.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, t in enumerate(tensors):
        if current and t.dtype != tensors[current[0]].dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += t.numel() * t.element_size()
        if size >= (first_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class Bucket:
    """A flat buffer holding a run of tensors back to back: tensor i lives in `slot(i)`."""

    tensors: list[torch.Tensor]
    offsets: list[int]
    buffer: torch.Tensor

    @classmethod
    def over(cls, tensors: Sequence[torch.Tensor], shared: Any = None) -> Bucket:
        """A zeroed buffer with room for `tensors` (one dtype, one device), in order.

        shared: a group whose every rank makes the same buckets in the same order:
        CPU buffers then live in its shared memory (dt.shm_empty), so the
        shared-memory all-reduce reads the peers' buckets in place, no copy in.
        """
        ends = edges([t.numel() for t in tensors])
        first = tensors[0]
        if shared is not None and first.device.type == "cpu":
            buffer = shm_empty(ends[-1], dtype=first.dtype, group=shared).zero_()
        else:
            buffer = torch.zeros(ends[-1], dtype=first.dtype, device=first.device)
        return cls(list(tensors), ends[:-1], buffer)

    def slot(self, i: int) -> torch.Tensor:
        """Tensor i's place in the buffer, shaped like it (a view: writes go to the buffer)."""
        t = self.tensors[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + t.numel()].view_as(t)


def all_reduce_buckets(tensors: Sequence[torch.Tensor], group: Any = None, op: Any = ReduceOp.AVG,
                       cap_bytes: int = 25 * MB, algorithm: str = "auto") -> int:
    """All-reduce `tensors` in place, packed into make_buckets' flat buffers; returns the count.

    For a sync after backward (nothing left to overlap with), so the first
    bucket is as large as the others. Cost per rank: one all-reduce of every
    byte of `tensors`, 2(p-1)/p of them sent with the ring, in as many
    collectives as there are buckets.
    """
    g = resolve_group(group)
    if g.size == 1 or not tensors:
        return 0
    groups = make_buckets(tensors, cap_bytes, cap_bytes)
    for idx in groups:
        bucket = Bucket.over([tensors[i] for i in idx])
        for i, t in enumerate(bucket.tensors):
            bucket.slot(i).copy_(t)
        all_reduce(bucket.buffer, op, g, algorithm=algorithm)
        for i, t in enumerate(bucket.tensors):
            t.copy_(bucket.slot(i))
    return len(groups)
