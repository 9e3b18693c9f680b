"""The transport's state in one object (dt.transport.state) and its reset.

A pool reuses its processes from test to test, so whatever one run leaves in the
transport (a timeout set, a group connected under DT_HOST's hosts, a thread, a
failure heard) would reach the next; the worker resets before each run. Checked:
one run leaves all of it behind and the next run starts without any of it; reset
called by hand disconnects a group connected across marked hosts, stops its
communication thread and unmaps its segment, and the group connects afresh (one
host, a board) after it. And the timeout's precedence, rule by rule. Under torchrun
(tests/launched_state_script.py) the second run of one job starts as fresh as a worker's.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dt
from dt import transport
from dt.transport import STATE, liveness, rules, settings
from dt.transport.shm.segment import DIR
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)

ROOT = Path(__file__).resolve().parent.parent


def test_the_state_gathers_every_part():
    parts = {f.name for f in dataclasses.fields(STATE)}
    assert parts == {"settings", "groups", "threads", "liveness", "traffic", "segments", "rules"}
    assert STATE.settings is settings.SETTINGS and STATE.liveness is liveness.WATCH


def _leave_everything_behind() -> bool:
    """What a careless run leaves: settings, a connected group, a thread (a failure heard is
    kept between runs: a process that heard one is not reused; reset by hand forgets it, below)."""
    dt.set_timeout(7)
    dt.set_validation(False)
    dt.set_transport("torch")
    x = torch.ones(8)
    dt.all_reduce(x, async_op=True).wait()  # connects the world group, starts its thread
    rules.RULES.recorder = rules.Recorder()  # NCCL's rules checked from here on, never undone
    return transport.resolve_group(None).links.topology is not None


def _what_a_run_starts_with() -> dict:
    view = transport.resolve_group(None)
    out = {"source": transport.timeout_for(view).source, "validate": settings.validation_enabled(),
           "wire": settings.get_transport(), "connected": view.links.topology is not None,
           "threads": len(STATE.threads.threads), "known": len(liveness.failures()),
           "records": len(STATE.traffic.open), "nccl rules": rules.active() is not None}
    x = torch.ones(8)
    dt.all_reduce(x)
    out["board"] = view.links.board is not None  # the wire is auto's again: shared memory
    out["value"] = x[0].item()
    return out


def test_a_run_starts_from_a_fresh_transport(run):
    assert run(2, _leave_everything_behind) == [True, True]
    for got in run(2, _what_a_run_starts_with):
        assert got == {"source": "the launcher's", "validate": True, "wire": "auto", "connected": False,
                       "threads": 0, "known": 0, "records": 0, "nccl rules": False, "board": True,
                       "value": 2.0}


def _make_groups() -> tuple[int, int]:
    """A run that makes a plain group and a shared one, and uses both."""
    plain, shared = dist.new_group([0, 1]), transport.shared_group([0, 1], "kept between runs")
    dt.all_reduce(torch.ones(4), group=plain)
    dt.all_reduce(torch.ones(4), group=shared)
    return id(plain), id(shared)


def _groups_left() -> list[int]:
    """torch's registry of this process's groups, as the next run starts: ids besides the world's."""
    return [id(pg) for pg in dist.distributed_c10d._world.pg_map if pg is not dist.group.WORLD]


@pytest.mark.timeout(120)
def test_a_run_starts_without_the_plain_groups_past_runs_made(run):
    """Each gloo group keeps a socket loop that wakes every 10 ms: a past run's dist.new_group is
    destroyed when the next run starts; shared_group's stays, to be reused."""
    made = run(2, _make_groups)
    for (plain, shared), left in zip(made, run(2, _groups_left)):
        assert shared in left and plain not in left, (plain, shared, left)
    assert run(2, _make_groups)[0][1] == made[0][1]  # the shared group again, not a new one


def _reset_by_hand() -> dict:
    transport.reset()  # an earlier run's connection would hide the marking below
    saved = os.environ.get("DT_HOST")
    os.environ["DT_HOST"] = f"host{dist.get_rank()}"  # each rank a host of its own
    try:
        view = transport.resolve_group(None)
        dt.all_reduce(torch.ones(4), async_op=True).wait()
        before = view.links.topology.host_count
        thread = STATE.threads.threads[view.key].thread
    finally:
        if saved is None:
            os.environ.pop("DT_HOST", None)
        else:
            os.environ["DT_HOST"] = saved
    liveness.WATCH.known.append(liveness.Failure(1, "raised", "rank 1 raised (made up)"))
    transport.reset()  # by hand: the failures heard go too
    known = len(liveness.failures())
    thread.join(10)
    after = transport.resolve_group(None)
    x = torch.ones(4)
    dt.all_reduce(x, algorithm="one_shot")  # needs one host's board: connected afresh
    return {"before": before, "old view": view.links.topology is None, "new view": after is not view,
            "thread": thread.is_alive(), "after": after.links.topology.host_count, "value": x[0].item(),
            "known": known}


@pytest.mark.timeout(120)
def test_reset_disconnects_groups_and_stops_their_threads(run):
    for got in run(2, _reset_by_hand, timeout=100):
        assert got == {"before": 2, "old view": True, "new view": True, "thread": False, "after": 1,
                       "value": 2.0, "known": 0}


