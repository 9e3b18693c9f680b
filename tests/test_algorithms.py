"""Every point-to-point algorithm against torch.distributed, and its traffic against the cost model.

Each world size runs ONE worker call that loops over all cases (sizes 0, 1,
3, 7, 17, 1000, 65537, every op, a few dtypes, two roots) and returns the
failures, so the pool's start-up and the round trips are paid once per world
size rather than once per case. Data are small integers, so every sum and
product is exact and the results must be *equal* to torch's, not close.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost
from dt.collectives import auto
from dt.collectives.registry import names
from dt.collectives.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter

WORLDS = (1, 2, 3, 4, 5, 8)
SIZES = (0, 1, 3, 7, 17, 1000, 65537)
OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
# The registry's point-to-point algorithms, less those another file tests in full (the flat
# ones, "naive" too: tests/test_collectives.py; hierarchical: tests/test_hierarchical.py; the
# load/store ones: tests/test_shm_algorithms.py). A new algorithm joins these by registering.
ELSEWHERE = {"flat", "naive", "hierarchical"}
ALL_REDUCE, ALL_GATHER, BROADCAST, REDUCE = (
    tuple(a for a in names(c, loadstore=False) if a not in ELSEWHERE)
    for c in ("all_reduce", "all_gather", "broadcast", "reduce"))


def _data(n: int, rank: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-2, 3, (n,), generator=g).to(dtype)


def _torch_all_reduce(x: torch.Tensor, op: str) -> torch.Tensor:
    ref = x.clone()
    if op == "AVG":  # gloo has no AVG: sum, then divide once, as dt does
        dist.all_reduce(ref, dist.ReduceOp.SUM)
        return ref / dist.get_world_size()
    dist.all_reduce(ref, getattr(dist.ReduceOp, op))
    return ref


def _correctness_worker() -> list[str]:
    """Run every case on this rank; return a description of each mismatch."""
    r, p = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    for n in SIZES:
        for op in OPS:
            x = _data(n, r, n)
            ref = _torch_all_reduce(x, op)
            for algo in ALL_REDUCE:
                y = x.clone()
                dt.all_reduce(y, op, algorithm=algo)
                if not torch.equal(y, ref):
                    bad.append(f"all_reduce {algo} n={n} {op}")
        for dtype in (torch.int64, torch.float16, torch.bfloat16):
            if n > 1000:
                continue
            x = _data(n, r, n + 1, dtype)
            ref = _torch_all_reduce(x, "SUM") if dtype != torch.bfloat16 else None
            if ref is None:  # gloo has no bfloat16 reduction: reduce in float32
                ref = _torch_all_reduce(x.float(), "SUM").to(dtype)
            for algo in ALL_REDUCE:
                y = x.clone()
                dt.all_reduce(y, "SUM", algorithm=algo)
                if not torch.equal(y, ref):
                    bad.append(f"all_reduce {algo} n={n} {dtype}")
        # all-gather: equal blocks (list and into-tensor) and uneven blocks (list)
        x = _data(n, r, n + 2)
        ref = [torch.empty(n) for _ in range(p)]
        dist.all_gather(ref, x)
        for algo in ALL_GATHER:
            out = [torch.empty(n) for _ in range(p)]
            dt.all_gather(out, x, algorithm=algo)
            if not all(torch.equal(a, b) for a, b in zip(out, ref)):
                bad.append(f"all_gather {algo} n={n}")
            flat = torch.empty(n * p)
            dt.all_gather_into_tensor(flat, x, algorithm=algo)
            if not torch.equal(flat, torch.cat(ref)):
                bad.append(f"all_gather_into_tensor {algo} n={n}")
        sizes = [max(0, n - i) for i in range(p)]  # uneven: n, n-1, ... (0 once n < p)
        mine = _data(sizes[r], r, n + 3)
        ref = [torch.empty(s) for s in sizes]
        _uneven_reference(ref, mine, sizes)
        for algo in ALL_GATHER:
            out = [torch.empty(s) for s in sizes]
            dt.all_gather(out, mine, algorithm=algo)
            if not all(torch.equal(a, b) for a, b in zip(out, ref)):
                bad.append(f"all_gather uneven {algo} n={n}")
        # broadcast and reduce from two roots
        for root in sorted({0, p - 1}):
            x = _data(n, r, n + 4)
            ref = x.clone()
            dist.broadcast(ref, root)
            for algo in BROADCAST:
                y = x.clone()
                dt.broadcast(y, root, algorithm=algo)
                if not torch.equal(y, ref):
                    bad.append(f"broadcast {algo} n={n} root={root}")
            for op in ("SUM", "MAX", "PRODUCT"):
                ref = x.clone()
                dist.reduce(ref, root, getattr(dist.ReduceOp, op))
                for algo in REDUCE:
                    y = x.clone()
                    dt.reduce(y, root, op, algorithm=algo)
                    if r == root and not torch.equal(y, ref):
                        bad.append(f"reduce {algo} n={n} root={root} {op}")
                    if r != root and not torch.equal(y, x):
                        bad.append(f"reduce {algo} n={n} root={root} {op}: non-root tensor written")
    # The pipelined ring with segments much smaller than a chunk (5 elements):
    # reduce-scatter, all-gather and all-reduce through the one engine.
    for n in (17, 1000):
        x = _data(n, r, 7)
        y = x.clone()
        ring_all_reduce(y, "SUM", segment_bytes=20)
        if not torch.equal(y, _torch_all_reduce(x, "SUM")):
            bad.append(f"segmented ring all_reduce n={n}")
        sizes = cost.split_sizes(n, p)
        inputs = list(x.split(sizes))
        out = torch.empty(sizes[r])
        ring_reduce_scatter(out, inputs, "SUM", segment_bytes=20)
        if not torch.equal(out, _torch_all_reduce(x, "SUM").split(sizes)[r]):
            bad.append(f"segmented ring reduce_scatter n={n}")
        got = [torch.empty(s) for s in sizes]
        ring_all_gather(got, inputs[r].clone(), segment_bytes=20)
        ref = [torch.empty(s) for s in sizes]
        _uneven_reference(ref, inputs[r].clone(), sizes)
        if not all(torch.equal(a, b) for a, b in zip(got, ref)):
            bad.append(f"segmented ring all_gather n={n}")
    return bad


def _uneven_reference(out: list[torch.Tensor], mine: torch.Tensor, sizes: list[int]) -> None:
    """torch's all_gather wants equal sizes: pad to the longest, gather, trim."""
    longest = max(sizes)
    padded = torch.zeros(longest)
    padded[: mine.numel()] = mine
    gathered = [torch.empty(longest) for _ in sizes]
    dist.all_gather(gathered, padded)
    for o, g, s in zip(out, gathered, sizes):
        o.copy_(g[:s])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", WORLDS)
