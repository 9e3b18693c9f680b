"""Checkpoints: sharded, checked, kept, locked, resharded on load, resumed after a crash.

- the block arithmetic resharding rests on (dt.layout);
- faults, in one process: corrupt, truncated, empty, missing, foreign files are refused in
  one line naming the file, or skipped for the previous good checkpoint with one warning;
  the directory is checked up front; the lock; a failed save leaves nothing behind;
- resharding: `dt train` saved on one mesh resumes on another (dp, tp, pp, ZeRO stage and
  world all change) and follows the uninterrupted run's losses; DDP, ZeRO 1-2 and FSDP
  load each other's checkpoints across world sizes, and ZeRO's and FSDP's state_dict /
  load_state_dict round-trip torch's own optimizer state;
- `dt train` itself: the lock, the fallback, another model, --keep, one-line CLI errors
  with nothing left behind, and an elastic restart under torchrun after a SIGKILL.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dt import train
from dt.layout import flat_blocks, intersect, shard_block, split_sizes
from dt.parallel import checkpoint as ck
from dt.parallel.checkpoint import CheckpointError
from dt.parallel.checkpoint.files import DirectoryLock
from dt.parallel.data_parallel import DistributedDataParallel
from dt.parallel.zero import FullyShardedDataParallel, ZeroOptimizer
from dt.tools.cli import main as dt_main
from dt.train.optim import Adam

ROOT = Path(__file__).resolve().parent.parent


# -- the arithmetic ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 5), (4, 1, 3)])
def test_flat_blocks_cut_any_range_into_contiguous_boxes(shape):
    n = torch.Size(shape).numel()
    full = torch.arange(n).reshape(shape)
    for lo in range(n + 1):
        for hi in range(lo, n + 1):
            boxes = flat_blocks(lo, hi, shape)
            got = [x for o, ln in boxes for x in full[tuple(slice(a, a + b) for a, b in zip(o, ln))]
                   .reshape(-1).tolist()]
            assert got == list(range(lo, hi)), (shape, lo, hi, boxes)
            assert len(boxes) <= max(1, 2 * len(shape) - 1)


def test_shard_blocks_tile_the_tensor_and_intersect():
    shape = (10, 6)
    for dim in (0, 1):
        sizes = split_sizes(shape[dim], 4)
        boxes = [shard_block(shape, dim, sizes, r) for r in range(4)]
        assert sum(torch.Size(b[1]).numel() for b in boxes) == 60
        assert all(intersect(a, b) is None for i, a in enumerate(boxes) for b in boxes[i + 1:] if b[1][dim])
    assert intersect(((0, 0), (4, 6)), ((2, 3), (5, 2))) == ((2, 3), (2, 2))
    assert intersect(((0,), (3,)), ((3,), (2,))) is None


# -- faults, in one process -------------------------------------------------------------------------
def _tiny() -> tuple[nn.Module, Adam]:
    # dt's Adam keeps torch's state layout; torch.optim's first use costs seconds (torch._dynamo)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 2)).double()
    return model, Adam(model.parameters(), lr=1e-2)


def _step(model: nn.Module, opt: Adam) -> None:
    opt.zero_grad()
    model(torch.ones(4, 3, dtype=torch.float64)).square().sum().backward()
    opt.step()


def _two_checkpoints(path: Path) -> tuple[nn.Module, Adam]:
    model, opt = _tiny()
    for step in (1, 2):
        _step(model, opt)
        ck.save(str(path), step, model, opt)
    return model, opt


def _leftovers(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(".step-") or ".tmp" in n)


def _rewrite(step_dir: Path, name: str, data: bytes, update_manifest: bool) -> None:
    (step_dir / name).write_bytes(data)
    if update_manifest:  # a foreign file that the manifest vouches for: only its content can tell
        m = json.loads((step_dir / "manifest.json").read_text())
        m["files"][name] = {"bytes": len(data), "sha256": ck.files.sha256(data)}
        (step_dir / "manifest.json").write_text(json.dumps(m))


def _foreign_torch_file() -> bytes:
    import io

    buf = io.BytesIO()
    torch.save({"weights": torch.zeros(3)}, buf)
    return buf.getvalue()


CORRUPTIONS = {
    # name: (file, new content from the old, manifest updated?, the words of the one-line error)
    "truncated": ("rank-00000.pt", lambda b: b[:len(b) // 3], False, "truncated ({n} of {N} bytes)"),
    "empty": ("rank-00000.pt", lambda b: b"", False, "empty (the manifest says {N} bytes)"),
    "flipped byte": ("rank-00000.pt", lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], False,
                     "corrupt (sha256"),
    "manifest empty": ("manifest.json", lambda b: b"", False, "manifest.json: empty"),
    "manifest truncated": ("manifest.json", lambda b: b[:len(b) // 2], False, "not a dt manifest (not JSON"),
    "foreign manifest": ("manifest.json", lambda b: b'{"format": "torch-dcp"}', False,
                         "not a dt manifest (format 'torch-dcp', expected 'dt-checkpoint')"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_a_bad_latest_falls_back_with_one_warning_and_alone_is_refused_in_one_line(tmp_path, kind):
    model, opt = _two_checkpoints(tmp_path)
    name, corrupt, update, words = CORRUPTIONS[kind]
    bad = tmp_path / "step-00000002" / name
    old = bad.read_bytes()
    new = corrupt(old)
    _rewrite(bad.parent, name, new, update)
    words = words.format(n=len(new), N=len(old))
    fresh, fresh_opt = _tiny()
    loaded = ck.load(str(tmp_path), fresh, fresh_opt)
    assert loaded.step == 1 and len(loaded.warnings) == 1
    (warning,) = loaded.warnings
    assert str(bad) in warning and words in warning and "\n" not in warning
    assert warning.endswith(f"; falling back to {tmp_path / 'step-00000001'}")
    shutil.rmtree(tmp_path / "step-00000001")
    with pytest.raises(CheckpointError) as e:
        ck.load(str(tmp_path), fresh, fresh_opt)
    assert str(e.value).startswith(f"checkpoint file {bad}: ") and words in str(e.value)
    assert "\n" not in str(e.value) and _leftovers(tmp_path) == []


@pytest.mark.parametrize("kind,words", [("missing", "missing"), ("foreign torch file", "has no chunk"),
                                         ("zip garbage", "unreadable (")])
def test_files_the_manifest_vouches_for_but_cannot_be_read_are_refused_in_one_line(tmp_path, kind, words):
    _two_checkpoints(tmp_path)
    step = tmp_path / "step-00000002"
    if kind == "missing":
        (step / "rank-00000.pt").unlink()
    else:
        size = (step / "rank-00000.pt").stat().st_size
        data = _foreign_torch_file() if kind == "foreign torch file" else os.urandom(size)
        _rewrite(step, "rank-00000.pt", data, update_manifest=True)
    shutil.rmtree(tmp_path / "step-00000001")
    with pytest.raises(CheckpointError) as e:
        ck.load(str(tmp_path), *_tiny())
    msg = str(e.value)
    assert str(step / "rank-00000.pt") in msg and words in msg and "\n" not in msg, msg


def test_another_model_is_refused_in_one_line(tmp_path):
    _two_checkpoints(tmp_path)
    wider = nn.Sequential(nn.Linear(3, 6), nn.GELU(), nn.Linear(6, 2)).double()
    with pytest.raises(CheckpointError, match=r"0.weight has shape \(5, 3\) there, \(6, 3\) in this model"):
        ck.load(str(tmp_path), wider)
    other = nn.Sequential(nn.Linear(3, 5)).double()
    other.add_module("head", nn.Linear(5, 2).double())
    with pytest.raises(CheckpointError, match="has no tensor head.weight"):
        ck.load(str(tmp_path), other)


def test_round_trip_keep_and_nothing_left_by_a_failed_save(tmp_path, monkeypatch):
    model, opt = _tiny()
    for step in range(1, 6):
        _step(model, opt)
        ck.save(str(tmp_path), step, model, opt, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step-00000004", "step-00000005"]
    fresh, fresh_opt = _tiny()
    fresh_opt.param_groups[0]["lr"] = 5.0
    assert ck.load(str(tmp_path), fresh, fresh_opt).step == 5
    assert fresh_opt.param_groups[0]["lr"] == 1e-2  # torch's load_state_dict restores it too
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert opt.state[p].keys() == fresh_opt.state[q].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(opt.state[p][k], fresh_opt.state[q][k]) for k in opt.state[p])

    def full_disk(path: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.files, "write_new", full_disk)
    with pytest.raises(CheckpointError, match=r"rank-00000.pt: no space left on the device$"):
        ck.save(str(tmp_path), 6, model, opt, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["step-00000004", "step-00000005"]  # the good ones stay


def test_directory_checked_up_front(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = {str(tmp_path / "file"): "is a file, not a directory",
             str(tmp_path / "no" / "ckpt"): f"its parent {tmp_path / 'no'} does not exist",
             str(tmp_path / "file" / "ckpt"): f"its parent {tmp_path / 'file'} is not a directory",
             "/sys/dt-ckpt": "cannot create it: Operation not permitted",
             "/sys/kernel": "cannot write into it: Permission denied"}
    for path, words in cases.items():
        with pytest.raises(CheckpointError) as e:
            ck.check_directory(path)
        assert str(e.value) == f"checkpoint directory {path}: {words}" or words in str(e.value), str(e.value)
    assert ck.check_directory(str(tmp_path / "new")) == str(tmp_path / "new")  # made: its parent exists
    assert os.listdir(tmp_path / "new") == []  # the write probe is gone


def test_the_lock_refuses_a_second_job_and_dies_with_its_holder(tmp_path):
    with DirectoryLock(str(tmp_path)):
        with pytest.raises(CheckpointError) as e:
            DirectoryLock(str(tmp_path)).acquire()
        assert str(e.value) == (f"checkpoint directory {tmp_path}: in use by another job (pid {os.getpid()} "
                                f"on {socket.gethostname()}); two jobs must not write one checkpoint")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | "
         "os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
         str(tmp_path / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match="in use by another job"):
            DirectoryLock(str(tmp_path)).acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        with DirectoryLock(str(tmp_path)):  # the kernel dropped the dead holder's lock
            pass
    finally:
        holder.kill()
        holder.wait(30)
        holder.stdout.close()


def test_a_dead_writers_private_directory_is_removed_by_the_next_lock_holder(tmp_path):
    model, opt = _tiny()
    ck.save(str(tmp_path), 1, model, opt)
    (tmp_path / ".step-00000002.tmp-12345-deadbeef").mkdir()
    (tmp_path / ".step-00000002.tmp-12345-deadbeef" / "rank-00000.pt").write_bytes(b"half")
    lock = ck.lock_directory(str(tmp_path))
    try:
        assert _leftovers(tmp_path) == [] and os.listdir(tmp_path / "step-00000001")
    finally:
        lock.release()


# -- dt train: a checkpoint saved on one mesh resumes on another ------------------------------------
def _args(dp: int, tp: int, pp: int, steps: int, **kw: object) -> object:
    argv = ["--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--steps", str(steps), "--batch-size", "8",
            "--block-size", "8", "--n-layer", "2", "--n-head", "4", "--n-embd", "16", "--dtype", "float64",
            "--lr", "1e-2", "--no-progress", "--threads", "1", "--micro-batches", str(min(2, 8 // dp))]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return train.parse_args(argv)


def _train_runs(runs: list[tuple[tuple[int, int, int], int, dict]]) -> list[dict]:
    """train_worker for each ((dp, tp, pp), steps, options); a CheckpointError comes back as its text
    (so the pool is not restarted), the same on every rank."""
    out = []
    for (dp, tp, pp), steps, kw in runs:
        try:
            args = _args(dp, tp, pp, steps, **{k: v for k, v in kw.items() if k != "checkpoint_unread"})
            if "checkpoint_unread" in kw:  # a checkpoint the options were not read from: load's own check
                args.checkpoint = str(kw["checkpoint_unread"])
            r = train.train_worker(args)
            out.append({"losses": r["losses"], "start": r["start"], "resumed": r["resumed"]})
        except CheckpointError as e:
            out.append({"error": str(e)})
    return out


def _train_argv(argv: list[str]) -> list[float]:
    return train.train_worker(train.parse_args(argv))["losses"]


def _resume_copy(src: Path, step: int, dst: Path) -> str:
    """A checkpoint directory holding only `src`'s step `step`: each resumed run writes its own."""
    dst.mkdir()
    shutil.copytree(src / f"step-{step:08d}", dst / f"step-{step:08d}")
    return str(dst)


