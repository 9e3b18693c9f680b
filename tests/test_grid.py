"""The named grid (dt.parallel.grid) against the hand-written mesh it replaced.

For every layout the mesh's tests cover, tp inside and tp across: the same
rank at the same coordinates, and the same groups (members and their order)
for every kind, expert parallel's split of the dp x cp plane included. The
mesh's own per-axis formulas (rank_of, coords_of, layout) live on here only,
as the reference: dt.parallel.mesh is now a view over the grid.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from dt.parallel.grid import Grid
from dt.parallel.mesh import mesh_groups


def rank_of(dp_rank: int, tp_rank: int, pp_rank: int, dp: int, tp: int, cp_rank: int = 0,
            cp: int = 1, tp_across: bool = False, pp: int = 1) -> int:
    """The old mesh's numbering: tp innermost, then cp, dp, pp (tp_across: tp outermost)."""
    inner = (pp_rank * dp + dp_rank) * cp + cp_rank
    return tp_rank * (dp * cp * pp) + inner if tp_across else inner * tp + tp_rank


def coords_of(rank: int, dp: int, tp: int, pp: int, cp: int = 1,
              tp_across: bool = False) -> tuple[int, int, int, int]:
    """(dp_rank, tp_rank, pp_rank, cp_rank): rank_of's inverse."""
    if tp_across:
        tp_rank, rest = divmod(rank, dp * cp * pp)
    else:
        rest, tp_rank = divmod(rank, tp)
    rest, cp_rank = divmod(rest, cp)
    pp_rank, dp_rank = divmod(rest, dp)
    return dp_rank, tp_rank, pp_rank, cp_rank


