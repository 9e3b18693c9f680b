"""ZeRO stages 1, 2, 3 follow plain data parallel step for step, and hold and move
exactly the bytes the ZeRO formulas and the cost model say.

One worker call per world size trains every variant for 4 steps
(each step's losses, then the parameters and optimizer state, against DDP's).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import dt
from dt import cost
from dt.collectives import scratch
from dt.cost import memory as comm_memory
from dt.parallel.data_parallel import DistributedDataParallel
from dt.parallel.zero import FullyShardedDataParallel, ShardedOptimizer, ZeroOptimizer, ZeroParts, memory_held

STEPS = 4
BATCH = 30


def _model() -> nn.Module:
    # Odd sizes, and a 2-parameter layer: shards are uneven, some empty at world > 2.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(7, 13), nn.GELU(), nn.Linear(13, 5), nn.GELU(),
                         nn.Linear(5, 1), nn.Linear(1, 1))


OPTIMIZERS = {
    "adam": (torch.optim.Adam, {"lr": 1e-2}, 8),  # K = 8 bytes of state per parameter
    "sgd": (torch.optim.SGD, {"lr": 5e-2, "momentum": 0.9}, 4),
}


def _train(variant: str, opt_name: str) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    scratch.release_all()  # memory() counts the collectives' scratch: start from none
    model = _model()
    if variant == "ddp":
        net = DistributedDataParallel(model, algorithm="ring")
        opt = cls(model.parameters(), **kwargs)
    elif variant in ("zero1", "zero2"):
        net = model
        opt = ZeroOptimizer(model.parameters(), cls, stage=int(variant[-1]), **kwargs)
    else:
        net = FullyShardedDataParallel(model)
        opt = cls(net.parameters(), **kwargs)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 7, generator=g), torch.randn(BATCH, 1, generator=g)
        opt.zero_grad()
        with dt.traffic() as t:
            loss = (net(x.tensor_split(world)[rank]) - y.tensor_split(world)[rank]).pow(2).mean()
            loss.backward()
            opt.step()
        losses.append(loss.item())
    out = {"losses": losses, "sent": t.bytes_sent}
    if variant == "ddp":
        out["memory"] = memory_held(list(model.parameters()), [p.grad for p in model.parameters()], opt)
        out["params"] = {k: v.clone() for k, v in model.state_dict().items()}
        names = [n for n, _ in model.named_parameters()]
        out["optim"] = {names[i]: s for i, s in opt.state_dict()["state"].items()}
    elif variant in ("zero1", "zero2"):
        out["memory"] = opt.memory()
        out["formula"] = opt.formula(OPTIMIZERS[opt_name][2])
        out["params"] = {k: v.clone() for k, v in model.state_dict().items()}
        names = [n for n, _ in model.named_parameters()]
        out["optim"] = {names[i]: s for i, s in opt.state_dict()["state"].items()}
    else:
        out["memory"] = net.memory(opt)
        out["formula"] = net.formula(OPTIMIZERS[opt_name][2])
        out["params"] = net.state_dict()
        out["optim"] = net.optim_state_dict(opt)["state"]
    return out


def _all_variants(optimizers: tuple[str, ...]) -> dict:
    dt.set_validation(False)  # traffic = the ZeRO collectives alone
    return {(v, o): _train(v, o) for o in optimizers for v in ("ddp", "zero1", "zero2", "fsdp")}


def _layers() -> list[int]:
    """Element count of each module's own parameters (stage 3 shards each separately)."""
    return [sum(p.numel() for p in m.parameters(recurse=False))
            for m in _model().modules() if list(m.parameters(recurse=False))]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world,optimizers", [(2, ("adam",)), (3, ("adam", "sgd")), (5, ("adam",))])
