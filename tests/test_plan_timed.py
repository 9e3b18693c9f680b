"""dt plan on this machine: dt train's real layers and Adam timed at one rank's shapes (dt.plan.timed)."""

from __future__ import annotations

import pytest

from dt.plan.cluster import catalogue_cluster, local_cluster
from dt.plan.compute import layer_flops, stage_compute
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.optimizer import adam_step_seconds, adam_tensors
from dt.plan.stage import stage_tensors, stage_work
from dt.plan.step_model import stage_groups
from dt.plan.timed import adam_seconds, stage_module

TINY = ModelShape(4, 4, 64, 44)


@pytest.mark.parametrize("lay,stage", [(Layout(), 0), (Layout(tp=2), 0), (Layout(tp=4), 0),
                                       (Layout(pp=2), 0), (Layout(pp=2), 1), (Layout(pp=4), 3),
                                       (Layout(tp=2, pp=4), 2)])
def test_the_timed_stage_holds_the_numbers_the_plan_prices(lay, stage):
    """The module timed is the rank's shard: as many numbers as stage_tensors counts, to the one."""
    tensors = stage_tensors(TINY, lay, 32, stage)
    module = stage_module(TINY.n_embd, TINY.n_head, TINY.vocab, tokens=32, tp=lay.tp, blocks=tensors.blocks,
                          head=tensors.head, embed=tensors.embed)
    assert sum(p.numel() for p in module.parameters()) == sum(tensors.dense)


