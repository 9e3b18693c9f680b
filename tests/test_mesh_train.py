"""The mesh's groups, the GPT on dp x tp x pp meshes against one process, checkpoints."""

from __future__ import annotations

import os

import pytest
import torch

import dt
from dt import train
from dt.parallel.checkpoint import read_full
from dt.parallel.mesh import mesh_groups

# 8 steps: a wrong gradient shows from step 2, and the reference still learns (3.80 -> 3.20 by step 8)
STEPS = 8


def _args(dp: int, tp: int, pp: int, **kw: object) -> object:
    argv = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--steps", str(STEPS),
            "--batch-size", "8", "--block-size", "8", "--n-layer", "2", "--n-head", "4",
            "--n-embd", "16", "--dtype", "float64", "--lr", "1e-2", "--no-progress", "--threads", "1",
            "--micro-batches", str(min(2, 8 // dp))]  # 2 < pp = 4 too: fewer micro-batches than stages
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return train.parse_args(argv)


def _losses(runs: list[tuple[int, int, int, dict]]) -> list[list[float]]:
    """This rank's loss trajectory for each (dp, tp, pp, extra options)."""
    return [train.train_worker(_args(dp, tp, pp, **extra))["losses"] for dp, tp, pp, extra in runs]


def test_reference_and_meshes_follow_the_same_trajectory(run):
    ref, ref_untied = run(1, _losses, [(1, 1, 1, {}), (1, 1, 1, {"untied": True})])[0]
    assert ref[-1] < ref[0] - 0.2  # it learns
    runs = [(2, 2, 2, {}), (1, 2, 4, {}), (4, 1, 2, {}), (8, 1, 1, {}),
            (2, 2, 2, {"schedule": "gpipe"}), (4, 1, 2, {"schedule": "interleaved", "virtual": 2}),
            (1, 2, 4, {"untied": True})]
    results = run(8, _losses, runs, timeout=240)
    for k, what in enumerate(runs):
        losses = results[0][k]
        assert len(losses) == STEPS
        want = ref_untied if what[3].get("untied") else ref
        diff = max(abs(a - b) for a, b in zip(losses, want))
        assert diff < 1e-4, f"{what}: max loss difference {diff}"
        assert all(r[k] == losses for r in results)  # every rank reports the same loss


def _mesh_checks(meshes: list[tuple[int, int, int]]) -> list[str]:
    """Coordinates, group members (found by an all-reduce over each group), neighbours."""
    me = torch.distributed.get_rank()
    bad = []
    for dp, tp, pp in meshes:
        m = dt.mesh(dp=dp, tp=tp, pp=pp)
        if (m.pp_rank * dp + m.dp_rank) * tp + m.tp_rank != me or m.rank != me:  # tp innermost
            bad.append(f"{(dp, tp, pp)}: rank {me} at {m.coords()}")
        for name, group, ranks in (("dp", m.dp_group, m.dp_ranks), ("tp", m.tp_group, m.tp_ranks),
                                   ("pp", m.pp_group, m.pp_ranks)):
            onehot = torch.zeros(8, dtype=torch.int64)
            onehot[me] = 1
            dt.all_reduce(onehot, group=group)
            members = tuple(onehot.nonzero().flatten().tolist())
            if members != tuple(sorted(ranks)) or ranks not in mesh_groups(dp, tp, pp)[name]:
                bad.append(f"{(dp, tp, pp)} rank {me}: {name} group {members} vs {ranks}")
        if m.tp_ranks != tuple(range(me - m.tp_rank, me - m.tp_rank + tp)):
            bad.append(f"{(dp, tp, pp)}: tp ranks {m.tp_ranks} are not contiguous")
        want_prev = me - dp * tp if m.pp_rank > 0 else None
        want_next = me + dp * tp if m.pp_rank < pp - 1 else None
        if (m.prev_rank, m.next_rank) != (want_prev, want_next):
            bad.append(f"{(dp, tp, pp)} rank {me}: neighbours {(m.prev_rank, m.next_rank)}")
    try:
        dt.mesh(dp=3, tp=1, pp=2)
        bad.append("3 x 1 x 2 on a world of 8 accepted")
    except ValueError:
        pass
    return bad


def test_mesh_coordinates_and_groups(run):
    results = run(8, _mesh_checks, [(2, 2, 2), (1, 2, 4), (4, 1, 2), (8, 1, 1), (1, 8, 1), (2, 1, 4)])
    assert [b for r in results for b in r] == []
    # the layout itself: Megatron's order, tp innermost
    groups = mesh_groups(2, 2, 2)
    assert groups["tp"][:2] == [(0, 1), (2, 3)]
    assert groups["dp"][:2] == [(0, 2), (1, 3)]
    assert groups["pp"][:2] == [(0, 4), (1, 5)]


def _checkpoint_round_trip(path: str) -> tuple[list[float], list[float], list[float]]:
    straight = train.train_worker(_args(2, 2, 2, steps=4))["losses"]
    first = train.train_worker(_args(2, 2, 2, steps=2, checkpoint=path))["losses"]
    resumed = train.train_worker(_args(2, 2, 2, steps=4, checkpoint=path))
    assert resumed["start"] == 2
    return straight, first, resumed["losses"]


def test_checkpoint_round_trip(run, tmp_path):
    path = str(tmp_path / "gpt.pt")
    straight, first, resumed = run(8, _checkpoint_round_trip, path)[0]
    assert first == straight[:2]
    assert resumed == straight[2:]  # bit for bit: model, optimizer moments and data step restored
    assert sorted(os.listdir(path)) == [".lock", "step-00000002", "step-00000004"]


@pytest.mark.timeout(120)
def test_cli_trains_and_saves(tmp_path, capsys):
    path = str(tmp_path / "ckpt")
    assert train.main(["--pp", "2", "--steps", "3", "--batch-size", "4", "--block-size", "8",
                       "--n-layer", "1", "--n-embd", "16", "--no-progress",
                       "--checkpoint", path]) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "bubble" in out
    manifest, tensors = read_full(os.path.join(path, "step-00000003"))
    assert manifest["step"] == 3 and sorted(manifest["files"]) == ["rank-00000.pt", "rank-00001.pt"]
    assert manifest["layout"]["pp"] == 2 and "optim/layers.0.wte.weight/exp_avg" in tensors


def test_python_m_dt_train_is_the_cli(monkeypatch, capsys):
    """`python -m dt.train` (what torchrun -m runs) is `dt train`: its __main__ run as -m runs it."""
    import runpy

    monkeypatch.setattr("sys.argv", ["dt.train", "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("dt.train", run_name="__main__", alter_sys=True)
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith("usage: dt train") and "torchrun" in out