# Float64 throughout. Meshes differ only in the order their all-reduces add (tensor parallel:
# partial products; data parallel: per-rank gradient means; ZeRO: reduce-scatter instead of
# all-reduce), a rounding of ~1e-16 per addition; over these few Adam steps the resumed losses
# agree with the uninterrupted run's to a few ulps (measured: at most 4.4e-16). 1e-11 is far
# above that and far below what a faulty resume does (measured on this model: Adam's moments
# not restored, 0.05; the data one step off, 0.09).
TOL = 1e-11


@pytest.mark.timeout(300)
def test_resume_on_another_mesh_follows_the_uninterrupted_run(run, tmp_path):
    a = tmp_path / "a"
    (straight,) = run(8, _train_runs, [((2, 2, 2), 8, {"checkpoint": a, "save_every": 3})], timeout=240)[0]
    assert sorted(os.listdir(a)) == [".lock", "step-00000003", "step-00000006", "step-00000008"]
    want = straight["losses"]
    # 8 ranks -> 8 ranks: tp 2 -> 1, pp 2 -> 4 and interleaved, dp 2 -> 4, ZeRO 0 -> 1
    b1, b2 = _resume_copy(a, 3, tmp_path / "b1"), _resume_copy(a, 3, tmp_path / "b2")
    on8 = run(8, _train_runs, [((1, 2, 4), 6, {"checkpoint": b1, "zero": 1}),
                               ((4, 1, 2), 6, {"checkpoint": b2, "schedule": "interleaved", "virtual": 2})],
              timeout=240)
    # 8 ranks -> 2 ranks, and -> 1; and the ZeRO-1, pp 4 checkpoint of b1 -> one process
    c1, c2, c3 = (_resume_copy(a, 3, tmp_path / n) for n in ("c1", "c2", "c3"))
    d = _resume_copy(Path(b1), 6, tmp_path / "d")
    on2 = run(2, _train_runs, [((1, 2, 1), 6, {"checkpoint": c1}),
                               ((2, 1, 1), 6, {"checkpoint": c2, "zero": 1})])
    on1 = run(1, _train_runs, [((1, 1, 1), 6, {"checkpoint": c3}), ((1, 1, 1), 8, {"checkpoint": d})])
    for results in (on8, on2, on1):
        assert all(r == results[0] for r in results)  # every rank reports the same
    resumed = on8[0] + on2[0] + on1[0][:1]
    for r in resumed:
        assert r["start"] == 3 and r["resumed"]["layout"] == {"world": 8, "dp": 2, "tp": 2, "pp": 2,
                                                              "virtual": 1, "zero": 0}
        assert max(abs(x - y) for x, y in zip(r["losses"], want[3:6])) < TOL, (r["losses"], want[3:6])
    last = on1[0][1]
    saved_on = last["resumed"]["layout"]
    assert last["start"] == 6 and (saved_on["zero"], saved_on["pp"]) == (1, 4)
    assert max(abs(x - y) for x, y in zip(last["losses"], want[6:8])) < TOL


