"""The planned path (dt.collectives.plan): a call shape's decisions made once, the per-call work alone.

The first all_reduce of a shape goes the full way and leaves a plan on the group;
the next ones of that shape run the plan's fast path (one_shot, two_shot on the
board). Checked here: the fast path's results against torch's, call after call,
at worlds 2, 3 and 4, validation on and off, with a rank whose tensor lives in
shared memory among plain ones; that it is taken at all (the full path, `launch`,
is not entered); that inside a dt.traffic() block it counts what the full path counts,
field by field; that it steps aside where the full path is needed (a changed DT_ALGO);
and how many of dt's files one call visits (the
reading path the issue bounds: at most 10 files validation off, 14 on).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost
from dt.collectives import api
from dt.transport import resolve_group, set_validation, shared_group
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_collectives import data

FILES_VALIDATION_OFF = 10  # the targets
FILES_VALIDATION_ON = 14
WARM, TRACED = 3, 10  # calls before the traced ones; traced calls (the fewest files counts)


class _CountLaunch:
    """Counts the calls that take the full path (dt.collectives.api.dispatch)."""

    def __init__(self) -> None:
        self.calls, self.real = 0, api.dispatch

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)

    def __enter__(self) -> _CountLaunch:
        api.dispatch = self
        return self

    def __exit__(self, *exc: object) -> None:
        api.dispatch = self.real


def _repeated(validate: bool) -> list[str]:
    """Every shape three times (the second and third on the plan) against torch."""
    set_validation(validate)
    resolve_group(None).links.plans.clear()  # plans an earlier run in this pool made
    r, p = dist.get_rank(), dist.get_world_size()
    bad, case = [], 0
    try:
        for algo in ("auto", "one_shot", "two_shot"):
            for dtype, op in ((torch.float32, "SUM"), (torch.float32, "AVG"), (torch.int32, "MAX"),
                              (torch.bfloat16, "SUM"), (torch.int64, "PRODUCT")):
                for n in (1, 13, 1009, 65537):
                    with _CountLaunch() as full:
                        for _ in range(3):
                            case += 1
                            x = data(case, r, n, dtype, op)
                            ref = x.clone()
                            dist.all_reduce(ref, op=getattr(dist.ReduceOp, op))
                            dt.all_reduce(x, op=getattr(dist.ReduceOp, op), algorithm=algo)
                            if not torch.equal(x, ref):
                                bad.append(f"{algo} {dtype} {op} n={n} call {case}")
                    if full.calls != 1:
                        bad.append(f"{algo} {dtype} {op} n={n}: {full.calls} of 3 calls took the full path")
        # A leaf that requires grad: its data is written, as by the full path and by torch.
        w = torch.ones(1000, requires_grad=True)
        for _ in range(3):
            dt.all_reduce(w)
        if not torch.equal(w.detach(), torch.full((1000,), float(p ** 3))):
            bad.append("a leaf that requires grad")
        # A rank whose tensor is dt.shm_empty's (two_shot publishes it in place) beside
        # ranks on the fast path: they read it where it is, then all close with one more sync.
        for n in (7, 4099):
            y = dt.shm_empty((n,), dtype=torch.float32)
            for _ in range(3):
                case += 1
                x = data(case, r, n, torch.float32)
                ref = x.clone()
                dist.all_reduce(ref)
                mine = y.copy_(x) if r == 0 else x
                dt.all_reduce(mine, algorithm="two_shot")
                if not torch.equal(mine, ref):
                    bad.append(f"two_shot with rank 0 in shared memory n={n} (world {p})")
    finally:
        set_validation(None)
    return bad


@pytest.mark.timeout(330)
@pytest.mark.parametrize("world", (2, 3, 4))
@pytest.mark.parametrize("validate", (False, True))
def test_fast_path_matches_torch_call_after_call(run, world, validate):
    for failures in run(world, _repeated, validate, timeout=300):
        assert failures == [], failures[:10]


def _copies_by_threads(threads: int) -> list[str]:
    """The planned one_shot and two_shot against torch with torch on `threads` intra-op threads:
    1 copies by memmove on the plan's addresses, more by torch's copy_ (dt.transport.shm.board)."""
    set_validation(False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    resolve_group(None).links.plans.clear()
    r, bad = dist.get_rank(), []
    try:
        for algo in ("one_shot", "two_shot"):
            for n in (13, 65537):
                with _CountLaunch() as full:
                    for case in range(3):
                        x = data(case + n, r, n, torch.float32)
                        ref = x.clone()
                        dist.all_reduce(ref)
                        dt.all_reduce(x, algorithm=algo)
                        if not torch.equal(x, ref):
                            bad.append(f"{algo} n={n} call {case}, {threads} threads")
                if full.calls != 1:
                    bad.append(f"{algo} n={n}: {full.calls} of 3 calls took the full path")
    finally:
        torch.set_num_threads(before)
        set_validation(None)
    return bad


@pytest.mark.parametrize("threads", (1, 2))
def test_fast_path_copies_on_one_thread_and_on_more(run, threads):
    for failures in run(2, _copies_by_threads, threads):
        assert failures == [], failures


def _steps_aside() -> dict:
    """A traffic() block keeps the fast path (it counts the call at once); a new DT_ALGO sends
    the call the full way (which re-chooses)."""
    set_validation(False)
    p, n = dist.get_world_size(), 1000
    x = torch.ones(n)
    out: dict = {}
    try:
        dt.all_reduce(x, algorithm="one_shot")  # makes the plans: one_shot asked for,
        dt.all_reduce(x)  # and auto's choice at 4 KB
        with _CountLaunch() as full, dt.traffic() as t:
            dt.all_reduce(x, algorithm="one_shot")
            dt.all_reduce(x, algorithm="one_shot")
        out["counted_calls"] = full.calls
        out["bytes"] = t.bytes_received
        out["model"] = 2 * cost.traffic_for("all_reduce", "one_shot", n, 4, p, dist.get_rank()).bytes_received
        os.environ["DT_ALGO"] = "all_reduce=two_shot"
        try:
            with _CountLaunch() as full:
                dt.all_reduce(x)  # chosen again: DT_ALGO changed since auto's plan was made
                dt.all_reduce(x)  # ... and planned again: the fast path
        finally:
            del os.environ["DT_ALGO"]
        plans = resolve_group(None).links.plans
        key = ("all_reduce", n, torch.float32, dist.ReduceOp.SUM, "auto", torch.strided)
        out["chosen"] = plans[key].algorithm
        out["rechosen_calls"] = full.calls
        out["value"] = x[0].item()
    finally:
        set_validation(None)
    return out


def test_fast_path_counts_traffic_and_steps_aside_for_dt_algo(run):
    for res in run(2, _steps_aside):
        assert res["counted_calls"] == 0  # dt.traffic() open: still the fast path, and it counts
        assert res["bytes"] == res["model"]
        assert res["chosen"] == "two_shot" and res["rechosen_calls"] == 1
        assert res["value"] == 2.0 ** 6  # six all-reduces of ones at world 2


def _files_per_call(validate: bool, nbytes: int) -> dict:
    """dt's files one connected all_reduce visits (rank 0's profile hook), fewest of TRACED calls.

    The fewest: a call whose peer is late also runs the wait's failure checks
    (liveness, the segment's pid check), which belong to waiting, not to the path.
    """
    set_validation(validate)
    root = os.path.dirname(dt.__file__)
    t = torch.ones(nbytes // 4)
    best: set[str] | None = None
    try:
        for _ in range(WARM):
            dt.all_reduce(t)  # connects the group, makes the plan
        for _ in range(TRACED):
            files: set[str] = set()

            def hook(frame, event, arg, files=files):
                if event == "call" and frame.f_code.co_filename.startswith(root):
                    files.add(os.path.relpath(frame.f_code.co_filename, root))

            sys.setprofile(hook)
            try:
                dt.all_reduce(t)
            finally:
                sys.setprofile(None)
            if best is None or len(files) < len(best):
                best = files
    finally:
        set_validation(None)
    return {"files": sorted(best or ()), "value": t[0].item()}


@pytest.mark.parametrize("validate, bound", ((False, FILES_VALIDATION_OFF), (True, FILES_VALIDATION_ON)))
def test_one_call_visits_few_files(run, validate, bound):
    res = run(2, _files_per_call, validate, 256 * 1024)
    assert res[0]["value"] == res[1]["value"] == 2.0 ** (WARM + TRACED)
    files = res[0]["files"]
    assert "collectives/plan.py" in files  # the planned path, not the full one
    assert len(files) <= bound, files


# Python functions one planned all_reduce runs at world 2, validation off, what waiting adds
# not counted (it depends on the peer's timing): measured 18 (one_shot, 4 KiB) and 22
# (two_shot, 256 KiB); 27 and 41 before this round's cuts.
CALLS_BOUND = {4096: 20, 256 * 1024: 24}
# dt.transport.shm.sync's functions that run only when a peer is late or asleep: the wait
# (with all it calls), whether a core is spare to spin on, ringing a sleeping peer's bell.
WAITING = ("wait", "__call__", "futex_wake")


def _python_calls_per_call(nbytes: int) -> dict:
    """Python functions (dt's, torch's, the standard library's) one planned all_reduce calls on
    rank 0, not counting WAITING's (a late peer: the futex, the timeout, the death checks
    belong to waiting); the fewest of TRACED calls."""
    set_validation(False)
    t = torch.ones(nbytes // 4)
    best: list[str] | None = None
    try:
        for _ in range(WARM):
            dt.all_reduce(t)
        for _ in range(TRACED):
            names: list[str] = []
            depth = [0]  # > 0 inside Sync.wait

            def hook(frame, event, arg, names=names, depth=depth):
                code = frame.f_code
                waiting = code.co_name == "wait" and code.co_filename.endswith("shm/sync.py")
                if event == "call":
                    if depth[0] == 0 and not (code.co_name in WAITING
                                              and code.co_filename.endswith("shm/sync.py")):
                        names.append(code.co_name)
                    if waiting or depth[0]:
                        depth[0] += 1
                elif event == "return" and depth[0]:
                    depth[0] -= 1

            sys.setprofile(hook)
            try:
                dt.all_reduce(t)
            finally:
                sys.setprofile(None)
            if best is None or len(names) < len(best):
                best = names
    finally:
        set_validation(None)
    return {"calls": best or [], "value": t[0].item()}


@pytest.mark.parametrize("nbytes", sorted(CALLS_BOUND))  # one_shot, two_shot
def test_one_call_runs_few_python_functions(run, nbytes):
    res = run(2, _python_calls_per_call, nbytes)
    assert res[0]["value"] == res[1]["value"] == 2.0 ** (WARM + TRACED)
    calls = res[0]["calls"]
    assert "run" in calls and "launch" not in calls  # the planned path, not the full one
    assert len(calls) <= CALLS_BOUND[nbytes], calls


def _decided_before_queued() -> dict:
    """Where auto's choice runs for async calls (the caller's thread, before the job is queued),
    and whether a new group is connected by the time its first (async) call returns."""
    import threading

    from dt.collectives import auto

    set_validation(False)
    g = shared_group(range(dist.get_world_size()), "test_fast_path: decided before queued")
    threads: list[str] = []
    real = auto.choose

    def choose(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    auto.choose = choose
    try:
        x = torch.ones(1000)
        work = dt.all_reduce(x, group=g, async_op=True)
        connected = resolve_group(g).links.topology is not None  # before waiting on the work
        work.wait()
        works = [dt.all_reduce(x, group=g, async_op=True, algorithm=a) for a in ("auto", "ring")]
        for w in works:
            w.wait()
    finally:
        auto.choose = real
        set_validation(None)
    return {"connected": connected, "threads": threads, "main": threading.main_thread().name,
            "value": x[0].item()}


def test_the_algorithm_is_chosen_before_the_job_is_queued(run):
    for res in run(2, _decided_before_queued):
        assert res["connected"]  # the first call connected the group on the caller's thread
        assert res["threads"] and set(res["threads"]) == {res["main"]}, res["threads"]
        assert res["value"] == 8.0  # three all-reduces of ones at world 2


FIELDS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received", "calls")


def _counted_alike(validate: bool) -> list[str]:
    """The same call's record, field by field, by the full path (its first call) and the plan's."""
    from dt.transport import charged_to

    set_validation(validate)
    resolve_group(None).links.plans.clear()
    bad = []
    try:
        for algo in ("one_shot", "two_shot"):
            for n in (1, 7, 1000):
                for label in (None, ("tensor", "mine")):
                    records = []
                    for _ in range(2):  # the first makes the plan, the second runs it
                        x = torch.ones(n)
                        with dt.traffic() as t:
                            if label is None:
                                dt.all_reduce(x, algorithm=algo)
                            else:
                                with charged_to(*label):
                                    dt.all_reduce(x, algorithm=algo)
                        kinds = ("by_collective", "by_algorithm", "by_wire")
                        counts = {"total": t, **{f"{kind} {k}": c for kind in kinds
                                                 for k, c in getattr(t, kind).items()}}
                        records.append({k: tuple(getattr(c, f) for f in FIELDS) for k, c in counts.items()})
                    if records[0] != records[1]:
                        diff = {k: (records[0].get(k), records[1].get(k)) for k in {*records[0], *records[1]}
                                if records[0].get(k) != records[1].get(k)}
                        bad.append(f"{algo} n={n} label={label}: full path, plan: {diff}")
    finally:
        set_validation(None)
    return bad


@pytest.mark.parametrize("world", (2, 3))
@pytest.mark.parametrize("validate", (False, True))
def test_fast_path_counts_what_the_full_path_counts(run, world, validate):
    for bad in run(world, _counted_alike, validate):
        assert not bad, bad
