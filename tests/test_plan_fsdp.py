"""The planner's FSDP (zero 3) against dt train's: each stage's units, the group each runs on, the bytes.

dt train shards each chunk of a stage over the stage's dp x cp group, a tied word table a unit
of its own on both its stages when pp > 1, and each expert's units over its replicas (edp)
(dt.parallel.plan._fully_sharded). The planner's units per stage (dt.plan.stage.fsdp_units) must
be those, so its bytes per rank and step are what TrainStep counts under the data label.
"""

from __future__ import annotations

import pytest

from dt.parallel.mesh import mesh_groups
from dt.parallel.zero.memory import fsdp_gathered_formula
from dt.plan.cluster import catalogue_cluster
from dt.plan.comm import collective_seconds
from dt.plan.layouts import Layout
from dt.plan.memory import peak_bytes
from dt.plan.model import ModelShape, llama_shape
from dt.plan.stage import fsdp_bytes_sent, fsdp_units, stage_tensors, stage_work
from dt.plan.step_model import stage_groups
from tests.test_step import _args
from tests.test_train_layouts import EXPERTS, _stepped

VOCAB = 44  # dt train's corpus (CharData)
RUNS = [("gpt", {"dp": 2, "pp": 2, "zero": 3}), ("gpt", {"dp": 4, "ep": 2, "zero": 3, **EXPERTS}),
        ("gpt", {"dp": 2, "pp": 2, "ep": 2, "zero": 3, **EXPERTS}),
        ("llama", {"dp": 2, "pp": 2, "zero": 3, "schedule": "interleaved", "virtual": 2,
                   "recompute": "full"}),
        ("llama", {"dp": 2, "pp": 2, "zero": 3, "untied": True}), ("gpt", {"dp": 2, "tp": 2, "zero": 3}),
        ("gpt", {"cp": 2, "dp": 2, "zero": 3})]


def _shape(model: str, kw: dict) -> tuple[ModelShape, Layout, int]:
    """The planner's model and layout of a tests.test_step._args run, and its sequence."""
    a = _args(model, **kw)
    if model == "llama":
        shape = llama_shape(a.n_layer, a.n_head, a.n_embd, VOCAB, a.n_kv_head or 0, tied=not a.untied)
    else:
        shape = ModelShape(a.n_layer, a.n_head, a.n_embd, VOCAB, tied=not a.untied, experts=a.experts,
                           top_k=a.top_k)
    lay = Layout(a.dp, a.tp, a.pp, a.cp, a.ep, a.zero, a.schedule, a.virtual, a.micro_batches, a.cp_attention,
                 recompute=a.recompute)
    return shape, lay, a.block_size


def _place(groups: list[list[int]], rank: int) -> tuple[int, int]:
    """(size of `rank`'s group of this kind, its place in it)."""
    mine = next(g for g in groups if rank in g)
    return len(mine), list(mine).index(rank)


def predicted_bytes(model: ModelShape, lay: Layout, seq: int, rank: int, itemsize: int) -> int:
    """The planner's FSDP bytes for `rank` per step: its stage's units over its own groups."""
    g = mesh_groups(lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, False)
    stage = _place(g["pp"], rank)[1]
    (n, at), (r, at_e) = _place(g["dp_cp"], rank), _place(g["edp"], rank)
    units = fsdp_units(model, lay, seq, stage)
    return sum(fsdp_bytes_sent(units, n, r, itemsize, lay.micro_batches, at, at_e))


@pytest.mark.timeout(300)
def test_planned_fsdp_bytes_are_what_dt_train_sends(run):
    results = run(4, _stepped, RUNS, timeout=280)
    for k, (name, kw) in enumerate(RUNS):
        model, lay, seq = _shape(name, kw)
        for rank, r in enumerate(results):
            want = predicted_bytes(model, lay, seq, rank, 8)  # the runs are float64
            assert r[k]["sent"]["data"] == want == r[k]["formula"], (name, kw, rank, r[k]["sent"], want)


def test_each_stage_holds_its_own_chunks_units_and_a_tied_table_on_both():
    model = ModelShape(2, 4, 16, VOCAB)
    c, seq = 16, 8
    block = (2 * c, 3 * c * c + 3 * c, c * c + c, 2 * c, 4 * c * c + 4 * c, 4 * c * c + c)
    one = fsdp_units(model, Layout(dp=2, zero=3), seq, 0)
    assert one.root == VOCAB * c and one.dense == (seq * c, *block, *block, 2 * c)
    two = [fsdp_units(model, Layout(dp=2, pp=2, zero=3), seq, s) for s in range(2)]
    assert two[0].root == two[1].root == 0  # the table a unit of its own on each stage (`separate`)
    assert two[0].dense == (VOCAB * c, seq * c, *block) and two[1].dense == (*block, 2 * c, VOCAB * c)
    for s, u in enumerate(two):  # every number the stage holds, once
        assert sum(u.every) == sum(stage_tensors(model, Layout(dp=2, pp=2, zero=3), seq, s).dense)


def test_experts_units_are_gathered_and_scattered_over_their_replicas():
    model = ModelShape(2, 4, 64, VOCAB, experts=4, top_k=2)
    c = catalogue_cluster("h100", 1, 8)
    lay = Layout(dp=8, ep=2, zero=3)
    g = stage_groups(lay)[0]
    assert len(g.dp_cp) == 8 and len(g.edp) == 4
    u = fsdp_units(model, lay, 32, 0)
    f = model.hidden
    assert u.experts == (64 * f + f, f * 64 + 64) * 2 * model.n_layer  # 2 experts a rank, 2 blocks
    w = stage_work(c, model, lay, g, 64, 32, 0)
    item = c.param_itemsize  # dt's FSDP gathers float32 weights and scatters float32 gradients
    assert item == c.grad_itemsize == 4

    def priced(op: str) -> float:
        return (sum(collective_seconds(c, op, k * item, g.dp_cp) for k in u.plane)
                + sum(collective_seconds(c, op, k * item, g.edp) for k in u.experts))

    # dt's prefetch runs each gather behind the compute before it (what outlasts it is exposed),
    # each reduce-scatter blocks: here the gathers outlast the compute, so every unit's group counts
    gather, cf, cb = priced("all_gather"), w.fwd["compute"], w.bwd["compute"]
    assert gather > max(cf, cb)
    assert w.fwd["dp"] == pytest.approx(gather - cf)
    assert w.bwd["dp"] == pytest.approx(gather - cb + priced("reduce_scatter"))
    plane, experts = fsdp_bytes_sent(u, 8, 4, item, 1)
    assert all(k % 4 == 0 for k in u.experts)  # even shards: each call sends 3 of the 4 (the ring)
    assert experts == sum(3 * 3 * k // 4 * item for k in u.experts) and plane > 0
    mem = peak_bytes(c, model, lay, 64, 32)[0]
    zero1 = peak_bytes(c, model, Layout(dp=8, ep=2, zero=1), 64, 32)[0]
    gathered = fsdp_gathered_formula(u.root, list(u.dense + u.experts), item)  # an fc_in the largest
    assert mem["activations"] == int(zero1["activations"] + gathered)
