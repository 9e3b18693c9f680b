"""The mesh: which ranks talk for data, context, expert, tensor and pipeline parallelism.

A thin view over dt.parallel.grid.Grid for a script that wants every group
at once as attributes (dt.parallelize and dt train ask the grid for its
groups by axis name instead): the numbering and the groups are the grid's.

    m = dt.mesh(dp=2, cp=2, tp=2)             # on a world of 8
    m = dt.mesh(dp=2, cp=2, ep=4, pp=2)       # experts over 4 ranks of the dp x cp plane
    m.tp_group, m.cp_group, m.dp_group, m.pp_group, m.ep_group
    m.dp_rank, m.cp_rank, m.tp_rank, m.pp_rank, m.ep_rank

Global rank r sits at coordinates (pp, dp, cp, tp), tp innermost:

    r = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank

so world = dp * cp * tp * pp (`tp_across=True` puts tp outermost instead:
r = tp_rank * (dp * cp * pp) + the rest, so its groups span hosts; only to
compare, `dt train --layout tp-across`). The order is by how much each talks. Tensor
parallelism talks the most (all-reduces in every layer, forward and
backward), so its ranks are neighbours: on a real cluster they share a node
and its fast links. Context parallelism is next (ring attention passes
keys and values around in every layer; Ulysses runs two all-to-alls per
layer each way). Data parallelism talks once per step (the gradient
all-reduce), pipeline parallelism least (one activation per micro-batch per
stage boundary), so they go outermost. This is Megatron-LM's order.

Expert parallelism is not a dimension of its own: its ranks are carved out
of the dp x cp plane (ep must divide dp * cp), as in Megatron, DeepSpeed-MoE
and GShard. Why: an MoE layer's all-to-all only makes sense between ranks
holding *different* tokens. Ranks that differ only in an ep coordinate of
their own would hold the same tokens and run every dense layer twice; ranks
of the dp x cp plane already hold different tokens (other sequences, or
other parts of them). So the experts are split over ep of them, each expert
is replicated dp*cp/ep times instead of dp*cp times, and the dense layers are
untouched. Within a (tp, pp) position, plane rank j = dp_rank * cp + cp_rank:

    ep group:  ranks with the same j // ep   (consecutive: neighbours, like cp)
    edp group: ranks with the same j % ep    (hold the same experts)

Gradients: a dense parameter is replicated over the whole dp x cp plane and
averaged over `dp_cp_group`; an expert already sums the contributions of
every token of its ep group, so it is summed over `edp_group` (the replicas
of the same experts) and divided by dp * cp like the dense ones.

Every rank creates every group, in the same order, because
torch.distributed.new_group is itself collective over the world: a rank that
skipped one would leave the others waiting. Identical rank lists (cp = 1
makes dp_cp equal dp) are created once, and a mesh built again in the same
processes reuses them (dt.transport.shared_group). Creating a group moves no
dt traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from dt.parallel.grid import Grid
from dt.parallel.pipeline.p2p import header_groups
from dt.transport import shared_group

__all__ = ["Mesh", "grid_of", "mesh", "mesh_groups"]

KINDS = ("tp", "cp", "dp", "pp", "dp_cp", "ep", "edp", "embed")


@dataclass
class Mesh:
    """This rank's place in a dp x cp x tp x pp grid (ep folded into dp x cp) and its groups."""

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
    # First and last pipeline stage of this (dp, cp, tp) column: a tied word
    # embedding lives on both, and their gradients are summed over this group.
    embed_group: Any = None
    embed_ranks: tuple[int, ...] = ()
    cp: int = 1
    ep: int = 1
    cp_rank: int = 0
    ep_rank: int = 0
    groups: dict[str, tuple[Any, tuple[int, ...]]] = field(default_factory=dict, repr=False)
    # The pipeline's shape headers travel on groups of their own (see
    # dt.parallel.pipeline.p2p): this rank's, by pipeline boundary.
    pp_headers: dict[int, Any] = field(default_factory=dict, repr=False)
    all_groups: dict[str, list[tuple[int, ...]]] = field(default_factory=dict, repr=False)

    def group(self, kind: str) -> Any:
        """This rank's process group of `kind` (one of KINDS)."""
        return self.groups[kind][0]

    def ranks(self, kind: str) -> tuple[int, ...]:
        """The global ranks of this rank's group of `kind`, in group order."""
        return self.groups[kind][1]

    cp_group = property(lambda self: self.group("cp"))
    ep_group = property(lambda self: self.group("ep"))
    edp_group = property(lambda self: self.group("edp"))
    dp_cp_group = property(lambda self: self.group("dp_cp"))

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

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

    def coords(self) -> tuple[int, int, int, int, int]:
        """(dp_rank, tp_rank, pp_rank, cp_rank, ep_rank)."""
        return (self.dp_rank, self.tp_rank, self.pp_rank, self.cp_rank, self.ep_rank)

    def sizes(self) -> dict[str, int]:
        return {"dp": self.dp, "cp": self.cp, "ep": self.ep, "tp": self.tp, "pp": self.pp}