def test_algorithms_match_torch(run, world):
    results = run(world, _correctness_worker, timeout=180)
    bad = sorted({b for rank_bad in results for b in rank_bad})
    assert not bad, f"world {world}: {len(bad)} mismatches: {bad[:20]}"


# ---------------------------------------------------------------------------
# Traffic: what the transport counted equals what the cost model says.
# ---------------------------------------------------------------------------


def _traffic_worker() -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []

    def check(label: str, model: cost.Traffic, collective: str, algo: str, fn, *args,
              **kwargs) -> None:
        with dt.traffic() as t:
            fn(*args, **kwargs)
        c = t.by_algorithm[f"{collective}:{algo}"]
        got = (c.bytes_sent, c.bytes_received, c.messages_sent, c.messages_received)
        want = (model.bytes_sent, model.bytes_received, model.messages_sent, model.messages_received)
        if got != want:
            bad.append(f"{label}: measured {got}, model {want}")

    # Every algorithm's model is its record's (cost.traffic_for); the record names the exact
    # function (test_traffic_for_dispatches_to_the_exact_models holds them equal).
    for n in (0, 5, 17, 1000):
        x = _data(n, r, 1)
        for algo in ALL_REDUCE:
            check(f"all_reduce {algo} n={n}", cost.traffic_for("all_reduce", algo, n, 4, p, r),
                  "all_reduce", algo, dt.all_reduce, x.clone(), algorithm=algo)
        check(f"segmented ring n={n}", cost.ring_all_reduce(n, 4, p, r, segment_elems=3),
              "all_reduce", "ring", ring_all_reduce, x.clone(), segment_bytes=12)
        out = torch.empty(n * p)
        sizes = [n + i for i in range(p)]
        for algo in ALL_GATHER:
            check(f"all_gather_into_tensor {algo} n={n}", cost.traffic_for("all_gather", algo, n, 4, p, r),
                  "all_gather_into_tensor", algo, dt.all_gather_into_tensor, out, x, algorithm=algo)
            check(f"all_gather uneven {algo} n={n}", cost.traffic_for("all_gather", algo, sizes, 4, p, r),
                  "all_gather", algo, dt.all_gather, [torch.empty(s) for s in sizes],
                  torch.zeros(sizes[r]), algorithm=algo)
        for root in sorted({0, p - 1}):
            for collective, run, algos in (("broadcast", dt.broadcast, BROADCAST),
                                           ("reduce", dt.reduce, REDUCE)):
                for algo in algos:
                    check(f"{collective} {algo} n={n} root={root}",
                          cost.traffic_for(collective, algo, n, 4, p, r, root=root), collective, algo,
                          run, x.clone(), root, algorithm=algo)
    return bad


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", (2, 3, 5, 8))
def test_traffic_matches_cost_model(run, world):
    results = run(world, _traffic_worker, timeout=100)
    bad = sorted({b for rank_bad in results for b in rank_bad})
    assert not bad, f"world {world}: {bad[:10]}"


