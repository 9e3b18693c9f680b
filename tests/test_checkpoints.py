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
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
         " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
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
            r = train.train_worker(_args(dp, tp, pp, steps, **kw))
            out.append({"losses": r["losses"], "start": r["start"], "resumed": r["resumed"]})
        except CheckpointError as e:
            out.append({"error": str(e)})
    return out


def _resume_copy(src: Path, step: int, dst: Path) -> str:
    """A checkpoint directory holding only `src`'s step `step`: each resumed run writes its own."""
    dst.mkdir()
    shutil.copytree(src / f"step-{step:08d}", dst / f"step-{step:08d}")
    return str(dst)


# Float64 throughout. Meshes differ only in the order their all-reduces add (tensor parallel:
# partial products; data parallel: per-rank gradient means; ZeRO: reduce-scatter instead of
# all-reduce), a rounding of ~1e-16 per addition; over a few Adam steps on this model the
# losses of different meshes agree to a few ulps (measured: at most 4.4e-16), so 1e-11 is far above
# rounding and far below any real difference (a step lost or repeated moves the loss by ~1e-2,
# and a moment restored to zero by ~1e-4).
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
    on2 = run(2, _train_runs, [((1, 2, 1), 6, {"checkpoint": c1}), ((2, 1, 1), 6, {"checkpoint": c2, "zero": 1})])
    on1 = run(1, _train_runs, [((1, 1, 1), 6, {"checkpoint": c3}), ((1, 1, 1), 8, {"checkpoint": d})])
    for results in (on8, on2, on1):
        assert all(r == results[0] for r in results)  # every rank reports the same
    resumed = on8[0] + on2[0] + on1[0][:1]
    for r in resumed:
        assert r["start"] == 3 and r["resumed"]["layout"] == {"world": 8, "dp": 2, "tp": 2, "pp": 2,
                                                              "virtual": 1, "zero": 0}
        assert max(abs(x - y) for x, y in zip(r["losses"], want[3:6])) < TOL, (r["losses"], want[3:6])
    last = on1[0][1]
    assert last["start"] == 6 and last["resumed"]["layout"]["zero"] == 1 and last["resumed"]["layout"]["pp"] == 4
    assert max(abs(x - y) for x, y in zip(last["losses"], want[6:8])) < TOL
