"""Bad input gets a clear error on every rank involved: never a hang, never a crash.

Each worker here fails on purpose; the pool comes back as WorkerError with
what every rank raised. A failed run restarts its pool, so these tests also
check that the next run on that pool works.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt.launcher import WorkerError


def _raises_everywhere(run, world, fn, *args, timeout=30):
    with pytest.raises(WorkerError) as info:
        run(world, fn, *args, timeout=timeout)
    err = info.value
    assert sorted(err.errors) == list(range(world)), "every rank must report"
    return err


def _mismatched_lengths():
    dt.all_reduce(torch.ones(10 + dist.get_rank()))


@pytest.mark.parametrize("world", (2, 5))
def test_mismatched_lengths_fail_on_every_rank(run, world):
    err = _raises_everywhere(run, world, _mismatched_lengths)
    for e in err.errors.values():
        assert e.kind == "CollectiveError"
        assert "sizes disagree" in e.message and "would send 10 elements" in e.message


def _wrong_list_on_rank_1():
    r, p = dist.get_rank(), dist.get_world_size()
    n = p + 1 if r == 1 else p  # rank 1 passes one tensor too many
    dt.all_gather([torch.empty(3) for _ in range(n)], torch.ones(3))


def test_wrong_list_length_names_the_rank(run):
    err = _raises_everywhere(run, 3, _wrong_list_on_rank_1)
    assert err.rank == 1 and err.errors[1].kind == "ValueError"
    assert "tensor_list has 4 tensors but the group has 3 ranks" in err.errors[1].message
    for r in (0, 2):
        assert "rank(s) [1] rejected their arguments" in err.errors[r].message


def _wrong_dtype_on_rank_0():
    dtype = torch.float64 if dist.get_rank() == 0 else torch.float32
    dt.reduce_scatter(torch.empty(2), [torch.ones(2, dtype=dtype) for _ in range(dist.get_world_size())])


def test_wrong_dtype_in_list(run):
    err = _raises_everywhere(run, 2, _wrong_dtype_on_rank_0)
    assert err.rank == 0 and "input_list[0] has dtype torch.float64" in err.errors[0].message


def _src_out_of_range():
    dt.broadcast(torch.ones(4), src=7)


def test_src_out_of_range(run):
    err = _raises_everywhere(run, 3, _src_out_of_range)
    for e in err.errors.values():
        assert "src=7 is not a rank of the group [0, 1, 2]" in e.message


def _dst_differs():
    dt.reduce(torch.ones(4), dst=dist.get_rank())  # every rank names itself


def test_ranks_disagree_on_root(run):
    err = _raises_everywhere(run, 3, _dst_differs)
    for e in err.errors.values():
        assert "disagree on the root" in e.message


def _different_collectives():
    if dist.get_rank() == 0:
        dt.all_reduce(torch.ones(4))
    else:
        dt.broadcast(torch.ones(4), src=0)


def test_different_collectives_are_named(run):
    err = _raises_everywhere(run, 2, _different_collectives)
    for e in err.errors.values():
        assert "disagree on the collective" in e.message
        assert "all_reduce" in e.message and "broadcast" in e.message


def _avg_on_integers():
    dt.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG)


def test_unsupported_op_for_dtype(run):
    err = _raises_everywhere(run, 2, _avg_on_integers)
    assert "ReduceOp.AVG needs a floating dtype" in err.errors[err.rank].message


def _not_a_member():
    r = dist.get_rank()
    group = dist.new_group([0, 1])
    if r == 2:
        dt.all_reduce(torch.ones(3), group=group)  # rank 2 is not in it
    else:
        x = torch.ones(3)
        dt.all_reduce(x, group=group)
        return x.tolist()


def test_rank_not_in_group(run):
    with pytest.raises(WorkerError) as info:
        run(3, _not_a_member)
    err = info.value
    assert err.rank == 2 and "rank 2 is not a member" in err.errors[2].message
    assert 0 not in err.errors and 1 not in err.errors  # the members were fine


def _unknown_algorithm():
    dt.all_reduce(torch.ones(3), algorithm="telepathy")


def test_unknown_algorithm(run):
    err = _raises_everywhere(run, 2, _unknown_algorithm)
    assert "unknown algorithm 'telepathy'" in err.errors[0].message
    assert "ring" in err.errors[0].message


def _deadlock_without_validation():
    dt.set_validation(False)
    dt.barrier()  # the group is connected (its wires chosen) on every rank
    r = dist.get_rank()
    if r == 0:
        dt.broadcast(torch.ones(1000), src=1, algorithm="flat")  # waits for rank 1's tensor
    # rank 1 never calls it: rank 0 is stuck receiving, rank 1 returns
    # (a send of 4000 bytes would not do: the shared-memory wire buffers it and returns)


def test_deadlock_reports_collective_step_and_peer(run):
    run(2, _fine)  # a warm pool: this module imported, the group connected, before the clock starts
    with pytest.raises(WorkerError) as info:
        run(2, _deadlock_without_validation, timeout=4)
    err = info.value
    stuck = err.errors[0]
    assert stuck.kind == "CollectiveTimeout"
    assert "broadcast[flat] at step 0" in stuck.message
    assert "receive of 4000 bytes from rank 1" in stuck.message


def _first_collective_alone():
    dt.set_validation(False)
    g = dist.new_group([0, 1])  # a group no dt collective has connected yet
    if dist.get_rank() == 0:
        dt.all_reduce(torch.ones(3), group=g)  # its first collective: it connects first


def test_first_collective_alone_times_out_naming_it(run):
    run(2, _fine)  # a warm pool: this module imported before the clock starts
    with pytest.raises(WorkerError) as info:
        run(2, _first_collective_alone, timeout=4)
    stuck = info.value.errors[0]
    assert stuck.kind == "CollectiveTimeout"
    assert "all_reduce" in stuck.message and "connecting the group" in stuck.message
    assert "rank 1" in stuck.message


def _skipped_call():
    r = dist.get_rank()
    dt.all_reduce(torch.ones(5))
    if r != 2:
        dt.all_reduce(torch.ones(5))  # rank 2 never makes this second call


def test_skipped_collective_times_out_naming_the_call_and_peer(run):
    run(3, _fine)  # a warm pool: this module imported, the group connected, before the clock starts
    with pytest.raises(WorkerError) as info:
        run(3, _skipped_call, timeout=4)
    err = info.value
    assert 2 not in err.errors  # rank 2 finished what it called
    for r in (0, 1):
        assert err.errors[r].kind == "CollectiveTimeout"
        assert "validate(all_reduce call" in err.errors[r].message
        assert "rank 2" in err.errors[r].message


def _fine():
    x = torch.ones(4)
    dt.all_reduce(x)
    return x.tolist()


def test_pool_recovers_after_errors(run):
    for world in (2, 3, 5):
        assert run(world, _fine) == [[float(world)] * 4] * world
