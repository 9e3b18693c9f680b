"""dt plan's arithmetic: the layouts dt train accepts, the schedule played out, the step's parts, memory."""

from __future__ import annotations

import json

import pytest

from dt.collectives.auto import candidates
from dt.cost.devices import DEVICES
from dt.cost.levels import Levels
from dt.cost.machine import Machine
from dt.cost.time import estimate
from dt.parallel.pipeline import bubble_fraction
from dt.plan.check import train_argv
from dt.plan.cli import main
from dt.plan.cluster import catalogue_cluster, local_cluster
from dt.plan.comm import collective_seconds
from dt.plan.layouts import Layout, enumerate_layouts, grid
from dt.plan.memory import peak_bytes, state_floor
from dt.plan.model import ModelShape, llama_shape, preset
from dt.plan.pipeline import last_end, play
from dt.plan.stage import stage_tensors
from dt.plan.step_model import predict
from dt.train.cli import parse_args

TINY = ModelShape(4, 4, 64, 44)


def _accepted(lay: Layout, model: ModelShape, batch: int, seq: int) -> bool:
    try:
        parse_args(train_argv(lay, model, batch, seq, steps=1))
    except SystemExit as e:
        assert e.code == 2
        return False
    return True


@pytest.mark.parametrize("world,model,batch,seq", [
    (2, TINY, 16, 32), (4, TINY, 16, 32), (4, ModelShape(2, 2, 32, 44), 6, 8),
    (4, ModelShape(4, 4, 64, 44, experts=4, top_k=2), 8, 16),
    (4, llama_shape(2, 4, 64, 44, n_kv_head=2), 8, 16),
    (4, ModelShape(2, 2, 32, 44, tied=False), 8, 16)])
def test_the_planner_enumerates_exactly_the_layouts_dt_train_accepts(world, model, batch, seq, capsys):
    planned = set(enumerate_layouts(model, world, batch, seq))
    considered = set(grid(world, batch, experts=model.experts))
    assert planned and planned < considered  # some of the grid is refused (odd heads, batch, ...)
    # ZeRO 1-3 are dt train's, with experts too; 3 (FSDP) on a pipeline too
    assert {lay.zero for lay in planned} == {0, 1, 2, 3}
    for lay in considered:
        assert _accepted(lay, model, batch, seq) == (lay in planned), lay.name()
    capsys.readouterr()


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_the_played_schedule_idles_the_bubble_formula(name, v):
    p, m = 4, 8
    played, stash = play(name, p, m, v, (1.0 / v,) * p, (2.0 / v,) * p, 0.0)
    step = last_end(played)
    assert 1 - 3 * m / step == pytest.approx(bubble_fraction(p, m, v))
    # interleaved: Megatron's p v + p - 1 chunks, p (1 + (p-1)/(p v)) micro-batches of the stage's layers
    assert stash[0] == {"gpipe": m, "1f1b": p, "interleaved": p * v + p - 1}[name]


def test_the_parts_sum_to_the_step_and_each_ranks_spans_tile_it():
    c = catalogue_cluster("h100", 2, 4)
    model = preset("gpt2")
    for lay in (Layout(dp=8), Layout(dp=2, tp=2, pp=2, micro_batches=8), Layout(tp=4, pp=2, micro_batches=4,
                schedule="interleaved", virtual=2), Layout(dp=4, cp=2, cp_attention="ulysses"),
                Layout(dp=4, pp=2, zero=1, micro_batches=4, tp_across=False)):
        p = predict(c, model, lay, 32, 1024, timelines=True)
        assert sum(p.parts.values()) == pytest.approx(p.step)
        assert len(p.timelines) == lay.pp
        for spans in p.timelines.values():
            ends = sorted((s.start, s.end) for s in spans)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(ends, ends[1:])), lay.name()
            assert ends[0][0] >= 0 and ends[-1][1] == pytest.approx(p.step)


def test_a_group_inside_a_host_is_priced_by_the_cheapest_cost_model_algorithm():
    m = Machine(alpha=5e-6, beta=1 / 450e9, gamma=0.0)
    c = catalogue_cluster("h100", 1, 8)
    c = type(c)(**{**c.__dict__, "levels": Levels(m, m)})
    for nbytes in (1e3, 1e6, 1e9):
        want = min(estimate("all_reduce", a, nbytes, 8, alpha=m.alpha, beta=m.beta).total
                   for a in candidates("all_reduce", False))
        assert collective_seconds(c, "all_reduce", nbytes, tuple(range(8))) == pytest.approx(want, rel=1e-6)
    ring = estimate("all_reduce", "ring", 1e9, 8, alpha=m.alpha, beta=m.beta).total
    assert ring == pytest.approx(3.96e-3, rel=0.01)  # the seed's worked example
    assert collective_seconds(c, "all_reduce", 1e9, tuple(range(8))) <= ring