def test_zero_matches_data_parallel_and_formulas(run, world: int, optimizers: tuple[str, ...]) -> None:
    results = run(world, _all_variants, optimizers, timeout=180)
    layers = _layers()
    psi = sum(layers)
    for rank, res in enumerate(results):
        # this rank's shard: stages 1-2 split the flat Psi, stage 3 splits each layer
        flat_shard = cost.split_sizes(psi, world)[rank]
        layer_shard = sum(cost.split_sizes(n, world)[rank] for n in layers)
        ring = cost.ring_all_reduce(psi, 4, world, rank).bytes_sent
        stage3 = sum(2 * cost.ring_all_gather(cost.split_sizes(n, world), 4, rank)
                     .bytes_sent + cost.ring_reduce_scatter(cost.split_sizes(n, world),
                                                                  4, rank).bytes_sent
                     for n in layers)
        # The ring reduce-scatter's scratch: two landing buffers of the largest chunk it
        # receives and a pool of the whole input, kept between calls (dt.cost.memory).
        scratch_flat = comm_memory.scratch_held(
            [comm_memory.ring_reduce_scatter_scratch(cost.split_sizes(psi, world), 4, rank)])
        scratch_layers = comm_memory.scratch_held(
            [comm_memory.ring_reduce_scatter_scratch(cost.split_sizes(n, world), 4, rank)
             for n in layers])
        for opt_name in optimizers:
            k = OPTIMIZERS[opt_name][2]
            ddp = res[("ddp", opt_name)]
            expected_memory = {
                "ddp": {"params": 4 * psi, "grads": 4 * psi, "optimizer": k * psi},
                "zero1": {"params": 4 * psi, "grads": 4 * psi, "optimizer": k * flat_shard,
                          "comm_scratch": scratch_flat},
                "zero2": {"params": 4 * psi, "grads": 4 * flat_shard, "optimizer": k * flat_shard,
                          "comm_scratch": scratch_flat},
                "fsdp": {"params": 4 * layer_shard, "grads": 4 * layer_shard,
                         "optimizer": k * layer_shard, "comm_scratch": scratch_layers},
            }
            expected_sent = {"ddp": ring, "zero1": ring, "zero2": ring, "fsdp": stage3}
            for variant in ("ddp", "zero1", "zero2", "fsdp"):
                r = res[(variant, opt_name)]
                where = f"rank {rank} {variant} {opt_name}"
                assert r["memory"] == expected_memory[variant], where
                if variant != "ddp":  # the class's own prediction of what it holds
                    assert r["formula"] == expected_memory[variant], where
                assert r["sent"] == expected_sent[variant], where
                for a, b in zip(r["losses"], ddp["losses"]):
                    assert abs(a - b) <= 1e-5, (where, r["losses"], ddp["losses"])
                for name, v in ddp["params"].items():
                    torch.testing.assert_close(r["params"][name], v, rtol=0, atol=1e-5, msg=where)
                assert set(r["optim"]) == set(ddp["optim"]), where
                for name, st in ddp["optim"].items():
                    for key, v in st.items():
                        torch.testing.assert_close(r["optim"][name][key], v, rtol=0, atol=1e-5,
                                                   msg=f"{where} {name} {key}")


