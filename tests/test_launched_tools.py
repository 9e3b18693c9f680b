"""Every tool on the ranks torchrun launched (no root needed: one host, `torchrun --standalone`).

Under torchrun a tool must use the launched ranks, not start its own, gather
every rank's figures into one report (printed once, by rank 0), and refuse a
world size option that contradicts the launch in one line (exit 2).

A torchrun launch costs three imports of torch and a rendezvous before any tool
runs, so the tools share launches: one runs every command that succeeds, in turn, on
the same launched ranks (tests/launched_tools_script.py, through `dt`'s entry point,
each command's output in files of its own), and ends with a refusal, which ends the
job as it would alone; a refusal of the study's needs is the other launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "launched_tools_script.py"

# the commands that succeed, by the name their test reads them under (run in this order)
COMMANDS = {
    "bench collectives": ["bench", "collectives", "-b", "1KB", "-e", "4KB", "-f", "4", "-n", "2", "-w", "1",
                          "--quiet", "--algorithms", "ring"],
    "train": ["train", "--pp", "2", "--steps", "2", "--batch-size", "4", "--block-size", "8",
              "--n-layer", "2", "--n-embd", "16", "--no-progress"],
    "bench ddp": ["bench", "ddp", "--batch", "8", "--steps", "1", "--warmup", "0", "--hidden", "16",
                  "--layers", "2", "--buckets", "1"],
    "tune": ["tune", "--no-sweep", "--reps", "2", "--transport", "torch", "--force"],
    "model": ["model", "all_reduce", "--size", "4KB", "--measured", "--reps", "1",
              "--algorithms", "ring,naive", "--transport", "torch"],
    "study": ["bench", "scaling", "--tables", "1", "--quick", "--no-plots", "--no-progress", "--out", "OUT"],
    "demo": ["demo", "primitives", "--world", "2", "--bytes", "4096"],
}
WORLD_CONFLICT = ["bench", "collectives", "--world", "3", "-b", "1KB", "-e", "1KB"]  # last: ends the job


def _torchrun(target: list[str], cwd: Path, nproc: int = 2,
             timeout: float = 520) -> subprocess.CompletedProcess:
    # the tune cache of the test's own (dt tune saves there, dt model --measured reads it)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(cwd))
    env.pop("DT_HOST", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           *target]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


@dataclass
class Ran:
    """One command of the shared launch: every rank's exit status, stdout and stderr together."""

    name: str
    codes: list[int]
    stdout: str
    stderr: str

    def failure(self) -> str:
        """Why it did not succeed on every rank ('' if it did), naming the command."""
        if self.codes == [0, 0]:
            return ""
        return f"dt {self.name}: exit statuses {self.codes}\n{self.stderr[-3000:]}"


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[dict[str, Ran], subprocess.CompletedProcess, Path]:
    where = tmp_path_factory.mktemp("launched")
    out_dir = str(where / "out")
    commands = [[out_dir if a == "OUT" else a for a in argv] for argv in COMMANDS.values()]
    (where / "commands.json").write_text(json.dumps([*commands, WORLD_CONFLICT]))
    done = _torchrun([str(SCRIPT), str(where)], where)
    ran = {}
    for i, name in enumerate(COMMANDS):
        files = [(where / f"{i}.{r}.rc", where / f"{i}.{r}.out", where / f"{i}.{r}.err") for r in (0, 1)]
        if not all(rc.exists() for rc, _, _ in files):
            pytest.fail(f"dt {name} did not finish on every rank:\n{done.stderr[-3000:]}")
        ran[name] = Ran(name, [int(rc.read_text()) for rc, _, _ in files],
                        "".join(o.read_text() for _, o, _ in files),
                        "".join(e.read_text() for _, _, e in files))
    return ran, done, where


@pytest.mark.timeout(600)
def test_bench_collectives_reports_the_launched_world_once(launch):
    out = launch[0]["bench collectives"]
    assert not out.failure(), out.failure()
    assert out.stdout.count("# dt bench collectives: all_reduce, world 2,") == 1, out.stdout
    assert "#wrong" in out.stdout


@pytest.mark.timeout(600)
def test_a_world_option_against_the_launch_is_one_line(launch):
    out = launch[1]  # the launch's last command: its status is the job's
    assert out.returncode != 0
    said = [line for line in out.stderr.splitlines() if line.startswith("dt bench collectives:")]
    assert said == ["dt bench collectives: error: --world 3 conflicts with the 2 ranks torchrun launched "
                    "(drop --world, or launch 3)"], out.stderr[-3000:]


@pytest.mark.timeout(600)
def test_train_reports_every_rank_under_torchrun(launch):
    out = launch[0]["train"]
    assert not out.failure(), out.failure()
    assert out.stdout.count("mesh dp=1 tp=1 pp=2") == 1, out.stdout
    assert "mean over 2 rank(s)" in out.stdout, out.stdout
    bubble = next(line for line in out.stdout.splitlines() if line.startswith("pipeline bubble"))
    assert "?" not in bubble, bubble


@pytest.mark.timeout(600)
def test_the_demos_worker_code_runs_on_the_launched_ranks(launch):
    out = launch[0]["demo"]
    assert not out.failure(), out.failure()
    assert "reduce_scatter + all_gather == all_reduce on every rank: yes" in out.stdout, out.stdout
    assert "measured == model: yes" in out.stdout, out.stdout


@pytest.mark.timeout(600)
def test_ddp_bench_runs_on_the_launched_ranks(launch):
    out = launch[0]["bench ddp"]
    assert not out.failure(), out.failure()
    assert out.stdout.count("dt bench ddp: world 2,") == 1, out.stdout


@pytest.mark.timeout(600)
def test_tune_saves_once_and_the_measured_model_times_the_launched_ranks(launch):
    out = launch[0]["tune"]
    assert not out.failure(), out.failure()
    assert out.stdout.count("dt tune: torch wire") == 1 and "world 2" in out.stdout, out.stdout
    assert (launch[2] / "dt" / "tune.json").exists()
    out = launch[0]["model"]
    assert not out.failure(), out.failure()
    assert "on 2 launched ranks (torchrun)" in out.stdout, out.stdout
    assert out.stdout.count("all_reduce, 4 KB") == 1, out.stdout


@pytest.mark.timeout(600)
def test_the_study_measures_only_the_launched_world(launch, tmp_path):
    out = launch[0]["study"]
    assert not out.failure(), out.failure()
    rows = [line.split("|")[2].strip() for line in out.stdout.splitlines()
            if line.startswith("|") and line.split("|")[1].strip() == "2"]
    assert rows == ["torch", "shm"], out.stdout  # world 2 alone, a row per wire
    assert "collectives at world sizes 2 " in out.stdout, out.stdout
    assert (launch[2] / "out" / "scaling.json").exists()
    out = _torchrun(["-m", "dt", "bench", "scaling", "--tables", "3"], tmp_path)  # needs world 1 too: refused
    assert out.returncode != 0
    assert "torchrun launched 2 ranks" in out.stderr, out.stderr[-3000:]
