"""Faults of launched runs (issue 20): under torchrun, at start-up, and the pool's start-up time.

1. under torchrun: a rank hung in its own compute ends the job (the others do not wait it
   out) and is the rank named; SIGKILL of torchrun itself takes its ranks with it; torch's
   DDP on the "dt" backend whose peer is SIGKILLed raises an error naming it (no crash);
2. a rank that never arrives is named, not the survivors that timed out on it (local pool);
3. workers that would die before the function (bad DT_TIMEOUT, no `__main__` guard, a nested
   function, a function workers cannot import) are refused or reported in one line;
4. the pool's start-up never stalls (a stall is a bug, so it is bounded, against the median).

That a SIGKILLed local launcher leaves no store file is checked with the launcher's other
deaths, started together, in test_faults.py's test_workers_die_with_their_launcher.

Nothing is left behind: every test scans /proc for processes of its own (their command
lines name the test's directory) and for the ranks' pids, after the run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dt
from dt.launcher import WorkerError, WorkerPool, run_workers
from tests.test_faults import _alive, _wait_gone, default_sigint

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "faults_script.py"
needs_torchrun = pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None,
                                    reason="torchrun (torch.distributed.run) is not installed")


def _left_behind(marker: str) -> list[int]:
    """Processes (not this one) whose command line names `marker` (the test's directory)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read() and _alive(int(name)):
                        out.append(int(name))
            except OSError:
                pass
    return out


def _pids(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in directory.glob("*.pid") if p.read_text().endswith("\n")]


def _torchrun_cmd(directory: Path, *args: str, nproc: int, monitor_s: float = 0.1) -> list[str]:
    """torchrun running faults_script.py; `monitor_s`: how often its agent looks for a failed
    rank (then stops the others: its default is 0.1 s)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--monitor-interval", str(monitor_s), str(SCRIPT), str(directory), *args]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    env.pop("DT_HOST", None)
    return env


# -- 1. under torchrun ---------------------------------------------------------


def _the_hung_rank_was_named(hung: int, code: int, stderr: str, took: float) -> None:
    case = f"rank {hung} hung: "
    assert code != 0, case + stderr[-3000:]
    heads = [line for line in stderr.splitlines() if line.startswith("faults_script: ")]
    assert len(heads) == 1, case + stderr[-3000:]
    assert heads[0].startswith(f"faults_script: _job: rank {hung} never arrived: rank "), case + heads[0]
    assert f"waited on rank {hung}" in heads[0] and "Timed out waiting 5000ms" in heads[0], case + heads[0]
    assert f"  rank {hung}: stopped: still running _job 5s after rank " in stderr, case + stderr[-3000:]
    assert took < 300, f"{case}the job took {took:.0f}s: it waited out the run's timeout"  # 600 s hung


@needs_torchrun
@pytest.mark.timeout(400)
def test_a_rank_hung_in_its_compute_ends_the_torchrun_job_and_is_named(tmp_path):
    """DT_TIMEOUT=5: the others time out on the hung rank at +5 s; the job then ends (their
    WorkerError, torchrun stops the hung rank) instead of waiting out the run's 300 s or the
    hung rank's 600 s sleep. The report names the hung rank, printed by the lowest live rank.
    Rank 1 hung and rank 0 hung (then rank 1 reports) before the group connected, and rank 1
    hung after it connected (the wait is on the shared-memory board, where both survivors
    time out: neither may be blamed) are three jobs, run at once: each mostly waits on its
    hung rank."""
    jobs = {}
    for hung, mode in ((1, "hang"), (0, "hang"), (1, "hang-connected")):
        directory = tmp_path / f"{mode}{hung}"
        directory.mkdir()
        jobs[directory] = (hung, time.monotonic(), subprocess.Popen(
            _torchrun_cmd(directory, mode, str(hung), nproc=3), env=_env(DT_TIMEOUT="5"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    try:
        for directory, (hung, start, job) in jobs.items():
            _, stderr = job.communicate(timeout=330)
            _the_hung_rank_was_named(hung, job.returncode, stderr, time.monotonic() - start)
            assert _wait_gone(_pids(directory), within=15) < 15, f"rank {hung} hung"
    finally:
        for _, _, job in jobs.values():  # only if the test failed
            if job.poll() is None:
                job.kill()
                job.communicate()
    assert _left_behind(str(tmp_path)) == []


@needs_torchrun
@pytest.mark.timeout(300)
def test_sigkill_of_torchrun_takes_its_ranks_with_it(tmp_path):
    """torchrun's agent cannot stop its workers once SIGKILLed: each rank dies with it itself."""
    directory = tmp_path / "ranks"
    directory.mkdir()
    agent = subprocess.Popen(_torchrun_cmd(directory, "park", nproc=2), env=_env(), cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 240
        while len(_pids(directory)) < 2:
            assert agent.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.2)
        ranks = _pids(directory)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(30)
        assert _wait_gone(ranks, within=15) < 15
        assert _left_behind(str(tmp_path)) == []
    finally:
        for pid in [agent.pid, *_left_behind(str(tmp_path))]:  # only if the test failed
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@needs_torchrun
@pytest.mark.timeout(300)
def test_ddp_on_the_dt_backend_names_a_sigkilled_peer_instead_of_crashing(tmp_path):
    """DDP's reducer reads each bucket's future from C++: a future whose exception was only
    its value (torch.futures.Future.set_exception) was read as tensors there, a segmentation
    fault in the survivor's backward. The survivor must raise, naming the dead rank, well
    within the group's timeout (torch's 30 minutes), then exit with that error, unless
    torchrun's agent, which looks for failed ranks every 5 s here, stops it first (SIGTERM,
    as it stops the survivors of any job: an interpreter with torch loaded took up to 4 s to
    shut down on the loaded machine). Neither is the crash's SIGSEGV."""
    directory = tmp_path / "ranks"
    directory.mkdir()
    job = subprocess.Popen(_torchrun_cmd(directory, "ddp", "1", nproc=2, monitor_s=5), env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        _, stderr = job.communicate(timeout=240)
    finally:
        if job.poll() is None:  # only if the test failed
            job.kill()
            job.communicate()
    assert "SIGSEGV" not in stderr and "Segmentation fault" not in stderr, stderr[-3000:]
    error = directory / "0.error"
    assert error.exists(), f"the survivor wrote no error:\n{stderr[-3000:]}"
    when, heard = error.read_text().split("\n", 1)
    assert "rank 1" in heard and "died" in heard, heard
    assert float(when) - float((directory / "killed").read_text()) < 20, heard
    survivor = re.search(r"rank\s*: 0 \(local_rank: 0\)\n\s*exitcode\s*: (-?\d+)", stderr)
    assert survivor is not None and survivor[1] in ("1", "-15"), stderr[-3000:]
    assert _wait_gone(_pids(directory), within=15) < 15
    assert _left_behind(str(tmp_path)) == []


# -- 2. a rank that never arrives (the local pool) -----------------------------


def _one_rank_late(late: int) -> list[float]:
    dt.set_timeout(3)
    if dist.get_rank() == late:
        time.sleep(60)  # in its own compute: it never reaches the all-reduce
    x = torch.ones(4)
    dt.all_reduce(x)
    return x.tolist()


def _one_rank_late_once_connected(late: int) -> list[float]:
    dt.set_timeout(3)
    dt.all_reduce(torch.ones(4))  # the group connects: on one host, on the shared-memory board
    if dist.get_rank() == late:
        time.sleep(60)
    x = torch.ones(4)
    dt.all_reduce(x)
    return x.tolist()


SERVER = """
import datetime, sys, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=60))
print(store.port, flush=True)
store.wait(["exiting"])
"""  # and then exits, closing the store: as another host's agent may while this one's ranks exit

RANK = """
import datetime, sys, time, builtins, torch.distributed as dist
from dt.transport import liveness
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=datetime.timedelta(seconds=60))
liveness.attach(liveness.StoreChannel(dist.PrefixStore("dt/attempt0", store)))
class SlowToFinalize:  # freed as the interpreter finalizes, after the store has closed
    def __del__(self):
        time.sleep(1.5)
builtins.slow = SlowToFinalize()
store.set("exiting", "1")
"""


@pytest.mark.timeout(120)
def test_a_rank_exits_cleanly_when_the_store_closes_as_it_finalizes():
    """The watchdog is out of the store's C++ before the interpreter finalizes: a thread returning
    from a blocking store wait then aborts the process ("terminate called without an active
    exception", status 134), which a rank of a two-host torchrun job met at exit."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        rank = subprocess.run([sys.executable, "-c", RANK, port], capture_output=True, text=True,
                              timeout=90, cwd=ROOT)
    finally:
        server.kill()
        server.wait()
    assert rank.returncode == 0, rank.stderr[-2000:]
    assert "terminate called" not in rank.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", (3, 5))
def test_the_rank_that_never_arrived_at_the_board_is_named_not_a_survivor(run, world):
    """Every survivor times out on the board, and every one of them arrived: the one to blame
    is a rank that did not (the board knows who posted), at any world, not "every other"."""
    late = world - 2
    with pytest.raises(WorkerError) as info:
        run(world, _one_rank_late_once_connected, late, timeout=100)
    err = info.value
    head = str(err).splitlines()[0]
    assert err.rank == late, head
    assert head.startswith(f"_one_rank_late_once_connected: rank {late} never arrived: rank "), head
    assert f"waited on rank {late} in " in head and "at sync " in head, head  # the board's wait
    assert "Timed out waiting 3000ms" in head, head
    assert err.errors[late].kind == "stopped"
    assert {err.errors[r].kind for r in range(world) if r != late} <= {"CollectiveTimeout",
                                                                         "CollectiveError"}


@pytest.mark.timeout(180)
def test_the_rank_that_never_arrived_is_named_not_a_survivor(run):
    with pytest.raises(WorkerError) as info:
        run(3, _one_rank_late, 1, timeout=100)
    err = info.value
    head = str(err).splitlines()[0]
    assert err.rank == 1, head
    assert head.startswith("_one_rank_late: rank 1 never arrived: rank "), head
    assert "waited on rank 1" in head and "Timed out waiting 3000ms" in head, head
    assert err.errors[1].kind == "stopped"
    assert {err.errors[r].kind for r in (0, 2)} <= {"CollectiveTimeout", "CollectiveError"}


# -- 3. start-up faults: one line naming the cause ------------------------------


def _module_level() -> int:
    return 1


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan"])
def test_a_bad_dt_timeout_is_refused_before_any_worker_starts(monkeypatch, value):
    monkeypatch.setenv("DT_TIMEOUT", value)
    pool = WorkerPool(2)
    with pytest.raises(ValueError) as info:
        pool.run(_module_level, timeout=60)
    assert str(info.value).startswith(f"DT_TIMEOUT must be a positive, finite number of seconds, got "
                                      f"{value!r}"), info.value
    assert pool.pids == []  # refused in the parent: nothing was spawned


def test_a_nested_function_is_refused_before_any_worker_starts():
    def nested() -> int:
        return 1

    with pytest.raises(ValueError) as info:
        run_workers(nested, 2, timeout=60)
    assert str(info.value) == ("cannot pickle test_a_nested_function_is_refused_before_any_worker_starts."
                               "<locals>.nested, a nested function: workers find a function by its "
                               "module and name, so define it at module level")
    with pytest.raises(ValueError, match="a lambda: workers find a function"):
        run_workers(lambda: 1, 2, timeout=60)


@pytest.mark.timeout(240)
def test_a_script_without_a_main_guard_is_refused_in_one_line(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("from dt.launcher import run_workers\n\n\ndef f():\n    return 1\n\n\n"
                      "print(run_workers(f, 2, timeout=60))\n")
    guarded = tmp_path / "guarded.py"  # the same script with the guard: it runs (at once, beside)
    guarded.write_text(script.read_text().replace("print(", "if __name__ == '__main__':\n    print("))
    both = [subprocess.Popen([sys.executable, str(s)], env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path) for s in (script, guarded)]
    try:
        (_, err), (out_guarded, err_guarded) = (p.communicate(timeout=200) for p in both)
    finally:
        for p in both:  # only if the test failed
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert both[0].returncode == 1
    assert err.strip().splitlines()[-1] == (
        "ValueError: unguarded.py, line 8: the script has no `if __name__ == '__main__':` guard, so "
        "spawned workers re-run it; put the code that starts the workers under that guard")
    assert "exited with code" not in err and "dt-rank" not in err  # nothing spawned
    assert both[1].returncode == 0 and out_guarded.strip() == "[1, 1]", err_guarded[-2000:]
    assert _left_behind(str(tmp_path)) == []


@pytest.mark.timeout(240)
def test_a_function_workers_cannot_import_is_named_in_one_line(tmp_path):
    code = "from dt.launcher import run_workers\ndef f():\n    return 1\nrun_workers(f, 2, timeout=60)\n"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=_env(), capture_output=True,
                         text=True, timeout=200, cwd=tmp_path)
    assert out.returncode == 1
    heads = [line for line in out.stderr.splitlines() if line.startswith("dt.launcher.pool.WorkerError:")]
    assert len(heads) == 1, out.stderr[-3000:]
    assert re.match(r"dt\.launcher\.pool\.WorkerError: f: rank [01] raised AttributeError: the job "
                    r"cannot be loaded in the worker \(Can't get attribute 'f'", heads[0]), heads[0]
    assert "define it in a module they can import (not in `python -c`" in heads[0]
    assert _left_behind(str(tmp_path)) == []


# -- 4. the pool's start-up time ----------------------------------------------------


@pytest.mark.timeout(600)
def test_the_pool_never_stalls_at_start_up():
    """20 fresh pools at world 2: none takes 4 s longer than the median start (a stall was
    5.0 s, about one start in ten; the median absorbs however loaded the machine is).

    The job is os.getpid, which a worker unpickles without importing anything: a test
    module's function would make each fresh worker import that module (and pytest) first.
    The first pool also starts the fork server (it imports torch): not counted."""
    took, before = [], set(Path(tempfile.gettempdir()).glob("dt-pool-*"))
    for i in range(21):
        start = time.monotonic()
        with WorkerPool(2) as pool:
            assert pool.run(os.getpid, timeout=120) == pool.pids
            if i:
                took.append(time.monotonic() - start)
            pids = pool.pids
        assert _wait_gone(pids, within=15) < 15
    assert set(Path(tempfile.gettempdir()).glob("dt-pool-*")) <= before  # each store file removed
    median = statistics.median(took)
    stalls = [round(t, 2) for t in took if t - median >= 4.0]
    assert not stalls, f"starts that stalled: {stalls} (median {median:.2f}s of {sorted(took)})"