# -- dt train's checkpoint faults, on 2 ranks ---------------------------------------------------------
@pytest.mark.timeout(300)
def test_dt_train_lock_fallback_keep_and_another_model(run, tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    with DirectoryLock(str(d)):  # another job writes here: refused on every rank, before any step
        locked = run(2, _train_runs, [((2, 1, 1), 2, {"checkpoint": d})])
    assert locked[0] == locked[1] == [{"error": f"checkpoint directory {d}: in use by another job (pid "
                                                f"{os.getpid()} on {socket.gethostname()}); two jobs must "
                                                f"not write one checkpoint"}]
    assert os.listdir(d) == [".lock"]
    (d / ".step-00000007.tmp-999-dead").mkdir()  # what a writer killed mid-save leaves
    first = run(2, _train_runs, [((2, 1, 1), 4, {"checkpoint": d, "save_every": 1, "keep": 2})])[0][0]
    assert sorted(os.listdir(d)) == [".lock", "step-00000003", "step-00000004"]  # --keep 2; stale dir gone
    bad = d / "step-00000004" / "rank-00001.pt"
    size = bad.stat().st_size
    bad.write_bytes(bad.read_bytes()[:100])
    again = run(2, _train_runs, [((1, 2, 1), 4, {"checkpoint": d, "keep": 2}),
                                 ((1, 1, 2), 4, {"checkpoint_unread": d, "n_embd": 32})])
    assert again[0] == again[1]
    resumed, other = again[0]
    assert resumed["start"] == 3 and abs(resumed["losses"][0] - first["losses"][3]) < TOL
    assert resumed["resumed"]["warnings"] == [f"checkpoint file {bad}: truncated (100 of {size} bytes); "
                                              f"falling back to {d / 'step-00000003'}"]
    assert ck.read_full(str(d / "step-00000004"))[0]["layout"]["tp"] == 2  # step 4 saved again, good
    assert other == {"error": f"checkpoint {d / 'step-00000004'}: saved for another model "
                              f"(n_embd 16 there, 32 here)"}
    assert _leftovers(d) == []


# -- DDP, ZeRO 1-2 and FSDP: torch's optimizer state, and each other's checkpoints --------------------
BATCH = 30  # divisible by 2 and 3: every rank's mean over its slice averages to the full batch's


def _model64() -> nn.Module:
    torch.manual_seed(0)  # odd sizes: uneven shards, empty ones at 3 ranks for the 1-element layer
    return nn.Sequential(nn.Linear(7, 13), nn.GELU(), nn.Linear(13, 5), nn.GELU(), nn.Linear(5, 1),
                         nn.Linear(1, 1)).double()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 7, generator=g, dtype=torch.float64), torch.randn(BATCH, 1, generator=g,
                                                                                dtype=torch.float64)


