"""The planner's gradient sync as dt.train.step.TrainStep runs it: buckets, overlap, ZeRO, clipping."""

from __future__ import annotations

import pytest

from dt.plan.cluster import catalogue_cluster
from dt.plan.comm import collective_seconds
from dt.plan.layouts import Layout, enumerate_layouts, grid
from dt.plan.model import ModelShape
from dt.plan.pipeline import Action
from dt.plan.stage import bucket_bytes, bucket_ready, stage_work
from dt.plan.step_model import predict, stage_groups
from dt.plan.sync import backward_exposed, optimizer_collectives, thread_end

TINY = ModelShape(2, 2, 32, 44)
WIDE = ModelShape(2, 8, 2048, 1000)  # several MB of gradients per block: more than one bucket


def _ddp_buckets(sizes: list[tuple[int, int]]) -> list[int]:
    from torch import nn

    from dt.parallel.data_parallel import DistributedDataParallel

    ddp = DistributedDataParallel(nn.Sequential(*[nn.Linear(a, b) for a, b in sizes]))
    return [sum(t.numel() * t.element_size() for t in b.tensors) for b in ddp.buckets]


@pytest.mark.timeout(120)
def test_the_planned_buckets_are_the_ones_ddp_makes(run):
    sizes = [(512, 1024), (1024, 4096), (4096, 2048), (2048, 64)]
    dense = [n for a, b in sizes for n in (a * b, b)]  # weight, bias: parameter order
    assert bucket_bytes(dense, 4) == run(1, _ddp_buckets, sizes)[0]
    ready = [r for _, r in bucket_ready(dense, 4)]
    assert ready == sorted(ready) and ready[-1] == 1.0  # the last bucket waits for the first layer


def test_the_gradient_thread_runs_buckets_in_order_once_ready():
    # ready at 2 s and 5 s and at the end (10 s): 2 + 3 = 5, 5 + 3 = 8, 10 + 1 = 11: 1 s exposed
    assert thread_end(0.0, 10.0, [(3.0, 0.2), (3.0, 0.5), (1.0, 1.0)]) == pytest.approx(11.0)
    assert thread_end(0.0, 10.0, [(1.0, 0.1)]) == pytest.approx(2.0)  # hidden entirely


def test_ddp_syncs_the_last_micro_batch_zero_2_every_one_and_zero_1_after_backward():
    c = catalogue_cluster("h100", 1, 8)
    acts = [Action("F", 0, i, 2.0 * i, 2.0 * i + 1) for i in range(4)] + \
           [Action("B", 0, i, 10.0 + i, 11.0 + i) for i in range(4)]
    ddp, z1, z2 = Layout(dp=4), Layout(dp=4, zero=1), Layout(dp=4, zero=2)
    g = stage_groups(ddp)[0]
    w = stage_work(c, TINY, ddp, g, 16, 32, 0)
    # dt on a GPU keeps float32 weights under bf16 autocast: its gradients, and so the buckets and
    # ZeRO's collectives, are float32 (Cluster.grad_itemsize 4), not the compute's bf16
    assert (c.itemsize, c.grad_itemsize, c.param_itemsize) == (2, 4, 4)
    total = sum(w.dense) * c.grad_itemsize  # a tiny model: one bucket, ready at backward's end
    assert bucket_bytes(w.dense, c.grad_itemsize) == [total]
    ar = collective_seconds(c, "all_reduce", total, g.dp_cp)
    assert backward_exposed(c, ddp, w, g, acts) == pytest.approx(ar)
    rs = collective_seconds(c, "reduce_scatter", total, g.dp_cp)
    assert backward_exposed(c, z2, w, g, acts) == pytest.approx(4 * rs)
    assert backward_exposed(c, z1, w, g, acts) == 0.0
    before, after = optimizer_collectives(c, z1, w, g)
    assert [charge.seconds for charge in before] == [pytest.approx(rs)] and len(after) == 1
    gather = collective_seconds(c, "all_gather", sum(w.dense) * c.param_itemsize, g.dp_cp, "ring")
    # the float32 weights, gathered after Adam
    assert [charge.seconds for charge in after] == [pytest.approx(gather)]
    assert optimizer_collectives(c, z2, w, g)[0] == [] and optimizer_collectives(c, ddp, w, g) == ([], [])


