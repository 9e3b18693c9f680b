"""`dt plan` as a user meets it: presets and the flags over them, the layout grammar and --explain,
--headroom, ties, bytes per level, FSDP's prefetch, and the bound on timing on this machine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dt.cost.stack import STACKS
from dt.plan.cli import main, parse_args
from dt.plan.cluster import catalogue_cluster
from dt.plan.layouts import NAME_GRAMMAR, RECOMPUTE, grid, parse_name
from dt.plan.model import PRESETS, ModelShape
from dt.plan.search import TIE, rank_layouts
from dt.plan.stage import fsdp_exposed, stage_work
from dt.plan.step_model import predict, stage_groups

GPT2 = ["--preset", "gpt2", "--per-host", "8", "--device", "h100", "--global-batch", "64", "--seq", "1024"]


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


def test_presets_are_the_public_models_with_grouped_query_attention():
    """Llama 2 70B: 8 key/value heads of its 64 (69.0B parameters, not 78.4B); Llama 3 8B: 8.03B."""
    assert PRESETS["llama-70b"].params(4096) / 1e9 == pytest.approx(68.98, abs=0.05)
    assert PRESETS["llama3-8b"].params(8192) / 1e9 == pytest.approx(8.03, abs=0.005)
    assert PRESETS["llama-7b"].params(4096) / 1e9 == pytest.approx(6.74, abs=0.005)  # no GQA
    assert PRESETS["gpt3-175b"].params(2048) / 1e9 == pytest.approx(174.6, abs=0.05)  # Megatron's 174.6B


def test_explicit_flags_override_a_preset(capsys):
    a = parse_args(["--preset", "llama-70b", "--n-layer", "40", "--ffn", "20480", "--n-kv-head", "16"])
    want = replace(PRESETS["llama-70b"], n_layer=40, ffn=20480, n_kv_head=16)
    assert a.shape == replace(want, name=a.shape.name) and "n_layer=40" in a.shape.name
    assert parse_args(["--preset", "llama-70b"]).shape == PRESETS["llama-70b"]  # nothing given: the preset
    llama = parse_args(["--model", "llama", "--n-head", "8", "--n-kv-head", "2", "--ffn", "96"]).shape
    assert (llama.family, llama.n_kv_head, llama.ffn, llama.gated) == ("llama", 2, 96, True)
    assert parse_args(["--ffn", "100"]).shape.hidden == 100  # dt's GPT too
    assert "llama family's" in _refused(["--model", "gpt", "--n-kv-head", "2"], capsys)
    assert "llama family's" in _refused(["--n-kv-head", "2"], capsys)
    assert "--model names a family" in _refused(["--preset", "gpt2", "--model", "llama"], capsys)


def test_every_layout_the_grid_makes_is_the_name_it_prints():
    layouts = list(grid(16, 32, hosts=2, experts=4, recompute=RECOMPUTE, clip=True, seq=2048))
    layouts += list(grid(8, 16, recompute=RECOMPUTE, seq=2048))
    assert len(layouts) > 10000
    names = set()
    for lay in layouts:
        assert parse_name(lay.name()) == lay, lay.name()
        names.add(lay.name())
    assert len(names) == len(set(layouts))  # one name per layout


def test_the_grammar_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert NAME_GRAMMAR in capsys.readouterr().out


def test_explain_prices_any_name_dt_train_runs_and_refuses_the_rest_in_one_line(tmp_path, capsys):
    """m 3 at 8 sequences a rank is not in the grid (its micro-batch sizes 3, 3, 2 are not a power of
    two) but dt train runs it: --explain prices it. A name outside the grammar, one dt train refuses
    and one of another world each get one line."""
    name = "dp8.tp1.pp1.z0.1f1b.m3"
    assert parse_name(name) not in set(grid(8, 64))
    out = str(tmp_path / "t.png")
    assert main([*GPT2, "--explain", name, "--out", out]) == 0
    text = capsys.readouterr().out
    assert f"{name}: predicted step" in text and "stage 0: peak" in text and "fits" in text
    for bad, why in (("dp8.tp1", "is not a layout name: dp<D>"),
                     ("dp8.tp1.pp1.z0.1f1b.m9", "dt train does not run it"),
                     ("dp4.tp1.pp1.z0.1f1b.m2", "has 4 ranks; the cluster has 8")):
        assert main([*GPT2, "--explain", bad, "--out", out]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and why in captured.err, captured.err


def test_headroom_refuses_layouts_past_its_share_of_the_device(capsys):
    c = catalogue_cluster("h100", 1, 8)
    model = PRESETS["llama-7b"]
    usual = rank_layouts(c, model, 16, 4096, ("none",))
    half = rank_layouts(c, model, 16, 4096, ("none",), headroom=0.5)
    assert all(r.peak <= 0.95 * c.memory for r in usual.rows)
    assert all(r.peak <= 0.5 * c.memory for r in half.rows)
    kept = {r.layout for r in half.rows}
    assert kept < {r.layout for r in usual.rows}  # what fits half the device fits 95% of it
    assert any(r.peak > 0.5 * c.memory for r in usual.rows)  # and some use more than half
    assert any("less 50% headroom" in why for why in half.dropped)
    _refused([*GPT2, "--headroom", "1.5"], capsys)
    assert main([*GPT2, "--headroom", "0.2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["headroom"] == 0.2 and all(r["peak_bytes_per_rank"] <= 0.8 * 80e9 for r in data["layouts"])


def test_ties_are_marked_and_ordered_by_memory(capsys):
    """A row within TIE of the fastest step of its group is a tie; a group runs least memory first."""
    c = catalogue_cluster("h100", 1, 8)
    rows = rank_layouts(c, PRESETS["gpt2"], 64, 1024, RECOMPUTE).rows
    assert any(r.tie for r in rows) and not rows[0].tie
    groups: list[list] = []
    for r in rows:
        if r.tie:
            groups[-1].append(r)
        else:
            groups.append([r])
    for i, group in enumerate(groups):
        lead = min(r.prediction.step for r in group)
        assert all(r.prediction.step <= lead * (1 + TIE) for r in group)
        assert [r.peak for r in group] == sorted(r.peak for r in group)
        if i + 1 < len(groups):  # the next group starts past this one's tolerance
            assert min(r.prediction.step for r in groups[i + 1]) > lead * (1 + TIE)
    assert main([*GPT2, "--top", "40"]) == 0
    out = capsys.readouterr().out
    assert "= ties with the row above" in out and any(line[3:4] == "=" for line in out.splitlines())


def test_a_ring_over_hosts_puts_only_its_crossing_links_on_the_nic():
    """dp 32 over 4 hosts of 8: the ring's 32 links, 4 of them between hosts: each rank's all-reduce
    bytes (2 x 31/32 of dt's float32 gradients) 28/32 inside a host, 4/32 between."""
    from dt.plan.layouts import Layout

    c = catalogue_cluster("h100", 4, 8)
    model = ModelShape(2, 8, 512, 1000)
    lay = Layout(dp=32)
    w = stage_work(c, model, lay, stage_groups(lay)[0], 64, 256, 0)
    total = 2 * 31 / 32 * sum(w.dense) * 4
    levels = predict(c, model, lay, 64, 256).bytes_per_level
    assert levels["intra"] == pytest.approx(total * 28 / 32)
    assert levels["inter"] == pytest.approx(total * 4 / 32)
    inside = predict(catalogue_cluster("h100", 4, 8), model, Layout(dp=4, tp=8), 64, 256).bytes_per_level
    assert inside["inter"] > 0 and predict(catalogue_cluster("h100", 1, 8), model, Layout(dp=8), 64,
                                            256).bytes_per_level["inter"] == 0


def test_fsdp_prefetch_hides_the_gathers_behind_compute_not_dts_reduce_scatters():
    """dt's FSDP (dt.parallel.zero.prefetch) issues the next unit's all-gather behind the current unit's
    compute, forward and backward; its gradients' reduce-scatters block. Without prefetch every
    collective waits; a stack whose reduce-scatters run behind backward hides those too."""
    gather, scatter, fwd, bwd = 3.0, 2.0, 1.0, 5.0
    dt = STACKS["dt"]
    assert dt.fsdp_prefetch and not dt.fsdp_scatter_behind and dt.reshard_after_forward
    assert fsdp_exposed(dt, gather, scatter, fwd, bwd) == (2.0, 0.0 + 2.0)  # 3 - 1; 3 hidden by 5, 2 waits
    blocking = replace(dt, fsdp_prefetch=False)
    assert fsdp_exposed(blocking, gather, scatter, fwd, bwd) == (3.0, 3.0 + 2.0)
    assert fsdp_exposed(STACKS["torchtitan"], gather, scatter, fwd, bwd) == (2.0, 0.0)  # 3 + 2 behind 5
    kept = replace(dt, reshard_after_forward=False)  # no second gather in backward
    assert fsdp_exposed(kept, gather, scatter, fwd, bwd) == (2.0, 2.0)


def test_past_the_timing_budget_a_plan_here_is_priced_by_rate_and_says_so(monkeypatch, capsys):
    """gpt2's 50,257-word head timed at every micro-batch size took minutes and gigabytes: past the
    budget (here none at all) no stage, DDP hook or Adam step is timed, and the plan says so."""
    from dt.plan import timed

    def never(*a, **k):
        raise AssertionError("timed past the budget")

    monkeypatch.setattr(timed, "TIMING_BUDGET", 0.0)
    monkeypatch.setattr(timed, "BUDGET", timed.TimingBudget())
    for name in ("stage_timing", "ddp_hook_seconds", "adam_seconds"):
        monkeypatch.setattr(timed, name, never)
    assert main(["--preset", "gpt2", "--world", "2", "--global-batch", "4", "--seq", "64", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "stage shapes priced at the timed stages' FLOP rate" in out
    assert "Adam steps priced by their bytes" in out and "dt.plan.timed" in out


def test_a_small_budget_times_the_first_stage_then_prices_the_rest_by_its_rate(monkeypatch, capsys):
    from dt.plan import timed

    timings: list[tuple] = []
    real = timed.stage_timing

    def counted(*shape):
        timings.append(shape)
        return real(*shape)

    monkeypatch.setattr(timed, "TIMING_BUDGET", 1e-9)
    monkeypatch.setattr(timed, "BUDGET", timed.TimingBudget())
    monkeypatch.setattr(timed, "stage_timing", counted)
    argv = ["--world", "2", "--n-layer", "2", "--n-embd", "32", "--seq", "16", "--global-batch", "8",
            "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(set(timings)) == 1 and timed.BUDGET.rate() is not None
    assert "stage shapes priced at the timed stages' FLOP rate" in data["untimed"]
    assert len(data["layouts"]) > 1 and all(r["step_s"] > 0 for r in data["layouts"])
