"""The GPT with mixture-of-experts blocks and context parallelism, on 5-D meshes, against one process.

The five-dimensional mesh's groups are checked by membership (an all-reduce
of one-hot vectors over each group); then the GPT, with MoE blocks (top-2, a
capacity that drops tokens) and context parallelism (ring attention and
Ulysses), trains on several meshes of 8 ranks in float64 and must follow the
single-process loss trajectory, every rank reporting the same loss.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import dt
from dt import train
from dt.parallel.mesh import mesh_groups

# 6 steps: the resumed runs start at the step-4 checkpoint, and the reference learns by then
# (MoE 3.78 -> 3.60, dense 3.79 -> 3.57)
STEPS = 6
MOE = {"experts": 4, "top_k": 2, "capacity_factor": 1.0, "aux_loss_coef": 0.05}


def _args(dp: int, cp: int, ep: int, tp: int, pp: int, **kw: object) -> object:
    argv = ["--dp", str(dp), "--cp", str(cp), "--ep", str(ep), "--tp", str(tp), "--pp", str(pp),
            "--steps", str(STEPS), "--batch-size", "4", "--block-size", "12", "--n-layer", "2",
            "--n-head", "4", "--n-embd", "8", "--dtype", "float64", "--lr", "1e-2", "--no-progress",
            "--threads", "1", "--micro-batches", str(min(2, 4 // dp))]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return train.parse_args(argv)


def _run(runs: list[tuple[tuple[int, ...], dict]]) -> list[tuple[list[float], dict]]:
    out = []
    for mesh, extra in runs:
        res = train.train_worker(_args(*mesh, **extra))
        out.append((res["losses"], res["moe"]))
    return out


RUNS = [  # (dp, cp, ep, tp, pp), options
    ((2, 2, 2, 2, 1), MOE),
    ((1, 4, 2, 1, 2), {**MOE, "cp_attention": "ulysses"}),
    ((2, 2, 4, 1, 2), MOE),
    ((4, 2, 8, 1, 1), MOE),  # 4 experts over 8 ranks: half the ranks hold none
    ((2, 4, 1, 1, 1), {"cp_attention": "ulysses"}),  # dense, context parallel only
]


@pytest.mark.timeout(240)
def test_moe_and_context_parallel_meshes_follow_the_single_process_trajectory(run):
    (moe_ref, moe_stats), (dense_ref, _) = run(1, _run, [((1, 1, 1, 1, 1), MOE), ((1, 1, 1, 1, 1), {})])[0]
    assert moe_ref[-1] < moe_ref[0] - 0.1 and dense_ref[-1] < dense_ref[0] - 0.1  # it learns
    assert moe_stats["dropped"] > 0  # the capacity bites, so drops are part of what must match
    results = run(8, _run, RUNS, timeout=220)
    for k, (mesh, extra) in enumerate(RUNS):
        losses = results[0][k][0]
        want = moe_ref if extra.get("experts") else dense_ref
        diff = max(abs(a - b) for a, b in zip(losses, want))
        assert len(losses) == STEPS and diff < 1e-8, f"{mesh} {extra}: max loss difference {diff}"
        assert all(r[k][0] == losses for r in results)  # every rank reports the same loss
        if extra.get("experts"):  # every token routed and dropped once per tensor-parallel rank
            dropped = sum(r[k][1]["dropped"] for r in results) // mesh[3]
            assert dropped == moe_stats["dropped"], f"{mesh}: {dropped} dropped, one process {moe_stats}"


def _resumed(runs: list[tuple[tuple[int, ...], dict]]) -> list[tuple[int, list[float]]]:
    out = []
    for mesh, extra in runs:
        res = train.train_worker(_args(*mesh, **extra))
        out.append((res["start"], res["losses"]))
    return out


def _copy_step(src: Path, step: int, dst: Path) -> str:
    dst.mkdir()
    shutil.copytree(src / f"step-{step:08d}", dst / f"step-{step:08d}")
    return str(dst)


@pytest.mark.timeout(240)
def test_a_checkpoint_of_experts_and_context_resumes_on_other_meshes(run, tmp_path):
    """Experts are saved under their global index: ep 2 -> ep 4 (Ulysses, 2 stages) and -> 1 process."""
    a = tmp_path / "a"
    ((_, straight),) = run(8, _resumed, [((2, 2, 2, 2, 1), {**MOE, "checkpoint": a, "save_every": 4})],
                           timeout=200)[0]
    b, c = _copy_step(a, 4, tmp_path / "b"), _copy_step(a, 4, tmp_path / "c")
    on8 = run(8, _resumed, [((1, 4, 4, 1, 2), {**MOE, "checkpoint": b, "cp_attention": "ulysses"})],
              timeout=200)[0]
    on1 = run(1, _resumed, [((1, 1, 1, 1, 1), {**MOE, "checkpoint": c})])[0]
    for start, losses in on8 + on1:
        assert start == 4 and max(abs(x - y) for x, y in zip(losses, straight[4:])) < 1e-8, losses


def _mesh_checks(meshes: list[tuple[int, int, int, int, int]]) -> list[str]:
    """Coordinates and group members (found by an all-reduce over each group) on 5-D meshes."""
    me = torch.distributed.get_rank()
    bad = []
    for dp, cp, ep, tp, pp in meshes:
        m = dt.mesh(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
        every = mesh_groups(dp, tp, pp, cp, ep)
        if ((m.pp_rank * dp + m.dp_rank) * cp + m.cp_rank) * tp + m.tp_rank != me:  # tp innermost
            bad.append(f"{(dp, cp, ep, tp, pp)}: rank {me} at {m.coords()}")
        for kind in ("tp", "cp", "dp", "pp", "dp_cp", "ep", "edp"):
            onehot = torch.zeros(8, dtype=torch.int64)
            onehot[me] = 1
            dt.all_reduce(onehot, group=m.group(kind))
            members = tuple(onehot.nonzero().flatten().tolist())
            if members != tuple(sorted(m.ranks(kind))) or m.ranks(kind) not in every[kind]:
                bad.append(f"{(dp, cp, ep, tp, pp)} rank {me}: {kind} group {members} vs {m.ranks(kind)}")
        if len(m.ranks("ep")) != ep or m.ranks("ep")[m.ep_rank] != me:
            bad.append(f"{(dp, cp, ep, tp, pp)} rank {me}: ep rank {m.ep_rank} of {m.ranks('ep')}")
        if len(m.ranks("edp")) * ep != dp * cp or len(m.ranks("dp_cp")) != dp * cp:
            bad.append(f"{(dp, cp, ep, tp, pp)} rank {me}: edp {m.ranks('edp')}")
    for wrong in ({"dp": 2, "cp": 2, "tp": 1, "pp": 1}, {"dp": 2, "cp": 2, "ep": 3, "tp": 2}):
        try:
            dt.mesh(**wrong)
            bad.append(f"{wrong} accepted on a world of 8")
        except ValueError:
            pass
    return bad


def test_five_dimensional_mesh_groups(run):
    meshes = [(2, 2, 2, 2, 1), (1, 4, 4, 1, 2), (2, 2, 4, 1, 2), (4, 2, 8, 1, 1), (1, 2, 1, 2, 2)]
    assert [b for r in run(8, _mesh_checks, meshes) for b in r] == []
    groups = mesh_groups(2, 2, 1, cp=2, ep=2)  # tp innermost, then cp: cp pairs are tp-strided
    assert {(0, 2), (4, 6)} <= set(groups["cp"]) and groups["tp"][:2] == [(0, 1), (2, 3)]
    assert groups["ep"][:2] == [(0, 2), (4, 6)] and groups["edp"][:2] == [(0, 4), (2, 6)]
    assert groups["dp_cp"][0] == (0, 2, 4, 6)


def test_cli_refuses_meshes_that_do_not_fit(capsys):
    cases = [(["--dp", "2", "--ep", "4", "--experts", "4"], "must divide dp * cp"),
             (["--dp", "2", "--ep", "2"], "needs --experts"),
             (["--cp", "4", "--block-size", "6"], "too short for --cp 4"),
             (["--cp", "3", "--cp-attention", "ulysses"], "divisible by tp * cp = 3")]
    for argv, why in cases:
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert why in capsys.readouterr().err, argv
