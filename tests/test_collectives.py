"""Every dt collective and algorithm against torch.distributed's own result.

Each rank's input is a deterministic function of (case, rank), so where
torch's gloo backend has no equivalent (uneven all_gather / reduce_scatter /
all_to_all lists) every rank can also build the exact expected result itself.
Values are small integers, so sums and products are exact in every dtype and
every reduction order: any difference is a bug, not rounding.

Many cases run inside one worker call (the pool is shared, a call costs a
round trip), and each call returns the list of failures, empty when all pass.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import dt
from dt.collectives import ALGORITHMS

WORLDS = (1, 2, 3, 4, 5, 8)
SIZES = (0, 1, 3, 7, 17, 1000, 65537)
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8, torch.bool)


def data(case: int, rank: int, n: int, dtype: torch.dtype, op: str = "SUM") -> torch.Tensor:
    g = torch.Generator().manual_seed(case * 1009 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if op == "PRODUCT":
        v = torch.randint(1, 3, (n,), generator=g)  # 1 or 2: products stay exact
    elif dtype == torch.uint8:
        v = torch.randint(0, 9, (n,), generator=g)
    else:
        v = torch.randint(-4, 5, (n,), generator=g)
    return v.to(dtype)


def _torch_op(op: str):
    return getattr(dist.ReduceOp, op)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


# ---------------------------------------------------------------------------
# all_reduce / reduce / broadcast
# ---------------------------------------------------------------------------


def _all_reduce_cases() -> list[str]:
    r = dist.get_rank()
    failures = []
    case = 0
    for algo in ("ring", "naive", "auto"):
        for dtype in DTYPES:
            for op in OPS:
                if op == "AVG" and not dtype.is_floating_point:
                    continue
                if dtype == torch.bool and op not in ("MIN", "MAX"):
                    continue
                sizes = SIZES if (dtype == torch.float32 or algo == "ring") else (0, 1, 17, 1000)
                for n in sizes:
                    case += 1
                    x = data(case, r, n, dtype, op)
                    ref = x.clone()
                    dist.all_reduce(ref, op=_torch_op(op))
                    dt.all_reduce(x, op=_torch_op(op), algorithm=algo)
                    if not _same(x, ref):
                        failures.append(f"all_reduce {algo} {dtype} {op} n={n}")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_matches_torch(run, world):
    for failures in run(world, _all_reduce_cases, timeout=240):
        assert failures == []


def _rooted_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    case = 0
    roots = sorted({0, p - 1, p // 2})
    for root in roots:
        for n in SIZES:
            for algo in ("flat", "naive", "ring", "auto"):
                case += 1
                x = data(case, r, n, torch.float32)
                ref = x.clone()
                dist.broadcast(ref, src=root)
                dt.broadcast(x, src=root, algorithm=algo)
                if not _same(x, ref):
                    failures.append(f"broadcast {algo} root={root} n={n}")
            for op in ("SUM", "MAX", "PRODUCT"):
                for algo in ("flat", "naive", "auto"):
                    case += 1
                    x = data(case, r, n, torch.int64, op)
                    ref = x.clone()
                    dist.reduce(ref, dst=root, op=_torch_op(op))
                    before = x.clone()
                    dt.reduce(x, dst=root, op=_torch_op(op), algorithm=algo)
                    expected = ref if r == root else before
                    if not _same(x, expected):
                        failures.append(f"reduce {algo} {op} root={root} n={n}")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_broadcast_and_reduce_match_torch(run, world):
    for failures in run(world, _rooted_cases, timeout=240):
        assert failures == []


# ---------------------------------------------------------------------------
# all_gather / reduce_scatter, even and uneven
# ---------------------------------------------------------------------------


def _uneven(n: int, p: int, i: int) -> int:
    """A per-rank length for uneven shards: zeros, ones, and longer ones mixed."""
    return (n * (i + 1) + i) % (n + 3) if n else 0


def _gather_scatter_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    case = 0
    for n in SIZES:
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            # all_gather_into_tensor: equal shards, torch has it.
            for algo in ["auto", *ALGORITHMS["all_gather_into_tensor"]]:
                case += 1
                x = data(case, r, n, dtype)
                out = torch.empty(n * p, dtype=dtype)
                ref = torch.empty(n * p, dtype=dtype)
                dist.all_gather_into_tensor(ref, x)
                dt.all_gather_into_tensor(out, x, algorithm=algo)
                if not _same(out, ref):
                    failures.append(f"all_gather_into_tensor {algo} {dtype} n={n}")
            # all_gather with a list of equal entries: against torch.
            case += 1
            x = data(case, r, n, dtype)
            outs = [torch.empty(n, dtype=dtype) for _ in range(p)]
            refs = [torch.empty(n, dtype=dtype) for _ in range(p)]
            dist.all_gather(refs, x)
            dt.all_gather(outs, x)
            if not all(_same(a, b) for a, b in zip(outs, refs)):
                failures.append(f"all_gather even {dtype} n={n}")
            # uneven all_gather: every rank can rebuild every input.
            case += 1
            sizes = [_uneven(n, p, i) for i in range(p)]
            x = data(case, r, sizes[r], dtype)
            outs = [torch.empty(s, dtype=dtype) for s in sizes]
            dt.all_gather(outs, x)
            expected = [data(case, i, sizes[i], dtype) for i in range(p)]
            if not all(_same(a, b) for a, b in zip(outs, expected)):
                failures.append(f"all_gather uneven {sizes} {dtype}")
            # reduce_scatter_tensor: equal slices, against torch where gloo has it.
            for op in ("SUM", "MAX"):
                case += 1
                x = data(case, r, n * p, dtype, op)
                out = torch.empty(n, dtype=dtype)
                dt.reduce_scatter_tensor(out, x, op=_torch_op(op))
                full = data(case, 0, n * p, dtype, op)
                for i in range(1, p):
                    other = data(case, i, n * p, dtype, op)
                    full = full + other if op == "SUM" else torch.maximum(full, other)
                if not _same(out, full[r * n:(r + 1) * n].to(dtype)):
                    failures.append(f"reduce_scatter_tensor {op} {dtype} n={n}")
            # uneven reduce_scatter: the input lists agree across ranks in shape.
            case += 1
            sizes = [_uneven(n, p, i) for i in range(p)]
            inputs = [data(case * 31 + i, r, sizes[i], dtype) for i in range(p)]
            keep = [t.clone() for t in inputs]
            out = torch.empty(sizes[r], dtype=dtype)
            dt.reduce_scatter(out, inputs)
            expected = sum(data(case * 31 + r, i, sizes[r], dtype).to(torch.float64)
                           for i in range(p)).to(dtype)
            if not _same(out, expected):
                failures.append(f"reduce_scatter uneven {sizes} {dtype}")
            if not all(_same(a, b) for a, b in zip(inputs, keep)):
                failures.append("reduce_scatter modified its input_list")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_and_reduce_scatter(run, world):
    for failures in run(world, _gather_scatter_cases, timeout=240):
        assert failures == []


# ---------------------------------------------------------------------------
# all_to_all, gather, scatter, barrier
# ---------------------------------------------------------------------------


def _exchange_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    case = 0
    for n in (0, 1, 3, 17, 1000):
        # all_to_all_single with even rows: against torch.
        case += 1
        x = data(case, r, n * p * 2, torch.float32).view(n * p, 2)
        out = torch.empty_like(x)
        ref = torch.empty_like(x)
        dist.all_to_all_single(ref, x)
        dt.all_to_all_single(out, x)
        if not _same(out, ref):
            failures.append(f"all_to_all_single even n={n}")
        # all_to_all_single with uneven splits; block (i -> j) has (i + 2j + n) % 4 rows.
        case += 1
        rows = lambda i, j, n=n: (i + 2 * j + n) % 4  # noqa: E731
        send = [rows(r, j) for j in range(p)]
        recv = [rows(i, r) for i in range(p)]
        x = data(case, r, sum(send) * 3, torch.int64).view(sum(send), 3)
        out = torch.empty(sum(recv), 3, dtype=torch.int64)
        ref = torch.empty_like(out)
        dist.all_to_all_single(ref, x, recv, send)
        dt.all_to_all_single(out, x, recv, send)
        if not _same(out, ref):
            failures.append(f"all_to_all_single uneven n={n}")
        # all_to_all with lists: each rank rebuilds what it should receive.
        case += 1
        sizes = lambda i, j, n=n: (3 * i + j + n) % 5  # noqa: E731
        inputs = [data(case * 97 + r * 13 + j, 0, sizes(r, j), torch.float64) for j in range(p)]
        outs = [torch.empty(sizes(i, r), dtype=torch.float64) for i in range(p)]
        dt.all_to_all(outs, inputs)
        expected = [data(case * 97 + i * 13 + r, 0, sizes(i, r), torch.float64) for i in range(p)]
        if not all(_same(a, b) for a, b in zip(outs, expected)):
            failures.append(f"all_to_all lists n={n}")
        # gather and scatter at each end of the group.
        for root in sorted({0, p - 1}):
            case += 1
            x = data(case, r, n, torch.float32)
            mine = [torch.empty(n) for _ in range(p)] if r == root else None
            theirs = [torch.empty(n) for _ in range(p)] if r == root else None
            dist.gather(x, theirs, dst=root)
            dt.gather(x, mine, dst=root)
            if r == root and not all(_same(a, b) for a, b in zip(mine, theirs)):
                failures.append(f"gather root={root} n={n}")
            case += 1
            pieces = [data(case, i, n, torch.float32) for i in range(p)] if r == root else None
            out, ref = torch.empty(n), torch.empty(n)
            dist.scatter(ref, pieces, src=root)
            dt.scatter(out, pieces, src=root)
            if not _same(out, ref):
                failures.append(f"scatter root={root} n={n}")
    return failures


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_gather_scatter(run, world):
    for failures in run(world, _exchange_cases, timeout=240):
        assert failures == []


def _barrier_holds(delay: float) -> tuple[float, float]:
    """(when rank 0 entered, when this rank left): nobody leaves before rank 0 arrives."""
    r = dist.get_rank()
    dt.barrier()  # line everyone up first
    if r == 0:
        time.sleep(delay)
    entered = time.time()
    dt.barrier()
    return entered, time.time()


@pytest.mark.parametrize("world", (2, 3, 5, 8))
def test_barrier_waits_for_the_last_rank(run, world):
    results = run(world, _barrier_holds, 0.3)
    rank0_entered = results[0][0]
    for _, left in results:
        assert left >= rank0_entered


# ---------------------------------------------------------------------------
# Subgroups, non-contiguous tensors, async, and "no torch collective inside"
# ---------------------------------------------------------------------------


def _subgroup_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    members = [1, 3, 4] if p == 5 else [0, 2]
    group = dist.new_group(members)  # every rank creates every group
    failures = []
    if r not in members:
        return failures
    for n in (0, 1, 7, 1000):
        for algo in ("ring", "naive"):
            x = data(n, r, n, torch.float32)
            ref = x.clone()
            dist.all_reduce(ref, group=group)
            dt.all_reduce(x, group=group, algorithm=algo)
            if not _same(x, ref):
                failures.append(f"subgroup all_reduce {algo} n={n}")
        src = members[-1]  # a global rank, as in torch
        for algo in ("flat", "ring"):
            x = data(n + 1, r, n, torch.float32)
            ref = x.clone()
            dist.broadcast(ref, src=src, group=group)
            dt.broadcast(x, src=src, group=group, algorithm=algo)
            if not _same(x, ref):
                failures.append(f"subgroup broadcast {algo} n={n}")
        x = data(n + 2, r, n, torch.float32)
        outs = [torch.empty(n) for _ in members]
        refs = [torch.empty(n) for _ in members]
        dist.all_gather(refs, x, group=group)
        dt.all_gather(outs, x, group=group)
        if not all(_same(a, b) for a, b in zip(outs, refs)):
            failures.append(f"subgroup all_gather n={n}")
        dt.barrier(group=group)
    return failures


@pytest.mark.parametrize("world", (3, 5))
def test_subgroups_with_global_ranks(run, world):
    for failures in run(world, _subgroup_cases):
        assert failures == []


def _noncontiguous_cases() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    failures = []
    base = data(1, r, 6 * 10, torch.float32).view(6, 10)
    for algo in ("ring", "naive"):
        x = base.clone()
        view = x[:, ::3]  # non-contiguous: the result must land in x itself
        ref = view.contiguous()
        dist.all_reduce(ref)
        dt.all_reduce(view, algorithm=algo)
        if not torch.equal(view, ref) or not torch.equal(x[:, 1::3], base[:, 1::3]):
            failures.append(f"non-contiguous all_reduce {algo}")
    x = base.clone().t()
    ref = x.contiguous()
    dist.broadcast(ref, src=0)
    dt.broadcast(x, src=0)
    if not torch.equal(x, ref):
        failures.append("non-contiguous broadcast")
    outs = [torch.empty(10, 6).t() for _ in range(p)]
    dt.all_gather(outs, base)
    if not all(torch.equal(o, data(1, i, 60, torch.float32).view(6, 10)) for i, o in enumerate(outs)):
        failures.append("non-contiguous all_gather outputs")
    return failures


@pytest.mark.parametrize("world", (1, 3))
def test_non_contiguous_tensors(run, world):
    for failures in run(world, _noncontiguous_cases):
        assert failures == []


def _async_cases() -> list[str]:
    r = dist.get_rank()
    failures = []
    xs = [data(k, r, 1000 + k, torch.float32) for k in range(6)]
    refs = [x.clone() for x in xs]
    for ref in refs:
        dist.all_reduce(ref)
    works = [dt.all_reduce(x, algorithm=("ring", "naive")[k % 2], async_op=True)
             for k, x in enumerate(xs)]
    y = data(99, r, 33, torch.float32)  # a synchronous call queues behind the async ones
    y_ref = y.clone()
    dist.all_reduce(y_ref)
    dt.all_reduce(y)
    for w in works:
        w.wait()
        if not w.is_completed():
            failures.append("wait() returned before completion")
    if not all(torch.equal(a, b) for a, b in zip(xs, refs)) or not torch.equal(y, y_ref):
        failures.append("async results differ from torch")
    return failures


@pytest.mark.parametrize("world", (2, 3))
def test_async_collectives_complete_in_order(run, world):
    for failures in run(world, _async_cases):
        assert failures == []


TORCH_COLLECTIVES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
    "all_gather_object", "broadcast_object_list", "monitored_barrier",
)


def _every_algorithm_without_torch_collectives() -> int:
    """Make torch's collectives raise, then run every dt algorithm of every collective."""
    r, p = dist.get_rank(), dist.get_world_size()
    saved = {name: getattr(dist, name) for name in TORCH_COLLECTIVES}

    def forbidden(*args, **kwargs):
        raise AssertionError("a torch.distributed collective was called inside dt")

    for name in TORCH_COLLECTIVES:
        setattr(dist, name, forbidden)
    calls = 0
    try:
        for algo in ALGORITHMS["all_reduce"]:
            dt.all_reduce(torch.ones(37), algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["broadcast"]:
            dt.broadcast(torch.ones(37), src=p - 1, algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["reduce"]:
            dt.reduce(torch.ones(37), dst=0, algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["all_gather_into_tensor"]:
            dt.all_gather_into_tensor(torch.empty(5 * p), torch.ones(5), algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["all_gather"]:
            dt.all_gather([torch.empty(i + 1) for i in range(p)], torch.ones(r + 1), algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["reduce_scatter"]:
            dt.reduce_scatter(torch.empty(r + 1), [torch.ones(i + 1) for i in range(p)], algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["reduce_scatter_tensor"]:
            dt.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * p), algorithm=algo)
            calls += 1
        for algo in ALGORITHMS["all_to_all"]:
            dt.all_to_all([torch.empty(2) for _ in range(p)], [torch.ones(2) for _ in range(p)],
                          algorithm=algo)
            calls += 1
        dt.all_to_all_single(torch.empty(p), torch.ones(p))
        dt.gather(torch.ones(2), [torch.empty(2) for _ in range(p)] if r == 0 else None, dst=0)
        dt.scatter(torch.empty(2), [torch.ones(2) for _ in range(p)] if r == 0 else None, src=0)
        for algo in ALGORITHMS["barrier"]:
            dt.barrier(algorithm=algo)
            calls += 1
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
    return calls


@pytest.mark.parametrize("world", (2, 3))
def test_no_torch_collective_inside_dt(run, world):
    calls = run(world, _every_algorithm_without_torch_collectives)
    assert calls[0] >= sum(len(v) for k, v in ALGORITHMS.items() if k not in ("gather", "scatter"))
