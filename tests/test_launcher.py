"""The launcher: results come back, errors come back, nothing hangs."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

import dt
from dt.launcher import WorkerError, run_workers


def _big_tensors(n: int):
    r = dist.get_rank()
    return {"rank": r, "tensor": torch.full((n,), float(r)), "list": [torch.arange(3) * r]}


def test_tensors_come_back_after_the_workers_exit():
    # The queue-pickling trap: a tensor passed as a shared-memory handle
    # blocks the parent once its producer exits. run_workers exits its
    # workers before returning, so this hangs if results are shared, not copied.
    results = run_workers(_big_tensors, 3, 2_000_000, timeout=60)
    for r, res in enumerate(results):
        assert res["rank"] == r
        assert torch.equal(res["tensor"], torch.full((2_000_000,), float(r)))
        assert torch.equal(res["list"][0], torch.arange(3) * r)


def _rank_2_raises():
    if dist.get_rank() == 2:
        raise KeyError("boom on rank two")
    time.sleep(60)  # the others would run on; they must be stopped


def test_first_exception_propagates_with_rank_and_traceback(run):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        run(4, _rank_2_raises, timeout=100)
    err = info.value
    assert err.rank == 2 and err.errors[2].kind == "KeyError"
    assert "boom on rank two" in str(err) and "_rank_2_raises" in str(err)  # traceback included
    assert {err.errors[r].kind for r in (0, 1, 3)} == {"stopped"}
    assert time.monotonic() - start < 30  # stopped after a short grace, not after 60 s


def _rank_1_dies():
    if dist.get_rank() == 1:
        os._exit(3)
    time.sleep(60)


def test_a_dead_worker_is_reported(run):
    with pytest.raises(WorkerError) as info:
        run(2, _rank_1_dies, timeout=100)
    assert info.value.rank == 1
    assert "exited with code 3" in info.value.errors[1].message


def _sleeps(seconds: float):
    time.sleep(seconds)


def test_a_run_past_its_timeout_is_killed(run):
    start = time.monotonic()
    with pytest.raises(WorkerError, match="no result from ranks"):
        run(2, _sleeps, 30, timeout=2)
    assert time.monotonic() - start < 15


def _sum_of_ranks():
    x = torch.tensor([float(dist.get_rank())])
    dt.all_reduce(x)
    return x.item()


def test_two_runs_at_once_do_not_collide():
    # Each run's rendezvous store listens on a port the kernel chose for it.
    results: dict[int, list] = {}

    def go(k):
        results[k] = run_workers(_sum_of_ranks, 2 + k, timeout=60)

    threads = [threading.Thread(target=go, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results == {0: [1.0, 1.0], 1: [3.0, 3.0, 3.0]}