def test_adam_steps_each_tensor_without_zero_and_one_flat_shard_with_it():
    c = local_cluster(2)
    lay = Layout(dp=2)
    w = stage_work(c, TINY, lay, stage_groups(lay)[0], 16, 32, 0)
    assert adam_tensors(lay, w.dense, w.experts, w.fsdp, 2) == tuple(w.dense)
    assert len(w.dense) == 52  # 4 blocks x 12 + 4
    psi = sum(w.dense)
    assert adam_tensors(Layout(dp=2, zero=1), w.dense, w.experts, w.fsdp, 2) == ((psi + 1) // 2,)
    assert adam_tensors(Layout(dp=4, zero=2), w.dense, w.experts, w.fsdp, 4) == (-(-psi // 4),)


def test_adam_costs_per_tensor_here_and_its_bytes_on_a_catalogue_device():
    many = adam_seconds((256,) * 52, 1, "float32")
    flat = adam_seconds((52 * 256,), 1, "float32")
    assert many > 5 * flat  # ten ops per tensor (measured about 40x): fixed costs, not bytes
    c = catalogue_cluster("h100", 1, 4, precision="fp32")
    lay = Layout(dp=4, zero=1)
    w = stage_work(c, TINY, lay, stage_groups(lay)[0], 16, 32, 0)
    psi = sum(w.dense)
    # memory-bound on the device: per number of this rank's ZeRO-1 shard it reads the gradient, the
    # weight and both moments and writes the weight and both moments, 7 float32s (in fp32 the
    # weights are their own master: dt.cost.kernels.optimizer_bytes); the shard alone is stepped
    want = 7 * 4 * -(-psi // 4) / c.mem_bw
    assert adam_step_seconds(c, lay, w, 4) == pytest.approx(want)


def test_recompute_adds_the_blocks_forward_to_backward():
    c = local_cluster(2)
    stage = {"sequences": 8, "tokens": 32, "keys": 32, "tp": 1, "world": 2, "blocks": 4, "head": True,
             "embed": True}
    fwd, bwd = stage_compute(c, TINY, **stage)
    fwd_rc, bwd_rc = stage_compute(c, TINY, **stage, recompute=True)
    blocks_fwd, _ = layer_flops(TINY, 32, 1, 8, 1, 1, False)
    head, _ = layer_flops(TINY, 32, TINY.n_layer + 1, 8, 1, 1, False)
    blocks = 4 * blocks_fwd
    assert fwd_rc == fwd and fwd > 0
    assert bwd_rc - bwd == pytest.approx(fwd * blocks / (blocks + head))


def test_recompute_layouts_are_the_ones_dt_train_accepts_with_recompute():
    from dt.plan.check import train_argv
    from dt.plan.layouts import enumerate_layouts
    from dt.train.cli import parse_args

    planned = [lay for lay in enumerate_layouts(TINY, 2, 16, 32, recompute=("none", "full"))
               if lay.recompute == "full"]
    assert planned
    for lay in planned:
        assert parse_args(train_argv(lay, TINY, 16, 32, steps=1)).recompute, lay.name()


def test_the_memory_check_adds_the_shared_buffers_the_dispatch_counter_cannot_see():
    """DDP's buckets and ZeRO's flat buffers are torch.frombuffer views of shared memory: LiveBytes
    never sees them made, so --check adds each storage the parameters or gradients live in once."""
    import mmap

    import torch

    from dt.device_memory import LiveBytes
    from dt.plan.check import shared_bytes

    mm = mmap.mmap(-1, 4096)
    with LiveBytes() as live:
        flat = torch.frombuffer(mm, dtype=torch.float32, count=1000)  # 4000 bytes, as dt.shm_empty makes
        a, b = torch.nn.Parameter(torch.zeros(10)), torch.nn.Parameter(torch.zeros(20))
        a.grad, b.grad = flat[:10].view_as(a), flat[10:30].view_as(b)  # two views: one storage
    assert live.peak == 4 * 30  # the two parameters only
    assert shared_bytes([a, b]) == 4000
    assert shared_bytes([torch.nn.Parameter(torch.zeros(5))]) == 0
    del flat, a, b
    mm.close()


@pytest.mark.parametrize("kind,cp", [("ring", 2), ("ring", 4), ("ulysses", 2), ("ulysses", 4)])
def test_the_timed_cp_core_runs_a_cp_rank_s_shapes_forward_and_back(kind, cp):
    """dt.plan.timed_cp: one cp rank's tokens in, the same shape out, a gradient for q, k and v."""
    import torch

    from dt.plan.timed_cp import LocalContextCore

    core = LocalContextCore(kind, 32, cp)
    q, k, v = (torch.randn(2, 4, 32 // cp, 16, requires_grad=True) for _ in range(3))
    out = core(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all()
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == q.shape for t in (q, k, v))


def test_the_timed_cp_core_refuses_a_wrong_share_and_an_unknown_kind():
    import torch

    from dt.plan.timed_cp import LocalContextCore

    with pytest.raises(ValueError, match="ring or ulysses, got 'rign'"):
        LocalContextCore("rign", 32, 2)
    q = torch.randn(1, 4, 32, 16)
    with pytest.raises(ValueError, match="rank 0 of cp 2 holds 16 tokens, got 32"):
        LocalContextCore("ring", 32, 2)(q, q, q)


def test_cp_stages_are_timed_on_dt_s_layers_and_split_by_the_rank_s_flops(monkeypatch):
    """cp's stage: dt.plan.timed.stage_seconds at the rank's tokens, cp and attention kind; the
    seconds split forward / backward by the rank's FLOPs (cp's share), times the turns on the cores."""
    import dt.plan.timed as timed
    from dt.plan import compute

    seen = []

    def fake(*a):
        seen.append(a)
        return (0.03,)

    # the stage's repetitions (stage_timing), timed inside a fresh timing budget
    monkeypatch.setattr(timed, "stage_timing", fake)
    monkeypatch.setattr(timed, "BUDGET", timed.TimingBudget())
    monkeypatch.setattr(compute.os, "cpu_count", lambda: 2)
    fwd, bwd = stage_compute(local_cluster(4), TINY, sequences=16, tokens=8, keys=32, tp=1, world=4, blocks=4,
                             head=True, embed=True, cp_kind="ulysses")
    assert seen == [(64, 4, 44, 16, 8, 1, 4, True, True, 1, "float32", 4, "ulysses", "cpu", "")]
    assert fwd + bwd == pytest.approx(0.03 * 2)  # 4 ranks on 2 cores: each holds one half the time
    f = [layer_flops(TINY, 32, i, 16, 1, 4, False) for i in (1, TINY.n_layer + 1)]
    share = (4 * f[0][0] + f[1][0]) / (4 * sum(f[0]) + sum(f[1]))
    assert fwd == pytest.approx(0.06 * share)
    seen.clear()  # an uneven zig-zag split (30 tokens over 2 x 2 chunks) keeps the stand-in
    stage_compute(local_cluster(2), TINY, sequences=16, tokens=15, keys=30, tp=1, world=2, blocks=4,
                  head=True, embed=True)
    assert seen == []


def test_ddp_hooks_are_a_dp_span_of_the_synchronised_step_only_under_ddp(monkeypatch):
    """DDP's hooks (dt.plan.timed.ddp_hook_seconds, timed with and without DDP on one rank) enter
    the timeline as one dp span after the backward, for DDP layouts with dp x cp > 1 only."""
    import dt.plan.timed as timed
    from dt.plan.step_model import predict

    monkeypatch.setattr(timed, "ddp_hook_seconds", lambda *a: 0.004)
    c = local_cluster(2)
    ddp = predict(c, TINY, Layout(dp=2), 16, 32, timelines=True)
    span = [s for line in ddp.timelines.values() for s in line if s.label.startswith("DDP hooks")]
    assert len(span) == 1 and span[0].kind == "dp"
    assert span[0].end - span[0].start == pytest.approx(0.004 * compute_turns(2))
    for lay in (Layout(dp=2, zero=1), Layout(pp=2), Layout(tp=2)):
        w = stage_work(c, TINY, lay, stage_groups(lay)[0], 16, 32, 0)
        assert w.hooks == 0.0, lay
    h100 = catalogue_cluster("h100", 1, 2, precision="fp32")
    assert stage_work(h100, TINY, Layout(dp=2), stage_groups(Layout(dp=2))[0], 16, 32, 0).hooks == 0.0


def compute_turns(world: int) -> float:
    from dt.plan.compute import oversubscribed

    return oversubscribed(world)


def test_ddp_hook_seconds_times_real_ddp_on_one_rank():
    """The figure is DDP's wrapper timed on this machine: a number, >= 0, cached per shape."""
    from dt.plan.timed import ddp_hook_seconds

    shape = {"n_embd": 64, "n_head": 4, "vocab": 44, "sequences": 2, "tokens": 8, "tp": 1, "blocks": 1,
             "head": True, "embed": True, "threads": 1, "dtype": "float32"}
    s = ddp_hook_seconds(**shape)
    assert s >= 0.0 and ddp_hook_seconds(**shape) == s


def test_slowest_of_is_the_expected_largest_of_n_draws_from_the_timings():
    """Sorted x_1..x_k: the largest of n draws is x_i with probability (i/k)^n - ((i-1)/k)^n."""
    from dt.plan.timed import slowest_of

    xs = [4.0, 1.0, 3.0, 2.0]
    assert slowest_of(xs, 1) == pytest.approx(2.5)  # one draw: the mean
    assert slowest_of(xs, 2) == pytest.approx((1 * 1 + 2 * 3 + 3 * 5 + 4 * 7) / 16)
    assert slowest_of(xs, 200) == pytest.approx(4.0)  # many ranks: the slowest repetition
    assert slowest_of([5.0] * 7, 8) == pytest.approx(5.0)  # no spread, no wait


def test_the_step_waits_for_the_slowest_rank_s_compute_as_its_timings_spread(monkeypatch):
    """skew = m x (forward + backward compute) x (slowest of the world's ranks / median - 1), a
    span of the tail before the loss's all-reduce; none at world 1 or without a spread."""
    import dt.plan.timed as timed
    from dt.plan.step_model import predict

    spread = (0.010, 0.010, 0.012, 0.014)
    monkeypatch.setattr(timed, "stage_timing", lambda *a, **k: spread)
    monkeypatch.setattr(timed, "stage_seconds", lambda *a, **k: 0.011)
    c = local_cluster(2)
    lay = Layout(dp=2, micro_batches=2)
    p = predict(c, TINY, lay, 16, 32, timelines=True)
    w = stage_work(c, TINY, lay, stage_groups(lay)[0], 16, 32, 0)
    factor = timed.slowest_of(spread, 2) / 0.011
    assert w.slowest == pytest.approx(factor)
    assert p.parts["skew"] == pytest.approx(2 * (w.fwd["compute"] + w.bwd["compute"]) * (factor - 1))
    skew = [s for s in next(iter(p.timelines.values())) if s.kind == "skew"]
    assert len(skew) == 1 and skew[0].end - skew[0].start == pytest.approx(p.parts["skew"])
    assert predict(local_cluster(1), TINY, Layout(), 16, 32).parts["skew"] == 0.0
    monkeypatch.setattr(timed, "stage_timing", lambda *a, **k: (0.011,) * 5)
    assert predict(c, TINY, lay, 16, 32).parts["skew"] == pytest.approx(0.0)
