"""Where a tensor a rank holds sits in the full tensor: the one description every layout shares.

Tensor parallelism holds a block of a tensor (a slice along one dimension),
ZeRO and FSDP a flat range of that block (their shard of a flat buffer),
data parallelism the same piece on several ranks. A Place says all three, so
a checkpoint can be written from any layout and read into any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from dt.layout import Block

__all__ = ["Held", "Place"]


@dataclass(frozen=True)
class Place:
    """Where a tensor this rank holds sits in the full tensor `name` of shape `shape`.

    The rank holds `block` of it (a tensor-parallel slice; None: all of it),
    and of that block the elements [flat[0], flat[1]) in row-major order (a
    ZeRO or FSDP shard; None: the whole block). `replicas` ranks hold the
    same piece (data parallel); replica `replica` writes its share of it.
    `saved` False: a copy that is only loaded (a tied weight's second home).
    """

    name: str
    shape: tuple[int, ...]
    block: Block | None = None
    flat: tuple[int, int] | None = None
    replica: int = 0
    replicas: int = 1
    saved: bool = True

    @property
    def box(self) -> Block:
        return self.block if self.block is not None else ((0,) * len(self.shape), tuple(self.shape))

    @property
    def range(self) -> tuple[int, int]:
        return self.flat if self.flat is not None else (0, math.prod(self.box[1]))

    @property
    def numel(self) -> int:
        lo, hi = self.range
        return hi - lo

    def part(self, lo: int, hi: int) -> Place:
        """Elements [lo, hi) of what this place holds, held by one rank alone (a ZeRO shard of it)."""
        start = self.range[0]
        return replace(self, flat=(start + lo, start + hi), replica=0, replicas=1)

    def renamed(self, name: str) -> Place:
        return replace(self, name=name)


@dataclass
class Held:
    """A tensor and its place: `data` has place.numel elements and is contiguous (loads write into it)."""

    place: Place
    data: torch.Tensor