def test_overlap_hides_the_early_buckets_of_a_wide_model():
    c = catalogue_cluster("h100", 1, 8)
    lay = Layout(dp=8)
    g = stage_groups(lay)[0]
    w = stage_work(c, WIDE, lay, g, 64, 512, 0)
    buckets = bucket_bytes(w.dense, c.grad_itemsize)  # dt's float32 gradients
    assert len(buckets) > 1
    acts = [Action("B", 0, 0, 0.0, 1.0)]  # a long backward: every bucket but the last is hidden
    last = buckets[-1]
    assert backward_exposed(c, lay, w, g, acts) == pytest.approx(
        collective_seconds(c, "all_reduce", last, g.dp_cp))


def test_clipping_adds_its_norm_and_its_pass_and_dt_train_accepts_exactly_those_layouts():
    c = catalogue_cluster("h100", 1, 4)
    base, clipped = predict(c, TINY, Layout(tp=2, pp=2, micro_batches=2), 8, 32), \
        predict(c, TINY, Layout(tp=2, pp=2, micro_batches=2, clip=True), 8, 32)
    assert clipped.parts["norm"] > 0 and base.parts["norm"] == 0 and clipped.step > base.step
    from tests.test_plan import _accepted

    planned = set(enumerate_layouts(TINY, 4, 8, 16, clip=True))
    considered = set(grid(4, 8, clip=True))
    assert planned and any(lay.zero for lay in planned)  # dt train clips under ZeRO too (the shards' norm)
    for lay in considered:
        assert _accepted(lay, TINY, 8, 16) == (lay in planned), lay.name()


def test_dt_train_refuses_in_one_line_what_the_step_refuses(capsys):
    from dt.train.cli import parse_args

    cases = [(["--model", "llama", "--experts", "2"], "--experts are the GPT's")]
    for argv, why in cases:
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        assert e.value.code == 2 and why in capsys.readouterr().err, argv
    parse_args(["--pp", "2", "--zero", "2"])  # tied over two stages: its full gradient kept, summed
    parse_args(["--dp", "2", "--zero", "1", "--clip", "1"])  # the norm from ZeRO's shards