def _train_steps(net: nn.Module, opt: object, steps: range, alone: bool = False) -> None:
    """Each rank takes its slice of every batch; `alone`: the whole batch (torch's reference run)."""
    rank, world = (0, 1) if alone or not dist.is_initialized() else (dist.get_rank(), dist.get_world_size())
    for step in steps:
        x, y = _batch(step)
        opt.zero_grad()
        (net(x.tensor_split(world)[rank]) - y.tensor_split(world)[rank]).pow(2).mean().backward()
        opt.step()


def _reference(steps: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model64()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train_steps(model, opt, range(steps), alone=True)
    return model, opt


def _by_name(opt_state: dict) -> dict:
    """torch's optimizer state keyed by parameter name instead of index (FSDP's form)."""
    names = [n for n, _ in _model64().named_parameters()]
    return {"state": {names[i]: v for i, v in opt_state["state"].items()},
            "param_groups": [{k: v for k, v in g.items() if k != "params"}
                             for g in opt_state["param_groups"]]}


def _equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k])
                                                                         for k in a[n]) for n in a)


def _torch_state_round_trips(k: int, m: int) -> dict:
    """Load torch's Adam state (after k steps) into ZeRO-1, ZeRO-2 and FSDP; it must come back
    unchanged from their state_dict; then m more steps must land where torch's do."""
    ref, ref_opt = _reference(k)
    model_sd, opt_sd = copy.deepcopy(ref.state_dict()), copy.deepcopy(ref_opt.state_dict())
    _train_steps(ref, ref_opt, range(k, k + m), alone=True)
    out = {"want": {n: t.detach().clone() for n, t in ref.state_dict().items()}}
    for variant in ("zero1", "zero2", "fsdp"):
        model = _model64()
        if variant == "fsdp":
            net = FullyShardedDataParallel(model)
            net.load_state_dict(model_sd)
            opt = torch.optim.Adam(net.parameters(), lr=1.0)
            net.load_optim_state_dict(opt, _by_name(opt_sd))
            back = net.optim_state_dict(opt)
            same = _equal_states(back["state"], _by_name(opt_sd)["state"])
            lr = back["param_groups"][0]["lr"]
        else:
            model.load_state_dict(model_sd)
            net = model
            opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=int(variant[-1]), lr=1.0)
            opt.load_state_dict(opt_sd)
            back = opt.state_dict()
            same = _equal_states(back["state"], opt_sd["state"])
            lr = back["param_groups"][0]["lr"]
        _train_steps(net, opt, range(k, k + m))
        params = net.state_dict() if variant == "fsdp" else model.state_dict()
        out[variant] = {"same": same, "lr": lr, "params": {n: t.detach().clone() for n, t in params.items()}}
    return out