# The mesh's group kinds, as the grid's axes (ep and edp: the grid's split of the dp x cp plane).
AXES = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "pp": ("pp",), "dp_cp": ("dp", "cp"),
        "ep": ("ep",), "edp": ("edp",)}


def grid_of(dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1, tp_across: bool = False,
            rank: int | None = None) -> Grid:
    """The mesh as a Grid: pp, dp, cp, tp outermost first (tp_across: tp outermost)."""
    return Grid({"pp": pp, "dp": dp, "cp": cp, "tp": tp}, order="tp-across" if tp_across else "tp-inside",
                ep=ep, rank=rank)


def mesh_groups(dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1,
                tp_across: bool = False) -> dict[str, list[tuple[int, ...]]]:
    """Every group of the grid as lists of global ranks, in creation order."""
    grid = grid_of(dp, tp, pp, cp, ep, tp_across, rank=0)
    out = {kind: grid.groups(*axes) for kind, axes in AXES.items()}
    # First and last stage of each pipeline: a tied word embedding lives on both.
    out["embed"] = [tuple(sorted({g[0], g[-1]})) for g in grid.groups("pp")]
    return out


def mesh(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, tp_across: bool = False) -> Mesh:
    """Build the dp x cp x tp x pp process groups (and ep's, within dp x cp) on the current world.

    tp_across: tp outermost (Grid's "tp-across"), its groups spread over hosts; the default
    keeps them inside one (torchrun numbers each host's ranks contiguously).

    Collective over the whole world (every rank must call it with the same
    sizes). Raises ValueError when dp * cp * tp * pp is not the world size or
    ep does not divide dp * cp.
    """
    if not dist.is_initialized():
        raise RuntimeError("dt.mesh needs torch.distributed initialised (dt.launcher.launch / torchrun)")
    world, me = dist.get_world_size(), dist.get_rank()
    if min(dp, cp, tp, pp, ep) < 1 or dp * cp * tp * pp != world:
        raise ValueError(f"dp * cp * tp * pp = {dp} * {cp} * {tp} * {pp} = {dp * cp * tp * pp} must "
                         f"equal the world size {world}, each at least 1")
    if (dp * cp) % ep:
        raise ValueError(f"ep = {ep} must divide dp * cp = {dp * cp}: expert parallelism spreads the "
                         "experts over ranks of the data x context plane (see dt.parallel.mesh)")
    groups = mesh_groups(dp, tp, pp, cp, ep, tp_across)
    at = grid_of(dp, tp, pp, cp, ep, tp_across, rank=me).coords()
    made: dict[tuple[int, ...], Any] = {}
    mine: dict[str, tuple[Any, tuple[int, ...]]] = {}
    for kind in KINDS:
        for ranks in groups[kind]:
            if ranks not in made:
                made[ranks] = shared_group(ranks, "mesh")  # every rank, every group, same order
            if me in ranks:
                mine[kind] = (made[ranks], ranks)
    pp_headers = header_groups(groups["pp"])
    dp_rank, tp_rank, pp_rank, cp_rank = at["dp"], at["tp"], at["pp"], at["cp"]
    return Mesh(dp=dp, tp=tp, pp=pp, rank=me, dp_rank=dp_rank, tp_rank=tp_rank, pp_rank=pp_rank,
                dp_group=mine["dp"][0], tp_group=mine["tp"][0], pp_group=mine["pp"][0],
                dp_ranks=mine["dp"][1], tp_ranks=mine["tp"][1], pp_ranks=mine["pp"][1],
                embed_group=mine.get("embed", (None, ()))[0], embed_ranks=mine.get("embed", (None, ()))[1],
                cp=cp, ep=ep, cp_rank=cp_rank, ep_rank=at["ep"], groups=mine,
                pp_headers=pp_headers, all_groups=groups)