def test_zero_3_gathers_every_unit_twice_and_scatters_it_once_in_the_step():
    from dt.parallel.zero.memory import fsdp_gathered_formula
    from dt.plan.memory import peak_bytes
    from dt.plan.stage import FsdpUnits, fsdp_units

    c = catalogue_cluster("h100", 1, 4)
    lay = Layout(dp=4, zero=3)
    g = stage_groups(lay)[0]
    w = stage_work(c, TINY, lay, g, 16, 32, 0)
    # TINY (C 32, V 44, 2 blocks), T 32: the tied table on the root; wpe; per block ln_1,
    # query_key_value, dense, ln_2, h_to_4h, 4h_to_h (weight + bias each); ln_f
    block = [64, 3 * 32 * 32 + 96, 32 * 32 + 32, 64, 4 * 32 * 32 + 128, 4 * 32 * 32 + 32]
    assert fsdp_units(TINY, lay, 32, 0) == FsdpUnits(44 * 32, (32 * 32, *block, *block, 64))
    assert w.fsdp.every == (44 * 32, 32 * 32, *block, *block, 64) and sum(w.fsdp.every) == sum(w.dense)
    # dt's FSDP gathers its float32 weights and reduce-scatters float32 gradients (Cluster.param_itemsize,
    # grad_itemsize: the weights autocast reads are the optimizer's own)
    gather, grad = c.param_itemsize, c.grad_itemsize
    assert (gather, grad) == (4, 4)
    ag = sum(collective_seconds(c, "all_gather", n * gather, g.dp_cp) for n in w.fsdp.every)
    rs = sum(collective_seconds(c, "reduce_scatter", n * grad, g.dp_cp) for n in w.fsdp.every)
    # dt's FSDP prefetches (dt.parallel.zero.prefetch): each unit's all-gather, in forward and again in
    # backward, runs behind the compute of the unit before it, so only what outlasts the compute is
    # exposed; its reduce-scatters block (the stack's fsdp_scatter_behind is False)
    cf, cb = w.fwd["compute"], w.bwd["compute"]
    assert w.fwd["dp"] == pytest.approx(max(0.0, ag - cf))
    assert w.bwd["dp"] == pytest.approx(max(0.0, ag - cb) + rs) and rs > 0
    acts = [Action("F", 0, 0, 0.0, 1.0), Action("B", 0, 0, 1.0, 2.0)]
    assert backward_exposed(c, lay, w, g, acts) == 0.0 and optimizer_collectives(c, lay, w, g) == ([], [])
    p = predict(c, TINY, lay, 16, 32)
    assert p.parts["dp"] == pytest.approx(w.fwd["dp"] + w.bwd["dp"])  # one micro-batch: what is exposed
    psi = sum(w.dense)
    mem = peak_bytes(c, TINY, lay, 16, 32)[0]
    # dt's float32 weights, gradients and Adam's two moments (4 + 4 + 8 bytes) and autocast's bf16 copy
    # (2), all sharded over the 4 ranks
    assert mem["state"] == int((4 + 4 + 8 + 2) * psi / 4) and mem["buffers"] == 0
    units = fsdp_units(TINY, lay, 32, 0)
    gathered = fsdp_gathered_formula(units.root, list(units.dense), gather)
    # the table and an h_to_4h, with gradients; with prefetch the other block's h_to_4h gathered ahead
    blocking = 2 * gather * (44 * 32 + 4 * 32 * 32 + 128)
    assert gathered == blocking + gather * (4 * 32 * 32 + 128)
    assert fsdp_gathered_formula(units.root, list(units.dense), gather, prefetch=False) == blocking
    zero1 = peak_bytes(c, TINY, Layout(dp=4, zero=1), 16, 32)[0]  # the same activations, no buckets
    assert mem["activations"] == int(zero1["activations"] + gathered)


def test_zero_with_experts_prices_each_part_once_over_the_ranks_that_hold_it():
    from dt.plan.memory import peak_bytes
    from dt.plan.sync import after_backward

    c = catalogue_cluster("h100", 1, 4)
    moe = ModelShape(2, 2, 32, 44, experts=4, top_k=2)
    z1, z2 = Layout(dp=4, ep=2, zero=1), Layout(dp=4, ep=2, zero=2)
    g = stage_groups(z1)[0]
    assert len(g.dp_cp) == 4 and len(g.edp) == 2  # each expert on 2 of the plane's 4 ranks
    w = stage_work(c, moe, z1, g, 16, 32, 0)
    assert w.experts == 2 * 2 * (2 * 32 * 128 + 128 + 32)  # 2 blocks x 2 of the 4 experts
    numbers = [(sum(w.dense), g.dp_cp), (w.experts, g.edp)]
    # float32 gradients scattered, float32 weights gathered: dt keeps both in float32 under autocast
    rs = [collective_seconds(c, "reduce_scatter", n * c.grad_itemsize, group) for n, group in numbers]
    ag = [collective_seconds(c, "all_gather", n * c.param_itemsize, group) for n, group in numbers]
    before, after = optimizer_collectives(c, z1, w, g)
    assert [charge.seconds for charge in before] == pytest.approx(rs)
    assert [charge.seconds for charge in after] == pytest.approx(ag)
    assert after_backward(c, z1, w, g) == [] and after_backward(c, z2, w, g) == []  # not priced twice
    assert after_backward(c, Layout(dp=4, ep=2), w, g)  # without ZeRO the step's own sync
    acts = [Action("B", 0, i, float(i), i + 1e-6) for i in range(4)]  # short backwards: all of it exposed
    # tiny: one dense bucket, one of the experts' (two blocks' worth), each reduce-scattered per backward
    assert backward_exposed(c, z2, w, g, acts) == pytest.approx(4 * sum(rs))
    assert backward_exposed(c, z1, w, g, acts) == 0.0
    assert optimizer_collectives(c, z2, w, g)[0] == []
    mixed = peak_bytes(c, moe, z1, 16, 32)[0]["state"]
    psi_d, psi_e = sum(w.dense), w.experts
    # dt under bf16 autocast: float32 weights and gradients (4 + 4) and the cast bf16 copy (2) whole,
    # Adam's two float32 moments (8) sharded, the dense part over dp x cp, the experts' over edp
    assert mixed == int((4 + 4 + 2) * (psi_d + psi_e) + 8 * (psi_d / 4 + psi_e / 2))