def _accumulation_worker() -> dict:
    """Two backward passes on half batches, then one step, for stages 1-3; and a no_grad forward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(BATCH, 7, generator=g), torch.randn(BATCH, 1, generator=g)
    xs, ys = x.tensor_split(world)[rank], y.tensor_split(world)[rank]
    out = {}
    for variant in ("ddp", "zero1", "zero2", "fsdp"):
        model = _model()
        if variant == "ddp":
            net, opt = DistributedDataParallel(model), torch.optim.Adam(model.parameters(), lr=1e-2)
        elif variant == "fsdp":
            net = FullyShardedDataParallel(model)
            opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        else:
            net = model
            opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=int(variant[-1]), lr=1e-2)
        opt.zero_grad()
        for xm, ym in zip(xs.tensor_split(2), ys.tensor_split(2)):
            ((net(xm) - ym).pow(2).mean() * xm.shape[0] / xs.shape[0]).backward()
        opt.step()
        with torch.no_grad():
            out[variant] = net(x)
    return out


def test_sharded_optimizer_tells_zero_from_a_replicated_optimizer() -> None:
    """The step's "is this ZeRO" question: ZeRO's optimizers answer yes, torch's and dt's Adam no."""
    from dt.train.optim import Adam

    assert issubclass(ZeroOptimizer, ShardedOptimizer) and issubclass(ZeroParts, ShardedOptimizer)
    params = [nn.Parameter(torch.ones(3))]
    assert not isinstance(Adam(params), ShardedOptimizer)
    assert not isinstance(torch.optim.SGD(params, lr=0.1), ShardedOptimizer)


@pytest.mark.timeout(120)
def test_gradient_accumulation_and_no_grad_forward(run) -> None:
    for r in run(3, _accumulation_worker):
        for variant in ("zero1", "zero2", "fsdp"):
            torch.testing.assert_close(r[variant], r["ddp"], rtol=0, atol=1e-5, msg=variant)


def _prefetch_events(prefetch: bool) -> list[list[tuple[str, int]]]:
    """Per step: each unit's gathers (made on demand, or issued ahead), each unit's forward end and its
    backward's reduce-scatter, in the order this rank made them."""
    from dt.parallel.zero import fsdp as fsdp_module
    from dt.parallel.zero import prefetch as prefetch_module

    rank, world = dist.get_rank(), dist.get_world_size()
    net = FullyShardedDataParallel(_model(), prefetch=prefetch)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    unit_of = {id(u): k for k, u in enumerate(net.units)}
    by_size = {sum(u.sizes): k for k, u in enumerate(net.units)}  # _model's units differ in size
    assert len(by_size) == len(net.units)
    events: list[tuple[str, int]] = []
    gather, scatter = prefetch_module.gather_into, fsdp_module.reduce_scatter

    def logged_gather(full, unit, algorithm, async_op=False):  # noqa: ANN001, ANN202
        events.append(("ahead" if async_op else "gather", unit_of[id(unit)]))
        return gather(full, unit, algorithm, async_op)

    def logged_scatter(out, inputs, *args, **kwargs):  # noqa: ANN001, ANN202
        events.append(("scattered", by_size[sum(t.numel() for t in inputs)]))
        return scatter(out, inputs, *args, **kwargs)

    prefetch_module.gather_into, fsdp_module.reduce_scatter = logged_gather, logged_scatter
    for k, u in enumerate(net.units):
        u.module.register_forward_hook(lambda m, a, out, k=k: events.append(("computed", k)))
    g = torch.Generator().manual_seed(1)
    steps = []
    try:
        for _ in range(3):
            x, y = torch.randn(BATCH, 7, generator=g), torch.randn(BATCH, 1, generator=g)
            opt.zero_grad()
            (net(x.tensor_split(world)[rank]) - y.tensor_split(world)[rank]).pow(2).mean().backward()
            opt.step()
            steps.append(list(events))
            events.clear()
    finally:
        prefetch_module.gather_into, fsdp_module.reduce_scatter = gather, scatter
    return steps


@pytest.mark.timeout(120)
def test_fsdp_prefetch_issues_each_gather_behind_the_unit_before(run) -> None:
    """Forward: unit k's gather is issued before unit k - 1 has computed (from the second forward on:
    the first records the order); backward: unit k - 1's regather before unit k's reduce-scatter.
    Every unit but the first of each pass gathers ahead; without prefetch, none does."""
    n = len(_layers())
    for rank in run(2, _prefetch_events, True):
        first, *later = rank
        forward = first[:first.index(("computed", n - 1)) + 1]
        assert [e for e in forward if e[0] != "computed"] == [("gather", k) for k in range(n)]  # recorded
        for step in later:
            end = step.index(("computed", n - 1)) + 1
            forward, backward = step[:end], step[end:]
            for k in range(1, n):
                assert forward.index(("ahead", k)) < forward.index(("computed", k - 1)), (k, step)
                assert backward.index(("ahead", k - 1)) < backward.index(("scattered", k)), (k, step)
            # on demand: the first unit's forward gather and the last unit's regather, nothing else
            assert [e for e in step if e[0] == "gather"] == [("gather", 0), ("gather", n - 1)], step
    for rank in run(2, _prefetch_events, False):
        for step in rank:
            assert not [e for e in step if e[0] == "ahead"]
            assert len([e for e in step if e[0] == "gather"]) == 2 * n  # each blocks, before and after
