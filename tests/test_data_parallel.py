"""DistributedDataParallel: same gradients as one worker on the whole batch, whatever
the world size, algorithm, bucket size or overlap; agrees with torch's own DDP.

Each worker call batches many checks (the pools are shared and start-up is the cost).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import dt
from dt import cost
from dt.collectives import auto
from dt.parallel.data_parallel import DistributedDataParallel, make_buckets

BATCH = 60  # divisible by 1..5
TINY_MB = 1000 / (1024 * 1024)  # ~1000-byte buckets: several buckets on this model


def _model(seed: int = 0, hidden: int = 31) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, hidden), nn.GELU(), nn.Linear(hidden, 17), nn.GELU(),
                         nn.Linear(17, 3))


def _data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 3, generator=g)


def _local(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return t.tensor_split(world)[rank]


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out - y).pow(2).mean()


def _expected_bytes(ddp: DistributedDataParallel, algorithm: str, rank: int, p: int) -> int:
    """dt.cost's bytes for each bucket's all-reduce, on the algorithm auto picks."""
    total = 0
    for b in ddp.buckets:
        n = b.buffer.numel()
        g = dt.transport.resolve_group(None)  # connected by the buckets' all-reduces
        algo = auto.choose("all_reduce", algorithm, n * 4, g)
        total += cost.traffic_for("all_reduce", algo, n, 4, p, rank,
                                  stage_bytes=auto.stage_bytes(g)).bytes_sent
    return total


def _grads_worker(with_torch: bool) -> dict:
    """One backward per (algorithm, overlap, bucket size); grads, stats, bytes vs cost model."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dt.set_validation(False)  # so the step's bytes are the all-reduces' alone
    x, y = _data()
    xs, ys = _local(x, rank, world), _local(y, rank, world)
    out: dict = {}
    for algorithm in ("ring", "naive", "auto"):
        for overlap in (True, False):
            for cap in (25, TINY_MB):
                model = _model()
                ddp = DistributedDataParallel(model, algorithm=algorithm, overlap=overlap,
                                              bucket_cap_mb=cap, first_bucket_mb=min(cap, 1))
                _loss(ddp(xs), ys).backward()
                s = ddp.stats
                out[(algorithm, overlap, cap)] = {
                    "grads": [p.grad.clone() for p in model.parameters()],
                    "collectives": s.collectives, "buckets": len(ddp.buckets),
                    "bytes": s.bytes_sent,
                    "expected_bytes": _expected_bytes(ddp, algorithm, rank, world),
                    "times_ok": min(s.compute_s, s.comm_s, s.exposed_s, s.hidden_s) >= 0,
                }
    if with_torch:
        model = _model()
        ref = torch.nn.parallel.DistributedDataParallel(model)
        _loss(ref(xs), ys).backward()
        out["torch"] = [p.grad.clone() for p in model.parameters()]
    return out


def _reference_grads() -> list[torch.Tensor]:
    model = _model()
    x, y = _data()
    _loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_grads_match_single_worker(run, world: int) -> None:
    ref = _reference_grads()
    results = run(world, _grads_worker, world in (2, 3))
    for rank, res in enumerate(results):
        for key, r in ((k, v) for k, v in res.items() if k != "torch"):
            where = f"rank {rank} {key}"
            for g, e in zip(r["grads"], ref):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, msg=where)
            # every rank holds the same bits (the ring and the root both hand out one result)
            for g, g0 in zip(r["grads"], results[0][key]["grads"]):
                assert torch.equal(g, g0), where
            assert r["bytes"] == r["expected_bytes"], where
            assert r["collectives"] == r["buckets"] and r["times_ok"], where
        for algorithm in ("ring", "naive", "auto"):
            for cap in (25, TINY_MB):
                on, off = res[(algorithm, True, cap)], res[(algorithm, False, cap)]
                assert all(torch.equal(a, b) for a, b in zip(on["grads"], off["grads"]))
            big, tiny = res[(algorithm, True, 25)], res[(algorithm, True, TINY_MB)]
            assert big["collectives"] == 1 and tiny["collectives"] > 1
            if world <= 2:  # a + b is a + b: chunking cannot change a bit
                assert all(torch.equal(a, b) for a, b in zip(big["grads"], tiny["grads"]))
        if "torch" in res:
            for g, t in zip(res[("auto", True, 25)]["grads"], res["torch"]):
                torch.testing.assert_close(g, t, rtol=1e-5, atol=1e-6)


def test_buckets_reverse_order_and_first_bucket() -> None:
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 300, 5, 300, 1000)]
    # first bucket closes at >= 400 bytes, later ones at >= 2000 bytes
    assert make_buckets(params[::-1], 400, 2000) == [[0], [1, 2, 3], [4]]
    assert make_buckets(params, 1 << 20, 1 << 20) == [[0, 1, 2, 3, 4]]


# ---------------------------------------------------------------------------


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(4, 4)
        self.sometimes = nn.Linear(4, 4)
        self.never = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, use: bool) -> torch.Tensor:
        h = self.used(x)
        if use:
            h = h + self.sometimes(x)
        return self.head(torch.tanh(h))


