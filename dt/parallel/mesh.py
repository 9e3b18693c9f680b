"""The 3D mesh: which ranks talk for data, tensor and pipeline parallelism.

    m = dt.mesh(dp=2, tp=2, pp=2)       # on a world of 8
    m.tp_group, m.dp_group, m.pp_group  # this rank's three groups
    m.dp_rank, m.tp_rank, m.pp_rank     # its coordinates

Global rank r sits at coordinates (pp, dp, tp) with tp innermost, as in
Megatron-LM:

    r = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

Tensor parallelism talks the most (two all-reduces per layer, forward and
backward), so its ranks are neighbours: on a real cluster they share a node
and its fast links. Data parallelism talks once per step (the gradient
all-reduce), pipeline parallelism the least (one activation per micro-batch
per stage boundary), so they go outermost.

Every rank creates every group, in the same order, because
torch.distributed.new_group is itself collective over the world: a rank that
skipped one would leave the others waiting. Creating a group moves no dt
traffic; it only gives the point-to-point layer a communicator to name peers in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from dt.parallel.pipeline.p2p import header_groups

__all__ = ["Mesh", "mesh"]


@dataclass
class Mesh:
    """This rank's place in a dp x tp x pp grid and its process groups."""

    dp: int
    tp: int
    pp: int
    rank: int
    dp_rank: int
    tp_rank: int
    pp_rank: int
    dp_group: Any
    tp_group: Any
    pp_group: Any
    dp_ranks: tuple[int, ...]
    tp_ranks: tuple[int, ...]
    pp_ranks: tuple[int, ...]
    # First and last pipeline stage of this (dp, tp) column: a tied word
    # embedding lives on both, and their gradients are summed over this group.
    embed_group: Any = None
    embed_ranks: tuple[int, ...] = ()
    # The pipeline's shape headers travel on groups of their own (see
    # dt.parallel.pipeline.p2p): this rank's, by pipeline boundary.
    pp_headers: dict[int, Any] = field(default_factory=dict, repr=False)
    all_groups: dict[str, list[tuple[int, ...]]] = field(default_factory=dict, repr=False)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def prev_rank(self) -> int | None:
        """Global rank of the previous pipeline stage (None on the first)."""
        return None if self.is_first_stage else self.pp_ranks[self.pp_rank - 1]

    @property
    def next_rank(self) -> int | None:
        """Global rank of the next pipeline stage (None on the last)."""
        return None if self.is_last_stage else self.pp_ranks[self.pp_rank + 1]

    def coords(self) -> tuple[int, int, int]:
        """(dp_rank, tp_rank, pp_rank)."""
        return (self.dp_rank, self.tp_rank, self.pp_rank)


def rank_of(dp_rank: int, tp_rank: int, pp_rank: int, dp: int, tp: int) -> int:
    """Global rank at mesh coordinates (tp innermost, then dp, then pp)."""
    return pp_rank * dp * tp + dp_rank * tp + tp_rank


def layout(dp: int, tp: int, pp: int) -> dict[str, list[tuple[int, ...]]]:
    """Every group of the grid as lists of global ranks, in creation order."""
    R = lambda d, t, p: rank_of(d, t, p, dp, tp)  # noqa: E731
    return {
        "tp": [tuple(R(d, t, p) for t in range(tp)) for p in range(pp) for d in range(dp)],
        "dp": [tuple(R(d, t, p) for d in range(dp)) for p in range(pp) for t in range(tp)],
        "pp": [tuple(R(d, t, p) for p in range(pp)) for d in range(dp) for t in range(tp)],
        "embed": [tuple(sorted({R(d, t, 0), R(d, t, pp - 1)})) for d in range(dp) for t in range(tp)],
    }


def mesh(dp: int = 1, tp: int = 1, pp: int = 1) -> Mesh:
    """Build the dp x tp x pp process groups on the current world.

    Collective over the whole world (every rank must call it with the same
    sizes). Raises ValueError when dp * tp * pp is not the world size.
    """
    if not dist.is_initialized():
        raise RuntimeError("dt.mesh needs torch.distributed initialised (dt.launcher.launch / torchrun)")
    world, me = dist.get_world_size(), dist.get_rank()
    if min(dp, tp, pp) < 1 or dp * tp * pp != world:
        raise ValueError(f"dp * tp * pp = {dp} * {tp} * {pp} = {dp * tp * pp} must equal "
                         f"the world size {world}, each at least 1")
    groups = layout(dp, tp, pp)
    mine: dict[str, tuple[Any, tuple[int, ...]]] = {}
    for kind, rank_lists in groups.items():
        for ranks in rank_lists:
            pg = dist.new_group(list(ranks))  # every rank, every group, same order
            if me in ranks:
                mine[kind] = (pg, ranks)
    pp_headers = header_groups(groups["pp"])
    pp_rank, rest = divmod(me, dp * tp)
    dp_rank, tp_rank = divmod(rest, tp)
    return Mesh(dp=dp, tp=tp, pp=pp, rank=me, dp_rank=dp_rank, tp_rank=tp_rank, pp_rank=pp_rank,
                dp_group=mine["dp"][0], tp_group=mine["tp"][0], pp_group=mine["pp"][0],
                dp_ranks=mine["dp"][1], tp_ranks=mine["tp"][1], pp_ranks=mine["pp"][1],
                embed_group=mine.get("embed", (None, ()))[0],
                embed_ranks=mine.get("embed", (None, ()))[1], all_groups=groups,
                pp_headers=pp_headers)
