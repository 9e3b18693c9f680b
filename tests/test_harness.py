"""dt/bench/harness.py: the buffers every benchmark times, checked against torch's result.

No timing is asserted (2 shared cores); what is checked is that a BenchCase's call
computes what torch's does for every collective and algorithm, on shapes that
break things (1 element, fewer elements than ranks, primes), that the timing
loop times every call the right number of times in a rotating order, and that
the study's all-reduce worker counts what dt.cost predicts, byte for byte and
message for message.
"""

from __future__ import annotations

import math

import pytest

from dt import cost
from dt.bench import harness as H


def _all_match_torch(counts: list[int]) -> dict[str, int]:
    """Elements that differ from torch's result, per collective:algorithm:mode, this rank."""
    import dt

    dt.set_validation(True)
    out = {}
    for c in H.COLLECTIVES:
        for algo in sorted(dt.ALGORITHMS[H.registry_name(c)]):
            for count in counts:
                case = H.BenchCase(c, count)
                for inplace in (False, True):
                    if case.call(algo, inplace) is None:
                        continue
                    ref = H.BenchCase(c, count)
                    ref.reset()
                    ref.call(H.TORCH, inplace)()
                    case.reset()
                    case.call(algo, inplace)()
                    if not case.has_result:
                        continue  # reduce, gather: only the root's buffer is defined
                    diff = int((case.result(inplace) != ref.result(inplace).clone()).sum())
                    out[f"{c}:{algo}:{int(inplace)}:{count}"] = diff
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_case_matches_torch(run, world):
    for wrong in run(world, _all_match_torch, [1, 3, 7, 64], timeout=200):
        assert wrong and not any(wrong.values()), {k: v for k, v in wrong.items() if v}


OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG")


def _checked_against_the_exact_result(root: int) -> tuple[dict[str, int], dict[str, int]]:
    """(elements wrong after one call, elements wrong with the call left out) per case, this rank:
    every collective, algorithm and torch's, int8, uint8 and float32, every op, rooted at `root`."""
    import torch

    import dt

    called, skipped = {}, {}
    for c in H.COLLECTIVES:
        for algo in [*sorted(dt.ALGORITHMS[H.registry_name(c)]), H.TORCH]:
            for dtype in (torch.int8, torch.uint8, torch.float32):
                for op in OPS if c in ("all_reduce", "reduce", "reduce_scatter") else ("SUM",):
                    if op == "AVG" and not dtype.is_floating_point:
                        continue
                    case = H.BenchCase(c, 61, dtype, op, root=root)  # a prime: uneven blocks
                    for inplace in (False, True):
                        fn = case.call(algo, inplace)
                        if fn is None:
                            continue
                        key = f"{c}:{algo}:{dtype}:{op}:{int(inplace)}"
                        case.prepare_check(inplace)
                        skipped[key] = case.wrong(inplace)
                        case.prepare_check(inplace)
                        fn()
                        called[key] = case.wrong(inplace)
    return called, skipped


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_every_call_gives_the_exact_result_and_a_missing_one_is_counted(run, world):
    root = world - 1  # nccl-tests' -r: any rank, not only 0
    for r, (called, skipped) in enumerate(run(world, _checked_against_the_exact_result, root, timeout=200)):
        assert called and not any(called.values()), {k: v for k, v in called.items() if v}
        if r == root:
            continue  # a broadcast's root already holds its result
        no_result = ("barrier", "reduce:", "gather")  # on a rank other than the root
        missed = {k for k, v in skipped.items() if not v and not k.startswith(no_result)}
        assert not missed, missed  # an unwritten result (poisoned, or the input as it was) is counted


def test_case_shapes():
    case = H.BenchCase("all_gather_into_tensor", 10, p=4, r=1)
    assert case.collective == "all_gather" and case.per == 2 and case.count == 8
    assert case.output.numel() == 8 and case.nbytes == 32
    rs = H.BenchCase("reduce_scatter", 3, p=5, r=0)  # fewer elements than ranks: one each
    assert rs.per == 1 and rs.count == 5 and rs.output.numel() == 1
    assert H.BenchCase("all_reduce", 0, p=2, r=0).count == 0
    assert H.registry_name("all_gather") == "all_gather_into_tensor"
    assert cost.family("reduce_scatter_tensor") == "reduce_scatter"  # the one name rule (was H.base_name)
    g = H.BenchCase("gather", 10, p=4, r=1)  # nccl-tests: the size is the root's whole buffer
    assert g.per == 2 and g.count == 8 and g.output.numel() == 8 and not g.has_result
    sc = H.BenchCase("scatter", 10, p=4, r=1)
    assert sc.per == 2 and sc.count == 8 and sc.output.numel() == 2 and sc.has_result
    assert H.BenchCase("barrier", 4096, p=3, r=0).nbytes == 0  # a barrier moves no data
    assert H.BenchCase("gather", 4, p=2, r=0).call("flat", inplace=True) is None  # out of place only
    with pytest.raises(ValueError, match="no harness"):
        H.BenchCase("send", 4, p=2, r=0)


def test_rotated_and_slope():
    assert [H.rotated("abc", k) for k in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert H.rotated([], 3) == []
    assert H.slope({1: 3.0, 2: 5.0, 4: 9.0}) == pytest.approx(2.0)
    assert H.slope({1: 5.0, 2: 3.0}) == 0.0  # noise never makes bytes free
    assert H.slope({4: 1.0}) == 0.0


def _time_calls_order(reps: int, warmup: int) -> tuple[dict[str, int], list[str]]:
    order: list[str] = []
    calls = {k: (lambda k=k: order.append(k)) for k in "xyz"}
    times = H.time_calls(calls, reps, warmup, reset=lambda: None)
    return {k: len(v) for k, v in times.items()}, order


def test_time_calls_times_each_call_reps_times_in_rotation(run):
    for counts, order in run(2, _time_calls_order, 4, 2):
        assert counts == {"x": 4, "y": 4, "z": 4}
        assert len(order) == 3 * 6
        assert [order[3 * k] for k in range(6)] == list("xyzxyz")  # each round starts one later


def test_gamma_is_a_slope_over_sizes():
    r = H.reduction_seconds_per_byte((1 << 16, 1 << 18), reps=3, sync=False)
    assert set(r.times) == {1 << 16, 1 << 18} and all(t > 0 for t in r.times.values())
    assert r.gamma >= 0 and math.isfinite(r.gamma)
    one = H.reduction_seconds_per_byte((1 << 16,), reps=3, sync=False)
    assert one.gamma == pytest.approx(one.times[1 << 16] / (1 << 16))


def _study_traffic(nbytes: int) -> dict:
    from dt.bench.scaling.workers import collectives_worker

    return collectives_worker(nbytes, ("ring", "naive", "recursive_doubling", "rabenseifner", "gloo"),
                              2, 1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_study_counts_what_the_cost_model_predicts(run, world):
    """Bytes and messages of the study's all-reduce tables: the all-reduce's own, not the barrier's."""
    nbytes = 4 * 1031  # a prime number of float32: uneven shards
    for r, got in enumerate(run(world, _study_traffic, nbytes)):
        assert set(got["times"]) == {"ring", "naive", "recursive_doubling", "rabenseifner", "gloo"}
        assert all(len(t) == 2 for t in got["times"].values())
        assert "gloo" not in got["traffic"]
        for algo, counted in got["traffic"].items():
            want = cost.traffic_for("all_reduce", algo, nbytes // 4, 4, world, r)
            assert counted == {"bytes_sent": want.bytes_sent, "bytes_received": want.bytes_received,
                               "messages_sent": want.messages_sent}, (algo, r)
