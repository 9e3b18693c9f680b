"""The named grid: ranks numbered from one reshaped arange, groups asked for by axis names.

    grid = Grid({"pp": 2, "dp": 2, "cp": 1, "tp": 2})      # world 8, tp innermost
    grid.coords(5)                 # {"pp": 1, "dp": 0, "cp": 0, "tp": 1}
    grid.ranks("dp", "cp")         # this rank's dp x cp plane, dp major: (1, 3) on rank 1
    grid.group("tp")               # a dt process group, made once (every rank must ask)
    Grid({"pp": 2, "dp": 2, "tp": 2}, order="tp-across")   # tp outermost, to compare

Numbering: rank = arange(world).reshape(sizes in `order`)[coordinates]. The
order is outermost first; by default the mapping's own order, and the layouts
dt knows by name are ORDERS' (Megatron's: tp innermost, where it talks most,
so a host's consecutive ranks hold a whole tp group; see dt.parallel.mesh).

A group along some axes is the ranks that agree on every other axis, listed
with the first axis named as the major one: ranks("dp", "cp") holds
dp_rank * cp + cp_rank at position j.

Expert parallelism is a split of the dp x cp plane, not an axis of its own
(ep must divide dp * cp; why: dt.parallel.mesh). With plane position
j = dp_rank * cp + cp_rank, "ep" is the group of the same j // ep (consecutive
plane ranks, which hold different tokens) and "edp" the group of the same
j % ep (the replicas of the same experts). They are asked for alone:
grid.ranks("ep"), grid.group("edp"); coords() gives their positions too.

Every coordinate is a rank's position in its group: coords(r)[a] is the index
of r in ranks(a, rank=r), for every axis, ep and edp included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dt.transport import shared_group

__all__ = ["EXPERT_PLANE", "GRADIENT_SYNC", "ORDERS", "Grid"]

# The layouts known by name: axes outermost first (names not in the grid are skipped).
ORDERS: dict[str, tuple[str, ...]] = {
    "tp-inside": ("pp", "dp", "cp", "tp"),
    "tp-across": ("tp", "pp", "dp", "cp"),
}
# The groups the gradient thread syncs on (DDP's buckets, ZeRO 2's reduce-scatters): process groups
# of their own even where another axis has the same ranks (dp 1 x cp 2: the cp pair), so that thread's
# messages never share a stream with the main thread's (ring attention's, in the same backward).
GRADIENT_SYNC = "gradients"
EXPERT_PLANE = ("dp", "cp")  # the axes experts split, dp major
SPLITS = ("ep", "edp")  # the groups carved out of the plane


class Grid:
    """A world of prod(sizes) ranks as a named grid, and its process groups by axis name."""

    def __init__(self, sizes: Mapping[str, int], order: str | Sequence[str] | None = None, ep: int = 1,
                 rank: int | None = None):
        if not sizes:
            raise ValueError("Grid needs at least one axis, e.g. Grid({'dp': 2, 'tp': 2})")
        bad = {name: n for name, n in sizes.items() if not isinstance(n, int) or n < 1}
        if bad:
            raise ValueError(f"Grid: every axis size must be an integer >= 1, got {bad}")
        if any(name in SPLITS for name in sizes):
            raise ValueError(f"Grid: {SPLITS} are not axes but splits of the dp x cp plane: pass ep=")
        if isinstance(order, str):
            if order not in ORDERS:
                raise ValueError(f"Grid: unknown layout {order!r}; known: {', '.join(ORDERS)}")
            order = [a for a in ORDERS[order] if a in sizes] + [a for a in sizes if a not in ORDERS[order]]
        order = tuple(sizes) if order is None else tuple(order)
        if sorted(order) != sorted(sizes):
            raise ValueError(f"Grid: order {order} must name each axis of {tuple(sizes)} once")
        self.names = order
        self.sizes = {name: sizes[name] for name in order}
        self.world = math.prod(self.sizes.values())
        self.numbering = torch.arange(self.world).reshape(tuple(self.sizes.values()))  # host: arithmetic
        self.plane = math.prod(self.sizes.get(a, 1) for a in EXPERT_PLANE)
        if ep < 1 or self.plane % ep:
            raise ValueError(f"Grid: ep = {ep} must divide dp * cp = {self.plane}: expert parallelism "
                             "splits the data x context plane (see dt.parallel.grid)")
        self.ep = ep
        if rank is None and dist.is_initialized():
            rank = dist.get_rank()
        self.rank = rank
        self._groups: dict[tuple[str, ...], Any] = {}

    def __repr__(self) -> str:
        split = f", ep={self.ep}" if self.ep > 1 else ""
        return f"Grid({self.sizes}{split})"

    def size(self, *axes: str) -> int:
        """How many ranks a group along `axes` holds."""
        self._check(axes)
        if axes and axes[0] in SPLITS:
            return self.ep if axes[0] == "ep" else self.plane // self.ep
        return math.prod(self.sizes[a] for a in axes)

    def rank_at(self, coords: Mapping[str, int]) -> int:
        """The global rank at these coordinates (axes left out are at 0).

        ep and edp may be given too (coords()'s output reads back) but follow from dp and cp.
        """
        unknown = set(coords) - set(self.names) - set(SPLITS)
        if unknown:
            raise ValueError(f"Grid: no axis {sorted(unknown)}; the axes are {self.names}")
        index = []
        for name in self.names:
            at = coords.get(name, 0)
            if not 0 <= at < self.sizes[name]:
                raise ValueError(f"Grid: {name} coordinate {at} is outside 0..{self.sizes[name] - 1}")
            index.append(at)
        rank = int(self.numbering[tuple(index)])
        implied = self.coords(rank)
        clash = {a: coords[a] for a in SPLITS if a in coords and coords[a] != implied[a]}
        if clash:
            raise ValueError(f"Grid: {clash} disagree with dp, cp's {({a: implied[a] for a in clash})}")
        return rank

    def coords(self, rank: int | None = None) -> dict[str, int]:
        """Every axis' coordinate of `rank` (default this one), then its ep and edp positions."""
        rank = self._rank(rank)
        out: dict[str, int] = {}
        for name in reversed(self.names):  # the arange's row-major order: last axis fastest
            rank, out[name] = divmod(rank, self.sizes[name])
        out = {name: out[name] for name in self.names}
        j = self._plane_index(out)
        out["ep"], out["edp"] = j % self.ep, j // self.ep
        return out

    def ranks(self, *axes: str, rank: int | None = None) -> tuple[int, ...]:
        """The group along `axes` that holds `rank` (default this rank), first axis major."""
        rank = self._rank(rank)
        return next(g for g in self.groups(*axes) if rank in g)

    def groups(self, *axes: str) -> list[tuple[int, ...]]:
        """Every group along `axes`, in one order every rank computes alike."""
        self._check(axes)
        if axes and axes[0] in SPLITS:
            return self._splits(axes[0])
        rest = [a for a in self.names if a not in axes]
        arranged = self.numbering.permute([self.names.index(a) for a in (*rest, *axes)])
        return [tuple(row) for row in arranged.reshape(-1, self.size(*axes)).tolist()]

    def group(self, *axes: str, purpose: str = "mesh") -> Any:
        """This rank's process group along `axes`, made once per grid and cached.

        Collective over the world, as torch.distributed.new_group is: the first
        call for some axes makes all their groups, in the same order on every rank,
        so every rank must make it. Identical rank lists (dt.mesh's included) share
        one process group (dt.transport.shared_group) unless their `purpose`
        differs: GRADIENT_SYNC's groups are the gradient thread's alone.
        """
        key = (*axes, purpose)
        if key not in self._groups:
            if not dist.is_initialized() or dist.get_world_size() != self.world:
                have = dist.get_world_size() if dist.is_initialized() else "no process group"
                raise RuntimeError(f"Grid.group needs torch.distributed on a world of {self.world}, "
                                   f"found {have}")
            mine = self.ranks(*axes)
            made = None
            for ranks in self.groups(*axes):  # every rank, every group, the same order
                pg = shared_group(ranks, purpose)
                made = pg if ranks == mine else made
            self._groups[key] = made
        return self._groups[key]

    def _rank(self, rank: int | None) -> int:
        rank = self.rank if rank is None else rank
        if rank is None:
            raise ValueError("Grid: which rank? torch.distributed is not initialised: pass rank=")
        if not 0 <= rank < self.world:
            raise ValueError(f"Grid: rank {rank} is outside the grid's world of {self.world}")
        return rank

    def _check(self, axes: Sequence[str]) -> None:
        if len(set(axes)) != len(axes):
            raise ValueError(f"Grid: axes {axes} name one axis twice")
        if any(a in SPLITS for a in axes):
            if len(axes) != 1:
                raise ValueError(f"Grid: {' and '.join(SPLITS)} are asked for alone, got {axes}")
            return
        unknown = [a for a in axes if a not in self.sizes]
        if unknown:
            raise ValueError(f"Grid: no axis {unknown}; the axes are {self.names} (and ep, edp)")

    def _plane_index(self, coords: Mapping[str, int]) -> int:
        j = 0
        for a in EXPERT_PLANE:
            j = j * self.sizes.get(a, 1) + coords.get(a, 0)
        return j

    def _splits(self, kind: str) -> list[tuple[int, ...]]:
        plane_axes = [a for a in EXPERT_PLANE if a in self.sizes]
        planes = self.groups(*plane_axes)  # each row: the plane at one position of the other axes
        ep = self.ep
        if kind == "ep":  # same j // ep: consecutive plane ranks
            return [p[g * ep:(g + 1) * ep] for p in planes for g in range(self.plane // ep)]
        return [p[e::ep] for p in planes for e in range(ep)]  # same j % ep: the same experts