def test_a_hosts_network_is_shared_by_its_gpus():
    """--host-network: 4 x 100 Gbit/s for 8 GPUs gives each rank 6.25 GB/s (at the NIC efficiency),
    a quarter of the A100 catalogue's one 25 GB/s NIC per GPU; a data-parallel all-reduce across
    hosts costs more on it, one inside a host the same."""
    wide, narrow = catalogue_cluster("a100", 2, 8), catalogue_cluster("a100", 2, 8, host_network_gbit=400)
    nic = DEVICES["a100"].link_efficiency[1]
    assert wide.levels.inter.beta == pytest.approx(1 / (25e9 * nic))
    assert narrow.levels.inter.beta == pytest.approx(1 / (6.25e9 * nic))
    assert narrow.levels.intra == wide.levels.intra
    across, inside = (0, 8), tuple(range(8))
    def seconds(cluster, group):
        return collective_seconds(cluster, "all_reduce", 1e9, group)

    assert seconds(narrow, across) > 3 * seconds(wide, across)
    assert seconds(narrow, inside) == seconds(wide, inside)


def test_the_state_floor_is_never_above_a_layouts_peak():
    """The search drops a layout whose state alone is over the memory before pricing the rest
    (dt.plan.memory.state_floor): the floor is a lower bound of every micro-batching, schedule and
    recompute's peak, and equals it less activations and scratch."""
    model = preset("gpt2")
    for stack in ("dt", "megatron"):
        c = catalogue_cluster("a100", 2, 4, stack_name=stack)
        for lay in enumerate_layouts(model, 8, 32, 1024, hosts=2, recompute=("none", "full")):
            floor = state_floor(c, model, lay, 1024)
            peaks = peak_bytes(c, model, lay, 32, 1024)
            assert 0 < floor <= max(stage["peak"] for stage in peaks), lay.name()
            assert floor >= max(stage["state"] for stage in peaks), lay.name()


def test_memory_state_is_zeros_formula():
    """fp32 Adam: 16 Psi without ZeRO, 8 Psi + 8 Psi / N with ZeRO-1 (Psi: this rank's parameters)."""
    c = catalogue_cluster("a100", 1, 4, precision="fp32")
    psi = sum(stage_tensors(TINY, Layout(dp=4), 32, 0).dense)
    assert psi == TINY.params(32)  # every weight on the one stage
    zero0 = peak_bytes(c, TINY, Layout(dp=4), 16, 32)[0]["state"]
    zero1 = peak_bytes(c, TINY, Layout(dp=4, zero=1), 16, 32)[0]["state"]
    assert zero0 == 16 * psi
    assert zero1 == 8 * psi + 8 * psi // 4


def test_a_gpus_peak_is_live_bytes_then_fragmentation_then_runtime_each_apart():
    """On a catalogue GPU the peak is nvidia-smi's: the live bytes, the allocator's fragmentation over
    them (the stack's factor) and the runtime (CUDA context, NCCL's buffers); a torch.cuda figure
    counts the first one or two (dt.plan.memory.counted); this machine's processes the live bytes."""
    from dt.cost.stack import stack
    from dt.plan.memory import MEMORY_SCOPES, counted

    nanotron = stack("nanotron")
    c = catalogue_cluster("h100", 1, 8, stack_name="nanotron")
    for row in peak_bytes(c, TINY, Layout(dp=2, pp=2, tp=2, micro_batches=4), 16, 32):
        live = row["state"] + row["scratch"] + max(row["activations"], row["buffers"], row["optimizer"])
        assert row["fragmentation"] == int((nanotron.fragmentation - 1) * live) > 0
        assert row["runtime"] == int(nanotron.runtime_bytes) > 0
        assert counted(row, "device") == row["peak"] == live + row["fragmentation"] + row["runtime"]
        assert counted(row, "reserved") == live + row["fragmentation"]
        assert counted(row, "allocated") == live
    assert list(MEMORY_SCOPES) == ["device", "reserved", "allocated"]  # widest first
    here = local_cluster(2)
    row = peak_bytes(here, TINY, Layout(dp=2), 16, 32)[0]
    assert row["fragmentation"] == row["runtime"] == 0
    assert all(counted(row, scope) == row["peak"] for scope in MEMORY_SCOPES)