def layout(dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1,
           tp_across: bool = False) -> dict[str, list[tuple[int, ...]]]:
    """The old mesh's groups, one hand-written comprehension per kind."""
    R = lambda d, c, t, p: rank_of(d, t, p, dp, tp, c, cp, tp_across, pp)  # noqa: E731
    planes = [(t, p) for p in range(pp) for t in range(tp)]  # one dp x cp plane per (tp, pp)
    plane = [(d, c) for d in range(dp) for c in range(cp)]  # j = d * cp + c
    return {
        "tp": [tuple(R(d, c, t, p) for t in range(tp)) for p in range(pp) for d, c in plane],
        "cp": [tuple(R(d, c, t, p) for c in range(cp)) for t, p in planes for d in range(dp)],
        "dp": [tuple(R(d, c, t, p) for d in range(dp)) for t, p in planes for c in range(cp)],
        "pp": [tuple(R(d, c, t, p) for p in range(pp)) for d, c in plane for t in range(tp)],
        "dp_cp": [tuple(R(d, c, t, p) for d, c in plane) for t, p in planes],
        "ep": [tuple(R(*plane[j], t, p) for j in range(g * ep, (g + 1) * ep))
               for t, p in planes for g in range(dp * cp // ep)],
        "edp": [tuple(R(*plane[j], t, p) for j in range(e, dp * cp, ep))
                for t, p in planes for e in range(ep)],
        "embed": [tuple(sorted({R(d, c, t, 0), R(d, c, t, pp - 1)})) for d, c in plane for t in range(tp)],
    }

# (dp, cp, ep, tp, pp): tests/test_mesh_train.py's, test_moe_cp_train.py's and
# test_placement.py's meshes.
MESHES = sorted({(2, 1, 1, 2, 2), (1, 1, 1, 2, 4), (4, 1, 1, 1, 2), (8, 1, 1, 1, 1), (1, 1, 1, 8, 1),
                 (2, 1, 1, 1, 4), (2, 2, 2, 2, 1), (1, 4, 4, 1, 2), (2, 2, 4, 1, 2), (4, 2, 8, 1, 1),
                 (1, 2, 1, 2, 2), (2, 2, 2, 2, 1)}
                | {(dp, cp, 1, tp, pp) for dp, tp, pp, cp in itertools.product((1, 2, 3), (1, 2), (1, 2),
                                                                                (1, 2))})
# The mesh's group kinds, as axis names.
KINDS = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "pp": ("pp",), "dp_cp": ("dp", "cp"),
         "ep": ("ep",), "edp": ("edp",)}


def _grid(dp: int, cp: int, ep: int, tp: int, pp: int, across: bool) -> Grid:
    return Grid({"pp": pp, "dp": dp, "cp": cp, "tp": tp}, order="tp-across" if across else None, ep=ep)


@pytest.mark.parametrize("across", [False, True], ids=["tp-inside", "tp-across"])
@pytest.mark.parametrize("dims", MESHES, ids=str)
def test_grid_numbers_and_groups_ranks_as_the_mesh_does(dims, across):
    dp, cp, ep, tp, pp = dims
    grid = _grid(*dims, across)
    assert grid.world == dp * cp * tp * pp
    for r in range(grid.world):
        c = grid.coords(r)
        assert (c["dp"], c["tp"], c["pp"], c["cp"]) == coords_of(r, dp, tp, pp, cp, across)
        assert grid.rank_at(c) == rank_of(c["dp"], c["tp"], c["pp"], dp, tp, c["cp"], cp, across, pp) == r
        assert c["ep"] == (c["dp"] * cp + c["cp"]) % ep  # the mesh's ep_rank
    mesh = layout(dp, tp, pp, cp, ep, tp_across=across)
    for kind, axes in KINDS.items():
        assert sorted(grid.groups(*axes)) == sorted(mesh[kind]), kind
        for r in range(grid.world):  # every coordinate is the rank's place in its group
            c = grid.coords(r)
            place = c[axes[0]] if len(axes) == 1 else c["dp"] * cp + c["cp"]
            assert grid.ranks(*axes, rank=r)[place] == r
    # The mesh's tied-embedding group: the first and last stage of this rank's pipeline.
    embed = sorted({tuple(sorted({g[0], g[-1]})) for g in grid.groups("pp")})
    assert embed == sorted(set(mesh["embed"]))
    # dt.parallel.mesh, now built on the grid, still makes the old mesh's groups.
    view = mesh_groups(dp, tp, pp, cp, ep, tp_across=across)
    assert {k: sorted(v) for k, v in view.items()} == {k: sorted(v) for k, v in mesh.items()}


def test_grid_by_hand():
    grid = Grid({"pp": 2, "dp": 2, "cp": 1, "tp": 2}, rank=5)
    assert grid.coords() == {"pp": 1, "dp": 0, "cp": 0, "tp": 1, "ep": 0, "edp": 0}
    assert grid.ranks("tp") == (4, 5) and grid.ranks("dp") == (5, 7) and grid.ranks("pp") == (1, 5)
    assert grid.ranks("dp", "tp") == (4, 5, 6, 7) and grid.ranks("tp", "dp") == (4, 6, 5, 7)
    assert grid.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert grid.numbering.tolist() == torch.arange(8).reshape(2, 2, 1, 2).tolist()
    moe = Grid({"dp": 4, "tp": 2}, ep=2, rank=2)  # plane (0, 2, 4, 6) at tp 0
    assert moe.ranks("ep") == (0, 2) and moe.ranks("edp") == (2, 6) and moe.size("edp") == 2
    assert Grid({"dp": 2, "tp": 2}, order=("tp", "dp")).groups("tp") == [(0, 2), (1, 3)]


def test_grid_refuses_bad_input_in_one_line():
    cases = [(lambda: Grid({"dp": 0}), "integer >= 1"),
             (lambda: Grid({}), "at least one axis"),
             (lambda: Grid({"dp": 3, "cp": 1}, ep=2), "must divide dp \\* cp = 3"),
             (lambda: Grid({"dp": 2}, order="sideways"), "unknown layout 'sideways'"),
             (lambda: Grid({"dp": 2, "tp": 2}, order=("dp",)), "must name each axis"),
             (lambda: Grid({"dp": 2, "ep": 2}), "not axes but splits"),
             (lambda: Grid({"dp": 2}, rank=0).ranks("tp"), "no axis \\['tp'\\]"),
             (lambda: Grid({"dp": 2}, rank=0).ranks("ep", "dp"), "asked for alone"),
             (lambda: Grid({"dp": 2}, rank=2).coords(), "outside the grid's world of 2"),
             (lambda: Grid({"dp": 2}).rank_at({"dp": 2}), "outside 0..1"),
             (lambda: Grid({"dp": 4}, ep=2).rank_at({"dp": 1, "ep": 0}), "disagree with dp, cp's")]
    for make, words in cases:
        with pytest.raises(ValueError, match=words) as e:
            make()
        assert "\n" not in str(e.value)


def _groups_on_the_wire(cases: list[tuple[dict, int]]) -> list[str]:
    """Each group's members found by an all-reduce over it; the cache; the mesh's groups shared."""
    import dt

    me = torch.distributed.get_rank()
    bad = []
    for sizes, ep in cases:
        grid = Grid(sizes, ep=ep)
        for axes in [(a,) for a in sizes] + [("dp", "cp"), ("ep",), ("edp",)]:
            onehot = torch.zeros(grid.world, dtype=torch.int64)
            onehot[me] = 1
            dt.all_reduce(onehot, group=grid.group(*axes))
            members = tuple(onehot.nonzero().flatten().tolist())
            if members != tuple(sorted(grid.ranks(*axes))) or grid.group(*axes) is not grid.group(*axes):
                bad.append(f"{sizes} rank {me}: {axes} reached {members}, not {grid.ranks(*axes)}")
        m = dt.mesh(dp=sizes["dp"], cp=sizes["cp"], tp=sizes["tp"], pp=sizes["pp"], ep=ep)
        if grid.group("dp", "cp") is not m.dp_cp_group or grid.group("ep") is not m.ep_group:
            bad.append(f"{sizes} rank {me}: the grid made its own copy of a mesh group")
    return bad


def test_grid_groups_reach_their_members(run):
    cases = [({"pp": 1, "dp": 2, "cp": 1, "tp": 2}, 2), ({"pp": 2, "dp": 1, "cp": 2, "tp": 1}, 2)]
    assert [b for r in run(4, _groups_on_the_wire, cases) for b in r] == []


def test_group_needs_a_world_of_its_size():
    with pytest.raises(RuntimeError, match="world of 4"):
        Grid({"dp": 4}, rank=0).group("dp")
