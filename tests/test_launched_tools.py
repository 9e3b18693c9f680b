"""Every tool on the ranks torchrun launched (no root needed: one host, `torchrun --standalone`).

Under torchrun a tool must use the launched ranks, not start its own, gather
every rank's figures into one report (printed once, by rank 0), and refuse a
world size option that contradicts the launch in one line (exit 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _torchrun(args: list[str], tmp_path: Path, nproc: int = 2,
             timeout: float = 100) -> subprocess.CompletedProcess:
    # the tune cache of the test's own (dt tune saves there, dt model --measured reads it)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path))
    env.pop("DT_HOST", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "dt", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.timeout(120)
def test_bench_collectives_reports_the_launched_world_once(tmp_path):
    out = _torchrun(["bench", "collectives", "-b", "1KB", "-e", "4KB", "-f", "4", "-n", "2", "-w", "1",
                     "--quiet", "--algorithms", "ring"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("# dt bench collectives: all_reduce, world 2,") == 1, out.stdout
    assert "#wrong" in out.stdout


@pytest.mark.timeout(120)
def test_a_world_option_against_the_launch_is_one_line(tmp_path):
    out = _torchrun(["bench", "collectives", "--world", "3", "-b", "1KB", "-e", "1KB"], tmp_path)
    assert out.returncode != 0
    said = [line for line in out.stderr.splitlines() if line.startswith("dt bench collectives:")]
    assert said == ["dt bench collectives: error: --world 3 conflicts with the 2 ranks torchrun launched "
                    "(drop --world, or launch 3)"], out.stderr[-3000:]


@pytest.mark.timeout(120)
def test_train_reports_every_rank_under_torchrun(tmp_path):
    out = _torchrun(["train", "--pp", "2", "--steps", "2", "--batch-size", "4", "--block-size", "8",
                     "--n-layer", "2", "--n-embd", "16", "--no-progress"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("mesh dp=1 tp=1 pp=2") == 1, out.stdout
    assert "mean over 2 rank(s)" in out.stdout, out.stdout
    bubble = next(line for line in out.stdout.splitlines() if line.startswith("pipeline bubble"))
    assert "?" not in bubble, bubble


@pytest.mark.timeout(120)
def test_ddp_bench_runs_on_the_launched_ranks(tmp_path):
    out = _torchrun(["bench", "ddp", "--batch", "8", "--steps", "1", "--warmup", "0", "--hidden", "16",
                     "--layers", "2", "--buckets", "1"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("dt bench ddp: world 2,") == 1, out.stdout


@pytest.mark.timeout(150)
def test_tune_saves_once_and_the_measured_model_times_the_launched_ranks(tmp_path):
    out = _torchrun(["tune", "--no-sweep", "--reps", "2", "--transport", "torch", "--force"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("dt tune: torch wire") == 1 and "world 2" in out.stdout, out.stdout
    assert (tmp_path / "dt" / "tune.json").exists()
    out = _torchrun(["model", "all_reduce", "--size", "4KB", "--measured", "--reps", "1",
                     "--algorithms", "ring,naive", "--transport", "torch"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on 2 launched ranks (torchrun)" in out.stdout, out.stdout
    assert out.stdout.count("all_reduce, 4 KB") == 1, out.stdout


@pytest.mark.timeout(120)
def test_the_study_measures_only_the_launched_world(tmp_path):
    out = _torchrun(["bench", "scaling", "--tables", "1", "--quick", "--no-plots", "--no-progress",
                     "--out", str(tmp_path / "out")], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 2 ")]
    assert len(rows) == 1 and "collectives at world sizes 2 " in out.stdout, out.stdout
    assert (tmp_path / "out" / "scaling.json").exists()
    out = _torchrun(["bench", "scaling", "--tables", "3"], tmp_path)  # needs world 1 too: refused
    assert out.returncode != 0
    assert "torchrun launched 2 ranks" in out.stderr, out.stderr[-3000:]
