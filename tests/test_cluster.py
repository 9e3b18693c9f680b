"""The simulated cluster end to end (`dt cluster`): root, ip and tc needed, else skipped with the reason.

Each test runs `dt cluster up` as a user would, marks every process it starts
with an environment variable, and checks afterwards that nothing of the job is
left: no namespace, no link, no process, no /dev/shm segment.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dt.launcher.cluster import ClusterError, check_tools
from dt.tools.cli import main as dt_main
from tests.shm_checks import dt_segments
from tests.test_faults import default_sigint

try:
    check_tools()
    MISSING = ""
except ClusterError as exc:
    MISSING = str(exc)

pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "cluster_script.py")


def _up(args: list[str], cmd: list[str], marker: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DT_CLUSTER_TEST": marker}
    return subprocess.Popen([sys.executable, "-m", "dt", "cluster", "up", *args, "--", *cmd], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=default_sigint, **kw)


def _finish(p: subprocess.Popen, timeout: float = 240) -> tuple[str, str]:
    """The run's output; on timeout (a loaded machine) the runner is stopped, so it tears down."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        p.communicate(timeout=60)
        raise


def _marked(marker: str) -> list[int]:
    """Processes that carry the test's marker in their environment (every one the run started)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"DT_CLUSTER_TEST={marker}".encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def _job(stderr: str) -> str:
    m = re.search(r"job ([0-9a-f]{6})", stderr)
    assert m, f"no job id in: {stderr}"
    return m.group(1)


def _assert_nothing_left(job: str, marker: str, shm_before: set[str]) -> None:
    time.sleep(0.5)  # a namespace's own end of a veth goes asynchronously
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"dtc-{job}-" not in netns, netns
    assert not re.search(rf"dtb?{job}", links), links
    assert not os.path.exists(f"/run/dt-cluster/{job}")
    assert _marked(marker) == [], "processes of the run are still alive"
    assert dt_segments() - shm_before == set(), "shared-memory segments left in /dev/shm"


SLEEPER = ["python", "-u", "-c", "import time; print('up', flush=True); time.sleep(60)"]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


@dataclass
class Run:
    """One `dt cluster up` of this file's: its marker, its output, its exit status."""

    marker: str
    process: subprocess.Popen
    out: str = ""
    err: str = ""

    @property
    def code(self) -> int | None:
        return self.process.returncode


def _killed_runner_is_downed(job: str) -> None:
    """The runner had no chance to clean up: `dt cluster list` shows the stale job, `down` removes it
    (each command's main, in this process: the same code as `python -m dt cluster ...`, without a
    second import of torch)."""
    for action, seen in (("list", f"{job}  stale"), ("down", job)):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = dt_main(["cluster", action])
        assert code == 0 and seen in out.getvalue(), f"dt cluster {action}: {out.getvalue()}{err.getvalue()}"


@pytest.fixture(scope="module")
def runs() -> Iterator[tuple[dict[str, Run], set[str]]]:
    """Every run of this file's, all at once (each mostly waits: on torchrun's start-up, a grace,
    a signal), each with a marker of its own; the checks of what is left come after all have ended."""
    before = dt_segments()
    starts = {
        "two hosts": (["--hosts", "2", "--per-host", "2", "--link", "1Gbit"], ["python", SCRIPT, "2", "2"]),
        # host 1 fails at once, host 0 would sleep a minute: the run ends after the grace, status 1
        "a failing host": (["--hosts", "2", "--per-host", "1"],
                           ["python", "-c", "import os, sys, time; g = os.environ['GROUP_RANK']; "
                            "sys.exit(3) if g == '1' else time.sleep(60)"]),
        **{sig.name: (["--hosts", "2", "--per-host", "1"], SLEEPER) for sig in SIGNALS},
    }
    started: dict[str, Run] = {}
    try:
        for name, (args, cmd) in starts.items():
            marker = uuid.uuid4().hex
            started[name] = Run(marker, _up(args, cmd, marker))
        for sig in SIGNALS:
            p = started[sig.name].process
            line = p.stdout.readline()  # the first host's "up": every namespace exists by then
            assert "up" in line, f"{sig.name}: {line}"
            p.send_signal(sig)
        for run in started.values():
            run.out, run.err = _finish(run.process)
        _killed_runner_is_downed(_job(started["SIGKILL"].err))
        yield started, before
    finally:
        for run in started.values():  # only if the fixture failed: each runner tears its hosts down
            if run.process.poll() is None:
                run.process.terminate()
                run.process.communicate(timeout=60)


@pytest.mark.timeout(600)
def test_two_hosts_see_their_topology_and_reduce_like_torch(runs):
    done, before = runs
    run = done["two hosts"]
    assert run.code == 0, run.out + run.err
    ok = sorted(line for line in run.out.splitlines() if "cluster-ok" in line)
    assert len(ok) == 4, run.out + run.err
    for r in range(4):
        assert f"[h{r // 2}] cluster-ok rank {r} hosts [0, 0, 1, 1]" in ok, ok
    _assert_nothing_left(_job(run.err), run.marker, before)


@pytest.mark.timeout(600)
def test_a_failing_host_ends_the_run_and_everything_goes(runs):
    done, before = runs
    run = done["a failing host"]
    assert run.code != 0, run.out + run.err
    _assert_nothing_left(_job(run.err), run.marker, before)


@pytest.mark.timeout(600)
def test_ctrl_c_sigterm_and_a_killed_runner_leave_nothing(runs):
    done, before = runs
    for sig in SIGNALS:
        run = done[sig.name]
        job = _job(run.err)
        if sig != signal.SIGKILL:  # Ctrl-C: 130, SIGTERM: 143, after the teardown
            assert run.code == 128 + sig, f"{sig.name}: {run.err}"
        # the killed runner's stale job was found by `dt cluster list` and removed by `down` (the fixture)
        _assert_nothing_left(job, run.marker, before)


def test_refusals_are_one_line(capsys):
    with pytest.raises(SystemExit) as bad:
        dt_main(["cluster", "up", "--link", "fast", "--", "true"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and len(err.strip().splitlines()) == 1, err
