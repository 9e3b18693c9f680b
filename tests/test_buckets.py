"""Gradient buckets (dt.parallel.buckets): the one bucketing rule, and the bucketed all-reduce
against torch's per-tensor all-reduce, byte for byte against dt.cost."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost
from dt.collectives import auto
from dt.parallel.buckets import Bucket, all_reduce_buckets, make_buckets

F32, F64 = torch.float32, torch.float64
# Empty, one element, primes, a matrix, a 3-d block, mixed dtypes: the shapes that break packing.
SHAPES = [((0,), F32), ((1,), F32), ((7,), F64), ((3, 5), F64), ((300,), F32), ((2, 2, 2), F32),
          ((1000,), F64), ((13,), F32)]


def test_make_buckets_closes_on_dtype_change_and_cap() -> None:
    ts = [torch.zeros(10), torch.zeros(10, dtype=F64), torch.zeros(10, dtype=F64), torch.zeros(1)]
    assert make_buckets(ts, 1 << 20, 1 << 20) == [[0], [1, 2], [3]]
    # 40-byte first bucket, then 160: a tensor over the cap sits alone
    ts = [torch.zeros(n) for n in (10, 100, 3, 3)]
    assert make_buckets(ts, 40, 160) == [[0], [1], [2, 3]]
    assert make_buckets([], 40, 160) == []


def test_bucket_slots_are_views_in_order() -> None:
    ts = [torch.arange(6.0).view(2, 3), torch.zeros(0), torch.tensor([7.0])]
    b = Bucket.over(ts)
    assert b.offsets == [0, 6, 6] and b.buffer.numel() == 7 and not b.buffer.any()
    for i, t in enumerate(ts):
        b.slot(i).copy_(t)
    assert b.buffer.tolist() == [0, 1, 2, 3, 4, 5, 7]
    assert b.slot(0).shape == (2, 3)
    b.slot(2).fill_(9)  # a view: writes land in the buffer
    assert b.buffer[-1] == 9


def _bucketed_worker(cap: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    validating = dt.transport.validation_enabled()
    dt.set_validation(False)  # so the bytes counted are the all-reduces' alone
    try:
        g = torch.Generator().manual_seed(rank)
        tensors = [torch.randn(s, generator=g, dtype=d) for s, d in SHAPES]
        averaged = [t.clone() for t in tensors]
        want = [t.clone() for t in tensors]
        for t in want:
            dist.all_reduce(t)
        with dt.traffic() as rec:
            n = all_reduce_buckets(tensors, op=dt.ReduceOp.SUM, cap_bytes=cap)
        avg_n = all_reduce_buckets(averaged, group=None, cap_bytes=cap)  # default op: AVG
    finally:
        dt.set_validation(validating)
    expected = 0
    groups = make_buckets(tensors, cap, cap)
    for idx in groups if world > 1 else []:
        numel = sum(tensors[i].numel() for i in idx)
        item = tensors[idx[0]].element_size()
        g = dt.transport.resolve_group(None)  # connected by the buckets' all-reduces
        algo = auto.choose("all_reduce", "auto", numel * item, g)
        expected += cost.traffic_for("all_reduce", algo, numel, item, world, rank,
                                     stage_bytes=auto.stage_bytes(g)).bytes_sent
    return {"n": n, "avg_n": avg_n, "buckets": len(groups), "got": tensors, "want": want,
            "averaged": averaged, "bytes": rec.bytes_sent, "expected": expected,
            "calls": rec.by_collective["all_reduce"].calls if world > 1 else 0}


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_all_reduce_buckets_matches_torch_and_cost(run, world: int) -> None:
    for cap in (1000, 1 << 20):  # several buckets (and dtype breaks), or one per dtype run
        results = run(world, _bucketed_worker, cap)
        for rank, r in enumerate(results):
            where = f"world {world} cap {cap} rank {rank}"
            for got, want, avg in zip(r["got"], r["want"], r["averaged"]):
                torch.testing.assert_close(got, want, msg=where)
                torch.testing.assert_close(avg, want / world, msg=where)
            for got, got0 in zip(r["got"], results[0]["got"]):
                assert torch.equal(got, got0), where  # every rank holds the same bits
            want_n = 0 if world == 1 else r["buckets"]
            assert r["n"] == r["avg_n"] == r["calls"] == want_n, where
            assert r["bytes"] == r["expected"], where
        if world > 1 and cap == 1000:
            assert results[0]["buckets"] > 3