# float64; the only difference from torch's single-process run is the order in which the ranks'
# gradient means are averaged (~1e-16), carried through a few Adam steps (measured: at most
# 5.6e-17 on the parameters). One Adam step moves a parameter by about lr = 1e-2.
PARAM_TOL = 1e-12


@pytest.mark.timeout(300)
def test_zero_and_fsdp_state_dicts_round_trip_torchs_optimizer_state(run):
    for rank, r in enumerate(run(3, _torch_state_round_trips, 3, 3, timeout=240)):
        for variant in ("zero1", "zero2", "fsdp"):
            got = r[variant]
            assert got["same"] and got["lr"] == 1e-2, (rank, variant)
            for n, t in r["want"].items():
                torch.testing.assert_close(got["params"][n], t, rtol=0, atol=PARAM_TOL,
                                           msg=f"{rank} {variant} {n}")


def _wrap(variant: str) -> tuple[nn.Module, object]:
    model = _model64()
    if variant == "ddp":
        return DistributedDataParallel(model), torch.optim.Adam(model.parameters(), lr=1e-2)
    if variant == "fsdp":
        net = FullyShardedDataParallel(model)
        return net, torch.optim.Adam(net.parameters(), lr=1e-2)
    return model, ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=int(variant[-1]), lr=1e-2)