def test_the_optimizers_working_copies_are_of_the_largest_tensor_it_steps():
    """dt's Adam holds one temporary of the tensor it steps (tests/test_train_adam.py measures it):
    without ZeRO the largest tensor, under ZeRO 1 and 2 the flat shard; a fused kernel none. The
    peak counts it where it exceeds the activations (after backward, with the state)."""
    from dt.plan.stage import stage_tensors

    here = local_cluster(2)
    dense = stage_tensors(TINY, Layout(dp=2), 32, 0).dense
    assert peak_bytes(here, TINY, Layout(dp=2), 16, 32)[0]["optimizer"] == max(dense) * 4
    for zero in (1, 2):
        row = peak_bytes(here, TINY, Layout(dp=2, zero=zero, micro_batches=8), 16, 32)[0]
        assert row["optimizer"] == -(-sum(dense) // 2) * 4
        assert row["peak"] == row["state"] + row["scratch"] + max(row["activations"], row["optimizer"])
    gpu = catalogue_cluster("h100", 1, 8)  # dt's stack: float32 weights, their own master
    assert peak_bytes(gpu, TINY, Layout(dp=8, zero=1), 16, 32)[0]["optimizer"] == -(-sum(dense) // 8) * 4
    fused = catalogue_cluster("h100", 1, 8, stack_name="megatron")
    assert peak_bytes(fused, TINY, Layout(dp=8, zero=1), 16, 32)[0]["optimizer"] == 0


def test_dt_plan_ranks_explains_and_refuses_in_one_line(tmp_path, capsys):
    assert main(["--preset", "gpt2", "--hosts", "1", "--per-host", "8", "--device", "h100",
                 "--global-batch", "64", "--seq", "1024", "--top", "3",
                 "--scatter", str(tmp_path / "s.png")]) == 0
    out = capsys.readouterr().out
    assert "dt train accepts" in out and (tmp_path / "s.png").stat().st_size > 0
    first = out.splitlines()[4].split()[1]
    png = tmp_path / "t.png"
    assert main(["--preset", "gpt2", "--per-host", "8", "--device", "h100", "--global-batch", "64",
                 "--seq", "1024", "--explain", first, "--out", str(png)]) == 0
    assert png.stat().st_size > 0 and "predicted step" in capsys.readouterr().out
    assert main(["--preset", "gpt2", "--per-host", "8", "--device", "h100", "--global-batch", "64",
                 "--seq", "1024", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layouts"][0]["layout"] == first and data["layouts"][0]["step_s"] > 0
    with pytest.raises(SystemExit) as e:
        main(["--precision", "bf16"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs --device" in err


def test_pipeline_messages_cost_their_ends_and_a_sleeping_receiver_wakes():
    # p 2, m 1, GPipe: F on stage 0 [0, f + post] (it sends); stage 1's F waited past the spin,
    # so it starts at f + post + send + wake, then pays its receive and its send back (B)
    f, b, send, post, wake = 1.0, 2.0, 0.1, 0.01, 0.3
    (s0, s1), _ = play("gpipe", 2, 1, 1, (f, f), (b, b), send, post, wake, 0.05)
    assert (s0[0].start, s0[0].end) == (0.0, f + post)
    start = f + post + send + wake
    assert (s1[0].start, s1[0].end) == pytest.approx((start, start + f + post))  # F: the last sends none
    assert (s1[1].start, s1[1].end) == pytest.approx((start + f + post, start + f + post + b + post))  # B
    back = start + f + post + b + post + send + wake  # stage 0 slept waiting for it
    assert (s0[1].start, s0[1].end) == pytest.approx((back, back + b + post))
    # a receiver whose wait stays inside the spin wakes at once; no terms: the plain timeline
    (_, t1), _ = play("gpipe", 2, 1, 1, (f, f), (b, b), send, post, wake, 10.0)
    assert t1[0].start == pytest.approx(f + post + send)
    (_, u1), _ = play("gpipe", 2, 1, 1, (f, f), (b, b), send)
    assert (u1[0].start, u1[0].end) == pytest.approx((f + send, 2 * f + send))


def test_this_machine_prices_what_dt_runs_at_the_swept_time(monkeypatch):
    """On this machine a call is priced at the sweep's time for the algorithm dt runs (auto's
    measured winner, or the one named), log-log between swept sizes; a pair inside a host with
    more ranks than cores by the crowded host's figures instead (its sync, its terms)."""
    from dt.cost.overheads import Overheads
    from dt.plan import comm
    from dt.plan.cluster import Cluster

    sizes = [1024 * 4 ** k for k in range(5)]
    table = {"all_reduce": [[s, "one_shot", {"one_shot": 1e-5 * (k + 1), "ring": 1e-3}]
                            for k, s in enumerate(sizes)]}
    monkeypatch.setattr(comm, "winners", lambda wire, p: table if p == 2 else {})
    monkeypatch.setattr(comm, "overheads", lambda wire, p: Overheads(post=1e-4) if p == 4 else Overheads())
    monkeypatch.setattr(comm.os, "cpu_count", lambda: 2)
    m = Machine(1e-4, 1e-9, 1e-10, sync=2e-5, mem=2e-10)

    def cluster(per_host: int) -> Cluster:
        return Cluster("here", 1, per_host, 0.0, Levels(m, m), 1 << 30, 1e9, "float32",
                       shared_memory=True)

    comm._with_terms.cache_clear()
    two = cluster(2)
    assert collective_seconds(two, "all_reduce", 4096, (0, 1)) == pytest.approx(2e-5)  # auto: one_shot
    assert collective_seconds(two, "all_reduce", 4096, (0, 1), "ring") == pytest.approx(1e-3)
    assert collective_seconds(two, "all_reduce", 2048, (0, 1)) == pytest.approx(2 ** 0.5 * 1e-5)  # log-log
    crowded = collective_seconds(cluster(4), "all_reduce", 4096, (0, 1))  # 4 ranks on 2 cores
    plain = estimate("all_reduce", "one_shot", 4096, 2, alpha=m.sync, beta=m.mem, gamma=m.gamma,
                     overheads=Overheads(post=1e-4)).total
    assert crowded == pytest.approx(plain) and crowded != pytest.approx(2e-5)
    # a simulated cluster of 2 hosts x 2 on the same 2 cores: a pair inside a host is crowded too,
    # priced by the figures of all 4 ranks running (dt tune --world 4), not by its host's pair
    busy = Machine(1e-4, 1e-9, 1e-10, sync=3e-4, mem=2e-10)
    monkeypatch.setattr(comm, "machine", lambda wire, p: busy if (wire, p) == ("shm", 4) else m)
    simulated = Cluster("here", 2, 2, 0.0, Levels(m, m), 1 << 30, 1e9, "float32", shared_memory=True)
    want = estimate("all_reduce", "one_shot", 4096, 2, alpha=busy.sync, beta=busy.mem, gamma=busy.gamma,
                    overheads=Overheads(post=1e-4)).total
    assert collective_seconds(simulated, "all_reduce", 4096, (0, 1)) == pytest.approx(want)
    comm._with_terms.cache_clear()


def test_clipping_under_zero_reads_the_experts_shard_over_their_replicas():
    """dp4 ep2 ZeRO 1 with --clip: the clip pass reads the dense gradients over dp x cp = 4 and the
    experts' over their replicas (edp = 2), as ZeroParts holds them, at the catalogue's bandwidth."""
    from dt.plan.cluster import catalogue_cluster
    from dt.plan.stage import stage_work
    from dt.plan.step_model import predict, stage_groups

    c = catalogue_cluster("h100", 1, 4)
    model = ModelShape(2, 2, 32, 44, experts=4, top_k=1)
    lay = Layout(dp=4, ep=2, zero=1, clip=True)
    w = stage_work(c, model, lay, stage_groups(lay)[0], 16, 32, 0)
    assert w.experts > 0
    clip = [s for s in predict(c, model, lay, 16, 32, timelines=True).timelines[0] if s.label == "clip"]
    # the gradients as dt keeps them on a GPU, float32 (Cluster.grad_itemsize), not the bf16 compute's
    want = 3 * (sum(w.dense) / 4 + w.experts / 2) * c.grad_itemsize / c.mem_bw
    assert c.grad_itemsize == 4
    assert len(clip) == 1 and clip[0].end - clip[0].start == pytest.approx(want)


@pytest.mark.parametrize("stack", ["dt", "megatron"])
def test_sequence_parallels_collectives_are_an_all_gather_and_a_reduce_scatter_each(stack):
    """tp's messages per micro-batch (before any overlap hides them), by hand: per block each way two
    all-reduces of the activation, or under sequence parallel two all-gathers and two
    reduce-scatters of it; dt's norms (not Megatron's, coalesced after backward) also all-reduce
    their float32 gradients in backward: two LayerNorms' weight and bias per block."""
    from dt.plan.stage import RankGroups, _messages

    c = catalogue_cluster("h100", 1, 8, stack_name=stack)
    model, batch, seq, tp = ModelShape(4, 8, 512, 1024), 8, 256, tuple(range(8))
    groups = RankGroups(tp=tp, cp=(0,), ep=(0,), dp_cp=(0,), edp=(0,), pp=(0,), embed=(0,))

    def messages(layout: Layout) -> tuple[float, float]:
        fwd, bwd = _messages(c, model, layout, groups, batch, seq, stage_tensors(model, layout, seq, 0))
        return fwd["tp"], bwd["tp"]

    plain_fwd, plain_bwd = messages(Layout(tp=8))
    sp_fwd, sp_bwd = messages(Layout(tp=8, sequence_parallel=True))
    act = batch * seq * model.n_embd * c.itemsize
    reduce, gather, scatter = (collective_seconds(c, name, act, tp)
                               for name in ("all_reduce", "all_gather", "reduce_scatter"))
    norms = 2 * 2 * collective_seconds(c, "all_reduce", model.n_embd * 4, tp) if stack == "dt" else 0.0
    per_way = 2 * model.n_layer * (gather + scatter - reduce)
    assert norms >= 0 and gather + scatter > reduce > 0
    assert sp_fwd - plain_fwd == pytest.approx(per_way, rel=1e-9)
    assert sp_bwd - plain_bwd == pytest.approx(per_way + model.n_layer * norms, rel=1e-9)


def test_rows_here_tie_within_the_timed_stages_interquartile_spread(monkeypatch):
    """On this machine the ranking's noise is the median, over the timed stages, of their repetitions'
    interquartile range over their median (DDP's and Adam's timings aside): by hand, 0, 0.2 and 1.0."""
    from dt.plan import timed

    times = {("a",): [1.0] * 5, ("b",): [0.9, 1.0, 1.0, 1.1, 1.2], ("c",): [1.0, 2.0, 3.0, 4.0, 5.0],
             ("d",): [1.0, 9.0]}  # too few repetitions for quartiles: left out
    budget = timed.TimingBudget()
    monkeypatch.setattr(timed, "BUDGET", budget)
    monkeypatch.setattr(timed, "stage_timing", lambda *key: times[key])
    assert timed.timing_noise() == 0.0  # nothing timed yet
    budget.timed = {*times, ("ddp", 1), ("adam", 2)}
    assert timed.timing_noise() == pytest.approx(0.2)


def test_nanotrons_cut_weighs_the_head_against_the_blocks():
    """nanotron's build_model: each layer weighs its matmuls' weights (a Llama block 4 h^2 + 3 h f, here
    with its norms' 2 h; the head V h; the embedding 0); a stage takes layers until their running total
    passes its share, that layer included. By hand for the 1.34B of the Ultra-Scale Playbook (16 blocks,
    h 2048, f 8192, V 131072): a block 67,112,960, the head 268,435,456 (four blocks), the total
    1,342,242,816; at pp 2 the half, 671,121,408, is passed by the tenth block (671,129,600): the
    first stage holds the embedding and 10 blocks, the second 6 blocks and the head."""
    from dt.plan.stage import layer_cut, weighed_cut

    model = llama_shape(16, 32, 2048, 131072, 0, tied=True)
    model = ModelShape(**{**model.__dict__, "ffn": 8192})
    assert weighed_cut(model, 2) == (11, 7)
    assert layer_cut(model, 2, 1, "weights") == (11, 7)
    assert sum(weighed_cut(model, 3)) == 18
    # where the head outweighs a stage's share, a chunk would be left empty: nanotron cannot build
    # that split, and the cut falls back to the blocks split evenly
    assert weighed_cut(model, 16) is None
    assert layer_cut(model, 8, 1, "weights") == layer_cut(model, 8, 1, "blocks")
    assert layer_cut(model, 1, 1, "weights") is None
