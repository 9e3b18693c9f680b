"""dt plan --check at world 2: dt train's step measured (time, live-tensor peak, timeline) beside the plan."""

from __future__ import annotations

import json

import pytest

from dt.launcher import launch
from dt.plan.check import chosen, comparison, measure_worker, stage_shapes, train_argv
from dt.plan.cluster import local_cluster
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.search import rank_layouts
from dt.plan.step_model import predict
from dt.plan.trace import write_trace
from dt.train.cli import parse_args

TINY = ModelShape(2, 2, 32, 44)


@pytest.mark.timeout(300)
def test_a_small_check_at_world_2(run, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no shared tune figures read or written
    cluster = local_cluster(2)
    rows = rank_layouts(cluster, TINY, 8, 16).rows
    picked = chosen(rows, 2)
    assert len(picked) == 2
    measured = {}
    for row in picked:
        args = parse_args(train_argv(row.layout, TINY, 8, 16, steps=3))
        shapes = stage_shapes(cluster, TINY, row.layout, 8, 16)
        assert len(shapes) == row.layout.pp and all(shapes)  # dt's GPT: every stage timed here
        timed = run(2, measure_worker, args, 3, False, shapes)
        # the planner's own stage module, timed again inside the run's processes at its shape
        assert all(r["stage_s"] > 0 for r in timed)
        # fresh processes for memory, as --check runs it: a reused worker keeps the collectives'
        # scratch buffers from earlier tests, which this run then never allocates (nor counts)
        mem = launch(measure_worker, 2, args, 2, True, backend="gloo")
        measured[row.layout.name()] = {"step_s": max(r["steps"][-1] for r in timed), "ranks": timed,
                                       "peak_bytes_per_rank": max(r["peak_bytes"] for r in mem),
                                       "stage_ratio": 1.1}
        assert all(len(r["steps"]) == 3 for r in timed)
        # the planner's peak per rank beside the live-tensor peak dt counted (measured: within 10%)
        got = measured[row.layout.name()]["peak_bytes_per_rank"]
        assert row.peak == pytest.approx(got, rel=0.25), (row.layout.name(), row.peak, got)
    text = comparison(picked, measured)
    assert "median |pred - meas| / meas" in text and picked[0].layout.name() in text
    assert "1.10x" in text and "stage run/plan: " in text
    dp = Layout(dp=2)
    args = parse_args(train_argv(dp, TINY, 8, 16, steps=2))
    ranks = run(2, measure_worker, args, 2, False)
    names = {n for r in ranks for _, n, _, _ in r["spans"]}
    # the gradient sync was seen (DDP charges it to its label, dt.parallel.data_parallel), with its times
    assert "data_parallel" in names and "optimizer" in names
    path = tmp_path / "trace.json"
    write_trace(str(path), ranks, predict(cluster, TINY, dp, 8, 16, timelines=True))
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {1, 2}
    assert any(e["pid"] == 1 and e["name"] == "data_parallel" for e in events)
    assert any(e["pid"] == 2 and e["name"].startswith("dp") for e in events)


def test_the_memory_run_counts_the_scratch_other_threads_keep():
    import threading

    import torch

    from dt.collectives.scratch import held_bytes, release, release_all, scratch

    release_all()
    scratch(1000, torch.float32, torch.device("cpu"))  # this thread's: LiveBytes sees it here
    t = threading.Thread(target=lambda: scratch(250, torch.float32, torch.device("cpu"), slot=1))
    t.start()
    t.join()
    try:
        assert held_bytes() == 5000 and held_bytes(other_threads_only=True) == 1000
    finally:
        release()
        release_all()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["dp2.tp1.pp1.z0.1f1b.m2", "dp2.tp1.pp1.z0.1f1b.m4",
                                  "dp1.tp1.pp1.cp2ring.z0.1f1b.m2"])
def test_gradient_accumulation_under_ddp_is_priced_as_measured(name):
    """dt's DDP sums the micro-batches before a step's last in .grad (no_sync) beside the buckets
    sized for the whole gradient: from the first backward on both are live, 13-18% of these
    layouts' peak, which the planner's figure must hold to within 5% of the live-tensor count."""
    from dt.plan.cli import DEFAULT_SHAPE
    from dt.plan.layouts import parse_name
    from dt.plan.memory import peak_bytes

    model, layout, cluster = ModelShape(**DEFAULT_SHAPE), parse_name(name), local_cluster(2)
    predicted = max(stage["peak"] for stage in peak_bytes(cluster, model, layout, 16, 32))
    args = parse_args(train_argv(layout, model, 16, 32, steps=2))
    measured = max(r["peak_bytes"] for r in launch(measure_worker, 2, args, 2, True, backend="gloo"))
    assert predicted == pytest.approx(measured, rel=0.05), (name, predicted, measured)


@pytest.mark.timeout(300)
def test_explain_with_check_runs_that_one_layout_beside_its_plan(tmp_path, monkeypatch, capsys):
    """`dt plan --explain NAME --check`: the named layout's terms, then dt train's run of it (time,
    memory) beside them; one layout, so no order to compare."""
    from dt.plan.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no shared tune figures read or written
    name = "dp2.tp1.pp1.z0.1f1b.m2"
    assert main(["--world", "2", "--global-batch", "8", "--seq", "16", "--explain", name, "--check",
                 "--steps", "2", "--out", str(tmp_path / "timeline.png")]) == 0
    out = capsys.readouterr().out
    measured = [line.split() for line in out.splitlines() if line.startswith(name + " ")]
    assert out.startswith(f"{name}: predicted step") and len(measured) == 1, out
    assert measured[0][-2] == "1/1" and "memory: median" in out and "first ranked" not in out, out