def _behaviour_worker() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    x, y = _data()
    xs, ys = _local(x, rank, world), _local(y, rank, world)

    # 1. Replicas from different seeds are bit-identical after 5 steps.
    model = _model(seed=100 + rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=TINY_MB, first_bucket_mb=TINY_MB)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(50 + rank)  # different data on every rank
    for _ in range(5):
        opt.zero_grad()
        _loss(ddp(torch.randn(8, 5, generator=g)), torch.randn(8, 3, generator=g)).backward()
        opt.step()
    ddp.check_replicas_agree()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    if rank == world - 1:
        with torch.no_grad():
            model[2].weight[0, 0] += 1e-3
    try:
        ddp.check_replicas_agree()
        out["mismatch"] = "no error"
    except RuntimeError as exc:
        out["mismatch"] = str(exc)

    # 2. no_sync: two local micro-batches, then a synchronised one = whole batch.
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=TINY_MB, first_bucket_mb=TINY_MB)
    for k, (xm, ym) in enumerate(zip(xs.tensor_split(3), ys.tensor_split(3))):
        if k < 2:
            with ddp.no_sync():
                (_loss(ddp(xm), ym) * xm.shape[0] / xs.shape[0]).backward()
            assert ddp.stats.collectives == 0
        else:
            (_loss(ddp(xm), ym) * xm.shape[0] / xs.shape[0]).backward()
    out["no_sync"] = [p.grad.clone() for p in model.parameters()]

    # 3. Unused parameters: 'sometimes' only on rank 0, 'never' nowhere; nothing hangs.
    model = _Branchy()
    ddp = DistributedDataParallel(model, bucket_cap_mb=TINY_MB, first_bucket_mb=TINY_MB)
    xb = torch.randn(6, 4, generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        model.zero_grad()
        ddp(xb, rank == 0).sum().backward()
    out["unused"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    local = _Branchy()
    local(xb, rank == 0).sum().backward()
    out["unused_local"] = {n: p.grad for n, p in local.named_parameters()}

    # 4. Shape mismatch: a clear error on every rank, naming the parameter.
    try:
        DistributedDataParallel(_model(hidden=31 if rank == 0 else 30))
        out["shape_error"] = "no error"
    except ValueError as exc:
        out["shape_error"] = str(exc)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_replicas_no_sync_unused_and_errors(run, world: int) -> None:
    results = run(world, _behaviour_worker)
    ref = _reference_grads()
    for r in results:
        assert all(torch.equal(a, b) for a, b in zip(r["params"], results[0]["params"]))
        assert f"'2.weight' on rank {world - 1} differs from rank 0" in r["mismatch"], r["mismatch"]
        for g, e in zip(r["no_sync"], ref):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        for name, gr in r["unused"].items():
            assert torch.equal(gr, results[0]["unused"][name]), name
        assert torch.count_nonzero(r["unused"]["never.weight"]) == 0
        torch.testing.assert_close(r["unused"]["sometimes.weight"],
                                   results[0]["unused_local"]["sometimes.weight"] / world)
        assert "0.weight" in r["shape_error"] and "(30, 5)" in r["shape_error"], r["shape_error"]


def _failed_backward_worker() -> dict:
    """A backward whose bucket all-reduce raises, then a good one on the same DDP."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dt.set_validation(False)
    x, y = _data()
    xs, ys = _local(x, rank, world), _local(y, rank, world)
    model = _model()
    ddp = DistributedDataParallel(model, algorithm="no_such_algorithm", bucket_cap_mb=TINY_MB,
                                  first_bucket_mb=TINY_MB)
    try:
        _loss(ddp(xs), ys).backward()
        error = "no error"
    except ValueError as exc:  # raised in a gradient hook: the end-of-backward callback never runs
        error = str(exc)
    model.zero_grad(set_to_none=True)
    ddp.algorithm = "ring"
    _loss(ddp(xs), ys).backward()
    return {"error": error, "grads": [p.grad.clone() for p in model.parameters()],
            "bytes": ddp.stats.bytes_sent, "expected": _expected_bytes(ddp, "ring", rank, world),
            "collectives": ddp.stats.collectives, "buckets": len(ddp.buckets)}


@pytest.mark.parametrize("world", [2, 3])
def test_step_after_a_failed_backward_is_whole(run, world: int) -> None:
    """The failed step's accounting is closed; the next one syncs and counts only its own bytes."""
    ref = _reference_grads()
    for r in run(world, _failed_backward_worker):
        assert "no_such_algorithm" in r["error"], r["error"]
        for g, e in zip(r["grads"], ref):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        assert r["bytes"] == r["expected"] and r["collectives"] == r["buckets"] > 1


@pytest.mark.timeout(120)
def test_bench_ddp_runs(pools, tmp_path) -> None:
    """bench/ddp.py on a tiny model: the reusable measurement and the printed report."""
    import json

    from dt.bench import ddp as bench_ddp

    for impl in ("dt", "torch"):
        r = bench_ddp.measure_data_parallel(2, 8, impl=impl, steps=2, warmup=1, hidden=16, layers=2,
                                            pool=pools(2))
        assert r["step_s"] > 0 and r["steps"] == 2 and r["params"] == 2 * (16 * 16 + 16)
        if impl == "dt":
            assert r["bytes_sent_per_step"] > 0 and r["exposed_comm_s"] >= 0
    out = tmp_path / "ddp.json"
    assert bench_ddp.main(["--world", "2", "--batch", "8", "--steps", "2", "--warmup", "1",
                           "--hidden", "16", "--layers", "2", "--json", str(out)], pool=pools(2)) == 0
    figures = json.loads(out.read_text())["figures"]
    assert {f["bucket_cap_mb"] for f in figures} == {25.0, 4.0}
