"""dt plan --check across simulated hosts: each run on a fresh `dt cluster`, every rank's figures back.

The end-to-end test needs root, ip, tc and unshare (as tests/test_cluster.py), else it is skipped
with the reason; the option checks and the layout's placement need none of them.
"""

from __future__ import annotations

import glob
import operator
import os
import tempfile

import pytest

from dt.launcher.cluster import ClusterError, check_tools, jobs
from dt.launcher.cluster.launch import cluster_launch
from dt.plan import check as check_module
from dt.plan.check import chosen, train_argv
from dt.plan.cli import parse_args as plan_args
from dt.plan.cluster import local_cluster
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.search import rank_layouts
from dt.train.cli import parse_args as train_args
from tests.shm_checks import dt_segments

try:
    check_tools()
    MISSING = ""
except ClusterError as exc:
    MISSING = str(exc)

TINY = ModelShape(2, 2, 32, 44)
JOB_DIRS = f"{tempfile.gettempdir()}/dt-cluster-launch-*"  # cluster_launch's temporary directories


def test_the_run_places_tp_where_the_plan_priced_it():
    for across, order in ((False, "tp-inside"), (True, "tp-across")):
        lay = Layout(dp=2, tp=2, tp_across=across)
        assert train_args(train_argv(lay, TINY, 8, 16, steps=2)).layout == order


def test_check_refuses_a_catalogue_device_across_hosts_and_takes_a_link(capsys):
    with pytest.raises(SystemExit):  # a catalogue device is checked on this host's GPUs alone
        plan_args(["--hosts", "2", "--per-host", "2", "--device", "h100", "--check"])
    assert "drop --hosts" in capsys.readouterr().err
    assert plan_args(["--link", "10Gbit"]).link == 10e9
    assert plan_args([]).link == 1e9  # the rate the cluster records (benchmarks/) were tuned at


@pytest.mark.skipif(bool(MISSING), reason=MISSING)
@pytest.mark.timeout(300)
def test_a_small_check_across_two_simulated_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no shared tune figures read or written
    assert plan_args(["--hosts", "2", "--per-host", "1", "--check"]).check  # root: accepted
    shm, left, dirs = dt_segments(), set(jobs()), set(glob.glob(JOB_DIRS))
    cluster = local_cluster(2, hosts=2)
    rows = rank_layouts(cluster, TINY, 8, 16).rows
    runs: list[list[dict]] = []  # every rank's result of every run, as the cluster brought them back
    real = check_module.launcher

    def recorded(c, link_bits):
        launch = real(c, link_bits)

        def run(fn, world, *args):
            runs.append(launch(fn, world, *args))
            return runs[-1]
        return run

    monkeypatch.setattr(check_module, "launcher", recorded)
    trace = tmp_path / "trace.json"
    measured, text = check_module.check(rows, 1, 2, str(trace), 8, 16, TINY, cluster, 1e9)
    name = chosen(rows, 1)[0].layout.name()
    assert len(runs) == 2, runs  # the timing run and the memory run, each on a cluster of its own
    timed, mem = runs
    assert [r["rank"] for r in timed] == [0, 1] and [r["rank"] for r in mem] == [0, 1]
    assert all(len(r["steps"]) == 2 and r["stage_s"] > 0 for r in timed)
    assert all(r["peak_bytes"] > 0 for r in mem)
    assert measured[name]["step_s"] > 0 and measured[name]["peak_bytes_per_rank"] > 0
    assert name in text and "median |pred - meas| / meas" in text and trace.exists()
    _nothing_left(shm, left, dirs)


@pytest.mark.skipif(bool(MISSING), reason=MISSING)
@pytest.mark.timeout(180)
def test_a_failing_rank_on_the_cluster_is_named_and_nothing_is_left():
    shm, left, dirs = dt_segments(), set(jobs()), set(glob.glob(JOB_DIRS))
    with pytest.raises(RuntimeError, match=r"rank [01] raised ZeroDivisionError"):
        cluster_launch(operator.truediv, 2, 1, 1, 0)  # 1 / 0 on every rank
    _nothing_left(shm, left, dirs)


def _nothing_left(shm: set[str], left: set[str], dirs: set[str]) -> None:
    """No namespace, link, state file or job directory of the runs, no shared-memory segment."""
    assert [j for j in set(jobs()) - left if _ours_or_stale(j)] == []
    assert set(glob.glob(JOB_DIRS)) - dirs == set()
    assert dt_segments() - shm == set()


def _ours_or_stale(job: str) -> bool:
    """A job this process made, or one whose owner is gone (another engineer's live run is neither)."""
    try:
        with open(f"/run/dt-cluster/{job}") as f:
            pid = int(f.read().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return True  # no owner on record, or a dead one: a leftover
    return pid == os.getpid()