def _sharded(load_from: str | None, variants: list[str], steps: range, save_to: str | None) -> dict:
    """Each variant loads `load_from` (if given), trains `steps`, and the first saves to `save_to`."""
    out = {}
    for i, variant in enumerate(variants):
        net, opt = _wrap(variant)
        loaded = ck.load(load_from, net, opt) if load_from else None
        _train_steps(net, opt, steps)
        if save_to and i == 0:
            ck.save(save_to, steps.stop, net, opt)
        params = net.state_dict()
        out[variant] = {"start": loaded.step if loaded else 0, "layout": loaded.layout if loaded else None,
                        "params": {n.removeprefix("module."): t.detach().clone() for n, t in params.items()}}
    return out


@pytest.mark.timeout(300)
def test_ddp_zero_and_fsdp_load_each_others_checkpoints_across_world_sizes(run, tmp_path):
    a, b = str(tmp_path / "ddp2"), str(tmp_path / "fsdp3")
    run(2, _sharded, None, ["ddp"], range(0, 3), a)  # stage 0 on 2 ranks
    on3 = run(3, _sharded, a, ["fsdp", "zero1", "zero2"], range(3, 5), b)  # stages 3, 1, 2 on 3 ranks
    on2 = run(2, _sharded, b, ["zero2", "ddp"], range(5, 7), None)  # stage 3 on 3 -> stages 2, 0 on 2
    ref, ref_opt = _reference(5)
    at5 = {n: t.detach().clone() for n, t in ref.state_dict().items()}
    _train_steps(ref, ref_opt, range(5, 7), alone=True)
    at7 = ref.state_dict()
    manifest = json.loads((tmp_path / "fsdp3" / "step-00000005" / "manifest.json").read_text())
    assert manifest["layout"] == {"world": 3, "zero": 3, "dp": 3} and len(manifest["files"]) == 3
    for results, want, start, layout in ((on3, at5, 3, {"world": 2, "zero": 0, "dp": 2}),
                                         (on2, at7, 5, {"world": 3, "zero": 3, "dp": 3})):
        for rank, r in enumerate(results):
            for variant, got in r.items():
                assert got["start"] == start and got["layout"] == layout, (rank, variant)
                for n, t in want.items():
                    torch.testing.assert_close(got["params"][n], t, rtol=0, atol=PARAM_TOL,
                                               msg=f"rank {rank} {variant} {n}")