def test_cost_model_textbook_bytes():
    """Power-of-two groups, even chunks: the closed forms of the reference table."""
    n, p = 1 << 20, 8
    for r in range(p):
        assert cost.rabenseifner_all_reduce(n, 1, p, r).bytes_sent == 2 * (p - 1) * n // p
        assert cost.rabenseifner_all_reduce(n, 1, p, r).steps == 6
        assert cost.recursive_doubling_all_reduce(n, 1, p, r).bytes_sent == 3 * n
        assert cost.recursive_doubling_all_gather([n // p] * p, 1, r).bytes_sent == (p - 1) * n // p
        assert cost.scatter_allgather_broadcast(n, 1, p, r, 0).steps == 3 + p - 1
    assert cost.binomial_broadcast(n, 1, p, 0, 0).bytes_sent == 3 * n
    assert cost.binomial_broadcast(n, 1, 5, 0, 0).steps == 3
    # Non-power-of-two: the folding pair pays about 2n more.
    assert cost.recursive_doubling_all_reduce(n, 1, 6, 0).steps == 2 + 2
    assert cost.rabenseifner_all_reduce(n, 1, 6, 1).bytes_sent == n + 2 * 3 * n // 4


# ---------------------------------------------------------------------------
# auto, dt model, dt bench collectives
# ---------------------------------------------------------------------------


def _auto_worker(sizes: list[int]) -> list[str]:
    p = dist.get_world_size()
    return [auto.choose(c, "auto", s, p) for c in ("all_reduce", "broadcast", "all_gather", "reduce")
            for s in sizes]


def test_auto_same_choice_on_every_rank(run):
    sizes = [0, 1 << 10, 1 << 16, 1 << 20, 1 << 26]
    for world in (3, 4):
        picks = run(world, _auto_worker, sizes)
        assert all(pk == picks[0] for pk in picks)
        for name, coll in zip(picks[0], [c for c in ("all_reduce", "broadcast", "all_gather", "reduce")
                                         for _ in sizes]):
            assert name in dt.ALGORITHMS[coll]


def test_auto_prefers_latency_then_bandwidth():
    fig = cost.Machine(alpha=5e-6, beta=1 / 450e9, gamma=0.0)
    assert auto.best("all_reduce", 1 << 10, 8, fig) in ("naive", "recursive_doubling")
    assert auto.best("all_reduce", 1 << 30, 8, fig) in ("ring", "rabenseifner")
    assert auto.best("broadcast", 1 << 10, 8, fig) in ("flat", "binomial")
    assert auto.best("broadcast", 1 << 30, 8, fig) in ("scatter_allgather", "ring")


def test_auto_env_override(monkeypatch):
    monkeypatch.setenv("DT_ALGO", "all_reduce=rabenseifner")
    assert auto.choose("all_reduce", "auto", 1 << 20, 4) == "rabenseifner"
    assert auto.choose("all_reduce", "ring", 1 << 20, 4) == "ring"


def test_model_textbook_figures(capsys):
    from dt import whatif

    assert whatif.main(["all_reduce", "--size", "1GB", "--world", "8", "--bandwidth", "450GB/s",
                        "--latency", "5us"]) == 0
    out = capsys.readouterr().out
    assert "ring" in out and "rabenseifner" in out
    est = cost.estimate("all_reduce", "ring", 10**9, 8, alpha=5e-6, beta=1 / 450e9)
    assert est.total == pytest.approx(3.96e-3, rel=0.01)
    assert est.latency == pytest.approx(70e-6) and est.steps == 14
    small = cost.estimate("all_reduce", "ring", 10**6, 8, alpha=5e-6, beta=1 / 450e9)
    assert small.total == pytest.approx(74e-6, rel=0.01)
    assert small.bandwidth == pytest.approx(3.9e-6, rel=0.01)
    assert whatif.parse_size("1GiB") == 1 << 30 and whatif.parse_size("4KB") == 4000
    assert whatif.parse_rate("100Gbit/s") == pytest.approx(12.5e9)
    assert whatif.parse_time("2ms") == pytest.approx(2e-3)


@pytest.mark.timeout(120)
def test_bench_collectives_tiny_sweep(tmp_path):
    import dt.bench.collectives as bc

    out = tmp_path / "r.json"
    assert bc.main(["-b", "1KB", "-e", "4KB", "-f", "4", "-n", "2", "-w", "1", "--world", "2",
                    "--collective", "all_reduce", "--algorithms", "ring,recursive_doubling",
                    "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["results"]
    assert {r["algorithm"] for r in rows} >= {"ring", "recursive_doubling", "torch"}
    assert all(r["wrong"] == 0 for r in rows)
    assert data["machine"]["validation"] is False


def test_traffic_for_dispatches_to_the_exact_models():
    for p in (2, 3, 5, 8):
        for r in range(p):
            assert cost.traffic_for("all_reduce", "ring", 1000, 4, p, r) == \
                cost.ring_all_reduce(1000, 4, p, r)
            assert cost.traffic_for("all_reduce", "recursive_doubling", 1000, 4, p, r) == \
                cost.recursive_doubling_all_reduce(1000, 4, p, r)
            uneven = [3 + i for i in range(p)]
            assert cost.traffic_for("all_gather", "recursive_doubling", uneven, 4, p, r) == \
                cost.recursive_doubling_all_gather(uneven, 4, r)
            assert cost.traffic_for("all_gather", "ring", 7, 4, p, r) == cost.ring_all_gather([7] * p, 4, r)
            assert cost.traffic_for("broadcast", "scatter_allgather", 9, 4, p, r, root=p - 1) == \
                cost.scatter_allgather_broadcast(9, 4, p, r, p - 1)
            assert cost.traffic_for("reduce", "binomial", 9, 4, p, r, root=p - 1) == \
                cost.binomial_reduce(9, 4, p, r, p - 1)
            assert cost.traffic_for("all_reduce", "rabenseifner", 1000, 4, p, r) == \
                cost.rabenseifner_all_reduce(1000, 4, p, r)
            assert cost.traffic_for("all_gather_into_tensor", "bruck", 7, 4, p, r) == \
                cost.bruck_all_gather(7, 4, p)
            assert cost.traffic_for("all_gather", "bruck", [3 + i for i in range(p)], 4, p, r) == \
                cost.ring_all_gather([3 + i for i in range(p)], 4, r)
            assert cost.traffic_for("broadcast", "binomial", 9, 4, p, r, root=p - 1) == \
                cost.binomial_broadcast(9, 4, p, r, p - 1)