def test_zero_2_keeps_the_tied_table_out_of_the_buckets_and_scatters_it_once():
    from dt.parallel.zero.memory import zero_memory_parts
    from dt.plan.memory import peak_bytes

    c = catalogue_cluster("h100", 1, 4)
    lay = Layout(dp=2, pp=2, zero=2, micro_batches=2)
    item, table = c.grad_itemsize, 44 * 32  # TINY's word table: the embedding's on stage 0, the head's on 1
    mem = peak_bytes(c, TINY, lay, 16, 32)
    for s, g in enumerate(stage_groups(lay)):
        w = stage_work(c, TINY, lay, g, 16, 32, s)
        assert w.tied == table and (w.embed, w.head) == (s == 0, s == 1)
        rest = (sum(w.dense) - table) * item  # one bucket (tiny) without the table
        acts = [Action("B", 0, i, float(i), float(i)) for i in range(2)]  # instant backwards: all exposed
        rs = collective_seconds(c, "reduce_scatter", rest, g.dp_cp)
        assert backward_exposed(c, lay, w, g, acts) == pytest.approx(2 * rs)  # every micro-batch's
        before, after = optimizer_collectives(c, lay, w, g)
        scattered = collective_seconds(c, "reduce_scatter", table * item, g.dp_cp)
        assert [charge.seconds for charge in before] == [pytest.approx(scattered)]
        assert len(after) == 1  # the all-gather of the whole shard
        # dt's float32 weights and gradients, Adam's two moments (4 + 4 + 8 bytes), the table's
        # gradient whole, and autocast's bf16 copy of every weight (2)
        z = zero_memory_parts([(sum(w.dense), 2), (0, 2)], 2, k=8, param_bytes=4, grad_bytes=4, kept=table)
        assert mem[s]["state"] == int(sum(z.values()) + 2 * sum(w.dense))
        assert z["grads"] == 4 * (sum(w.dense) / 2 + table)
    z1 = Layout(dp=2, pp=2, zero=1, micro_batches=2)
    g1 = stage_groups(z1)[0]
    before, _ = optimizer_collectives(c, z1, stage_work(c, TINY, z1, g1, 16, 32, 0), g1)
    assert len(before) == 1  # ZeRO 1 scatters the table with the rest of the flat gradient


def test_zero_memory_holds_the_ring_scratch_and_zero_2_its_buckets_flat_copies():
    from dt.plan.cluster import local_cluster
    from dt.plan.memory import peak_bytes

    c = local_cluster(2, "float32")
    g = stage_groups(Layout(dp=2))[0]
    psi = sum(stage_work(c, TINY, Layout(dp=2), g, 16, 32, 0).dense)
    ddp, z1, z2 = (peak_bytes(c, TINY, Layout(dp=2, zero=z), 16, 32)[0] for z in (0, 1, 2))
    # the ring's reduce-scatter of the flat gradient (one bucket, tiny) keeps its input's size and
    # one of its two chunks: 1.5 x 4 Psi bytes (what ZeroOptimizer.formula and .memory say)
    assert z1["scratch"] == z2["scratch"] == 6 * psi and ddp["scratch"] == 0
    assert z1["buffers"] == z2["buffers"] == 0 and ddp["buffers"] == 4 * psi
    assert z2["activations"] == z1["activations"] + 4 * psi  # every bucket's copy, held to backward's end
    assert z1["peak"] == 12 * psi + 6 * psi + z1["activations"]