# -- the command line: one line, exit 2, nothing left behind; and an elastic restart ------------------
def _session_leftovers(sid: int) -> list[str]:
    """Processes still alive in session `sid` (a command started with start_new_session=True)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(f"{pid} {stat[:stat.rindex(')') + 1]}")
    return out


def _dt(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return _dt_finished(_dt_started(*argv), timeout)


def _dt_started(*argv: str) -> subprocess.Popen:
    """`python -m dt ...` started, in a session of its own (to find what it leaves behind)."""
    return subprocess.Popen([sys.executable, "-m", "dt", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _dt_finished(proc: subprocess.Popen, timeout: float = 240) -> subprocess.CompletedProcess:
    """Its output once it has ended; nothing of its session may be left."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while _session_leftovers(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # a worker may take a moment to see its launcher gone
    assert _session_leftovers(proc.pid) == [], "processes left behind"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


TRAIN = ["train", "--batch-size", "4", "--block-size", "8", "--n-layer", "1", "--n-embd", "16",
         "--no-progress", "--threads", "1"]


@pytest.mark.timeout(300)
def test_cli_refuses_bad_checkpoints_in_one_line_and_leaves_nothing(run, tmp_path, capsys):
    missing = tmp_path / "no" / "ckpt"  # refused before any process starts: dt's entry point, here
    assert dt_main([*TRAIN, "--steps", "2", "--checkpoint", str(missing)]) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == f"dt train: error: checkpoint directory {missing}: its parent {missing.parent} " \
                       f"does not exist\n"
    assert not missing.parent.exists()
    d = tmp_path / "ckpt"
    run(2, _train_runs, [((2, 1, 1), 2, {"checkpoint": d, "batch_size": 4, "n_layer": 1})])
    bad = d / "step-00000002" / "rank-00001.pt"
    size = bad.stat().st_size
    bad.write_bytes(b"")
    done = _dt(*TRAIN, "--dp", "2", "--steps", "4", "--checkpoint", str(d))  # refused by the workers
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"dt train: error: checkpoint file {bad}: empty (the manifest says {size} bytes)\n"
    assert sorted(os.listdir(d)) == [".lock", "step-00000002"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_elastic_restart_resumes_from_the_last_good_checkpoint(run, tmp_path):
    """torchrun --max-restarts 1; rank 1 is SIGKILLed when it asks for step 5's batch (steps 0-4
    done, checkpoints at 2 and 4); the restarted group resumes at 4 and ends where an
    uninterrupted run ends, bit for bit (same mesh, same order of every addition)."""
    d, ref = tmp_path / "ckpt", tmp_path / "ref"
    argv = ["--dp", "2", "--steps", "8", "--batch-size", "8", "--block-size", "8", "--n-layer", "1",
            "--n-embd", "16", "--save-every", "2", "--no-progress", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DT_TEST_KILL_RANK": "1", "DT_TEST_KILL_STEP": "5"}
    proc = subprocess.Popen(["torchrun", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                             "--monitor-interval", "0.1", str(ROOT / "tests" / "elastic_train.py"), *argv,
                             "--checkpoint", str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert "exitcode: -9" in err or "exitcode  : -9" in err, err[-3000:]  # it really was killed
    assert f"resumed from {d / 'step-00000004'} (step 4, saved on dp=2 tp=1 pp=1 zero=0)" in out
    assert "steps 4..8:" in out
    assert sorted(os.listdir(d)) == [".lock", "step-00000004", "step-00000006", "step-00000008"]
    assert _session_leftovers(proc.pid) == []
    run(2, _train_argv, [*argv, "--checkpoint", str(ref)])  # the same run, never interrupted
    _, got = ck.read_full(str(d / "step-00000008"))
    _, want = ck.read_full(str(ref / "step-00000008"))
    assert got.keys() == want.keys()
    assert all(torch.equal(got[n], want[n]) for n in want)