def _mapped_segments() -> int:
    with open("/proc/self/maps") as f:
        return sum("/dev/shm/dt-" in line for line in f)


def _reset_unmaps() -> list[int]:
    transport.reset()
    import gc

    gc.collect()  # an earlier run's shared buffers (dt.shm_empty) still referenced stay mapped
    baseline = _mapped_segments()
    dt.all_reduce(torch.ones(4))  # connected: the group's segment mapped
    before = _mapped_segments()
    transport.reset()
    return [baseline, before, _mapped_segments()]


def test_reset_unmaps_the_segment_at_once(run):
    for baseline, before, after in run(2, _reset_unmaps):
        assert before >= baseline + 1 and after == baseline, (baseline, before, after)


def _precedence() -> list:
    """Every source of the timeout set at once, then taken away from the top: the next one wins."""
    given = dist.new_group(timeout=datetime.timedelta(seconds=2))
    saved = os.environ.get("DT_TIMEOUT")
    seen = []
    try:
        settings.set_timeout(3)
        os.environ["DT_TIMEOUT"] = "4"
        settings.set_launcher_timeout(5)
        with settings.call_timeout(1):
            seen.append(settings.timeout_for(given))
        seen.append(settings.timeout_for(given))
        seen.append(settings.timeout_for(None))  # the launcher's world group: none of its own
        settings.set_timeout(None)
        seen.append(settings.timeout_for(None))
        del os.environ["DT_TIMEOUT"]
        seen.append(settings.timeout_for(None))
        settings.set_launcher_timeout(None)
        seen.append(settings.timeout_for(None))
    finally:
        if saved is not None:
            os.environ["DT_TIMEOUT"] = saved
    return [(float(t), t.source) for t in seen]


def test_the_timeout_precedence(run):
    got = run(1, _precedence)[0]
    assert got == list(zip((1.0, 2.0, 3.0, 4.0, 5.0, settings.DEFAULT_TIMEOUT), settings.TIMEOUT_SOURCES))


@pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None,
                    reason="torchrun (torch.distributed.run) is not installed")
@pytest.mark.timeout(240)
def test_a_second_run_under_torchrun_starts_fresh(tmp_path):
    """Under torchrun the process and its process group outlive a run (LaunchedWorld.run):
    one job, two runs; the second starts as the pool's worker starts one (the careless run
    above, a traffic record left open), keeps the process groups, and leaves no segment."""
    out = tmp_path / "reports.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("DT_HOST", "DT_TIMEOUT", "DT_VALIDATE", "DT_TRANSPORT", "DT_NCCL_RULES")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", str(ROOT / "tests" / "launched_state_script.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(out.read_text())
    for got in reports:
        pid = got.pop("pid")
        assert got == {"source": "the launcher's", "validate": True, "wire": "auto", "connected": False,
                       "threads": 0, "known": 0, "records": 0, "nccl rules": False, "board": True,
                       "value": 2.0, "new view": True, "made kept": True, "left open grew": False,
                       "counted": {"all_reduce": 1, "validate": 1}, "pending names": 0, "my names": []}
        assert not [n for n in os.listdir(DIR) if n.startswith(f"dt-{pid}-")]  # nor after it exited


_EXIT_WITH_A_BUSY_THREAD = """
import sys, time, torch, torch.distributed as dist
from dt.transport.asynchronous import submit
from dt.transport.group import resolve_group
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
group = resolve_group(None)
x = torch.randn(1_000_000)

def busy():  # a collective's torch ops, for a second
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        x.mul(2).add_(1)

running = submit(group, "busy", busy, async_op=True)
queued = submit(group, "queued", lambda: open(sys.argv[1], "w").close(), async_op=True)
time.sleep(0.2)  # the thread is inside busy's ops
sys.exit(3)
"""


def test_a_process_that_exits_while_its_communication_thread_runs_exits_cleanly(tmp_path):
    """A daemon thread still inside torch's C++ when the interpreter finalizes is killed there and the
    process aborts ("terminate called without an active exception", SIGABRT) instead of exiting with its
    own code: a survivor whose peer died exits while its queued collectives fail one by one. At exit
    the running collective is waited for and the queued ones are not run."""
    ran = tmp_path / "queued-ran"
    done = subprocess.run([sys.executable, "-c", _EXIT_WITH_A_BUSY_THREAD, str(ran)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 3, done.stderr[-2000:]
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
    assert not ran.exists(), "a collective queued behind the running one ran at exit"


_PAST: dict[str, object] = {}  # a plain group one run made, kept past it (as a careless cache would)


def _keep_a_plain_group() -> bool:
    _PAST["group"] = dist.new_group([0, 1])
    return True


def _use_the_kept_group() -> str:
    try:
        dt.all_reduce(torch.ones(2), group=_PAST["group"])
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_a_past_runs_plain_group_used_again_is_named_not_a_key_error(run):
    assert run(2, _keep_a_plain_group) == [True, True]
    for said in run(2, _use_the_kept_group):
        assert "made by a past run" in said and "shared_group" in said, said
