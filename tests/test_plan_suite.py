"""The planner beside published runs (`dt plan --published`, dt.plan.suite) in CI, and the published
tables' own arithmetic.

Every source's median and worst |predicted / published - 1| (the step in the source's unit, and the
memory per GPU where the source printed one) is held to the value the suite printed in its record:
a change that makes any of them worse fails, and one that improves them lowers the figure here.
"""

from __future__ import annotations

import functools
import math

import pytest

from dt.cost.flops import train_flops_per_token
from dt.plan.layouts import parse_name
from dt.plan.model import ModelShape
from dt.plan.published import SOURCES, load
from dt.plan.suite import Compared, compare, measured_sweeps, priced_rows, summary, sweep_winners

# The values of benchmarks/plan_catalogue_20261207_published-4.md (`dt plan --published`): per
# source (rows priced, median, worst) of the step's |error| and of the memory's; a change that makes
# any worse fails. Rounded up in the fourth decimal.
HELD = {
    "bloom-176b": {"step": (100, 0.0688, 0.2923), "memory": (60, 0.1047, 0.3848)},
    "korthikanti-2022": {"step": (9, 0.0304, 0.1011), "memory": (0, 0.0, 0.0)},
    "llama3-2024": {"step": (3, 0.1486, 0.1719), "memory": (0, 0.0, 0.0)},
    "llm-foundry": {"step": (131, 0.0696, 0.2923), "memory": (0, 0.0, 0.0)},
    "megatron-2021": {"step": (22, 0.0544, 1.0472), "memory": (0, 0.0, 0.0)},
    "megatron-h100-2024": {"step": (9, 0.0608, 0.2391), "memory": (0, 0.0, 0.0)},
    "nanotron-2025": {"step": (26, 0.0688, 1.9087), "memory": (26, 0.0928, 0.2391)},
    "torchtitan-2024-12": {"step": (0, 0.0, 0.0), "memory": (0, 0.0, 0.0)},
    "torchtitan-asynctp-2025-06": {"step": (0, 0.0, 0.0), "memory": (0, 0.0, 0.0)},
    "torchtitan-h200-2025-06": {"step": (0, 0.0, 0.0), "memory": (0, 0.0, 0.0)},
}
# Sweep winners on up to RANKED_HERE GPUs (cheap to rank): how many the planner ranks first or
# within dt.plan.suite.WITHIN of the first, in the same record.
RANKED_HERE = 16
PLACED_HERE = 2


# In the same record: of the sweeps with two or more priced rows, how many have the measured fastest
# predicted fastest of the sweep's own layouts, and first or within dt.plan.suite.WITHIN.
MEASURED_SWEEPS = {"sweeps": 29, "first": 19, "within": 26}


@functools.lru_cache(maxsize=1)
def _every_row() -> tuple[Compared, ...]:
    """Every source's rows, priced once for the tests here."""
    return tuple(priced_rows(rank=False)[0])


def _held(stats: dict) -> tuple[int, float, float]:
    return (stats["rows"], stats.get("median", 0.0), stats.get("worst", 0.0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", SOURCES)
def test_no_source_is_predicted_worse_than_its_record(source):
    assert set(HELD) == set(SOURCES), "every source's figures are held (add a new source's)"
    rows = [compared for compared in _every_row() if compared.row.source == source]
    stats = summary(rows).get(source, {"step": {"rows": 0}, "memory": {"rows": 0}})  # none priced
    for kind in ("step", "memory"):
        rows_now, median, worst = _held(stats[kind])
        rows_held, median_held, worst_held = HELD[source][kind]
        print(f"{source} {kind}: {rows_now} rows, median {median:.4f}, worst {worst:.4f}")
        assert rows_now == rows_held, f"{source}: {kind} priced on {rows_now} rows, the record's {rows_held}"
        assert median <= median_held, f"{source}: {kind} median |error| {median:.4f} > {median_held}"
        assert worst <= worst_held, f"{source}: {kind} worst |error| {worst:.4f} > {worst_held}"


@pytest.mark.timeout(120)
def test_the_planners_order_within_each_measured_sweep_is_no_worse_than_its_record():
    placed = measured_sweeps(list(_every_row()))
    print(placed)
    assert placed["sweeps"] == MEASURED_SWEEPS["sweeps"]
    assert placed["first"] >= MEASURED_SWEEPS["first"] and placed["within"] >= MEASURED_SWEEPS["within"]


def test_the_first_ranked_layout_beside_the_authors():
    """Each small sweep's fastest published layout, ranked among every layout of its model and
    cluster: the first-ranked is a layout the planner prices at that step, never slower than the
    authors'; the authors' rank is 1 exactly when nothing is faster."""
    from dt.plan import suite

    rows = load()
    placed, ranked = 0, []
    for i in sorted(sweep_winners(rows)):
        row = rows[i]
        if row.cluster.gpus > RANKED_HERE or row.cluster.device is None:
            continue
        c = compare(row, rank=True)
        ranked.append(c)
        assert c.authors_rank is not None and c.first_layout is not None
        parse_name(c.first_layout)  # a name of the grammar, as every row's
        assert c.first_step <= c.step, (row.model.name, c.layout, c.first_layout)
        assert (c.authors_rank == 1) == (c.behind_first == 0.0), (row.model.name, c.authors_rank)
        placed += c.behind_first <= suite.WITHIN
        print(f"{row.source} {row.model.name} on {row.cluster.gpus}: authors {c.layout} rank "
              f"{c.authors_rank}, {100 * c.behind_first:.1f}% behind {c.first_layout}")
    assert placed >= PLACED_HERE
    # `--rank`'s table: one line per ranked row (an unranked one adds none), the first-ranked last
    table = suite._ranked_table(ranked + [compare(rows[0], rank=False)]).splitlines()
    assert len(table) == 1 + len(ranked)
    for line, c in zip(table[1:], ranked):
        assert line.split()[-1] == c.first_layout and f"{100 * c.behind_first:.1f}%" in line, line


def _megatron_parameters(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Narayanan et al. 2021, equation (2): 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))."""
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))


def test_megatron_2021_rows_agree_with_the_papers_own_formulas():
    """Table 1: % of peak = TFLOP/s / 312; every row's parameter count is equation (2)'s to its one
    printed decimal; Table 2's training days for 300B tokens are equation (4)'s 8 T P / (n X)."""
    rows = load(["megatron-2021"])
    assert len(rows) >= 20
    for r in rows:
        m = r.model
        count = _megatron_parameters(m.layers, m.hidden, m.vocab_size, m.seq_len)
        assert count == pytest.approx(m.params_b * 1e9, abs=0.051e9), m.name
        if "percent_of_peak" in r.also:
            assert r.published / 312 == pytest.approx(r.also["percent_of_peak"] / 100, abs=0.006)
        if "days_for_300B_tokens" in r.also:
            seconds = 8 * 300e9 * m.params_b * 1e9 / (r.cluster.gpus * r.published * 1e12)
            days = r.also["days_for_300B_tokens"]
            assert seconds / 86400 == pytest.approx(days, rel=0.05), (m.name, r.cluster.gpus)


def test_llama3_rows_and_the_6n_check():
    """Table 4: 16M tokens per batch; MFU = TFLOP/s over the H100's 989.4 bf16 peak; dt's model
    FLOPs per token for the 405B at 8K are 6N + 12 l h s (PaLM's count) to 2%."""
    rows = load(["llama3-2024"])
    for r in rows:
        assert r.layout.global_batch * r.model.seq_len == pytest.approx(16e6, rel=0.05)
        assert r.published / 989.4 == pytest.approx(r.also["mfu_percent"] / 100, abs=0.01)
    r = next(r for r in rows if r.model.seq_len == 8192)
    m = r.model
    shape = ModelShape(m.layers, m.heads, m.hidden, m.vocab_size, ffn=m.ffn_hidden, gated=True, tied=False,
                       family="llama", n_kv_head=m.kv_heads)
    flops = train_flops_per_token(shape.decoder(m.seq_len))
    assert flops == pytest.approx(6 * m.params_b * 1e9 + 12 * m.layers * m.hidden * m.seq_len, rel=0.02)
    assert math.isclose(shape.params(m.seq_len) / 1e9, 405, rel_tol=0.01)  # GQA's 8 kv heads: 405B


def test_a_printed_model_parallel_size_is_priced_at_its_fastest_split():
    """Table 2 of Narayanan et al. prints TP x PP (96) and not the split: the authors' layout is the
    fastest split that fits, tensor parallel inside a host."""
    rows = [row for row in load(["megatron-2021"]) if row.layout.model_parallel]
    assert {row.layout.model_parallel for row in rows} == {96, 280}
    c = compare(rows[0], rank=False)
    layout = parse_name(c.layout)
    assert layout.tp * layout.pp == rows[0].layout.model_parallel and layout.tp <= 8
    assert layout.dp == rows[0].layout.dp


def test_measured_sweeps_compare_the_planners_order_with_the_measured_one():
    """In a sweep the authors' fastest measured layout must be the planner's fastest of the sweep's
    layouts, or within WITHIN of it; a sweep of one row is not counted."""
    from dt.plan import suite

    row = load(["bloom-176b"])[0]
    assert row.metric == "s_per_iter"

    def compared(sweep: str, published: float, predicted: float) -> suite.Compared:
        from dataclasses import replace
        return suite.Compared(replace(row, sweep=sweep, published=published), "x", predicted, predicted,
                              None, None, None)

    rows = [compared("a", 100, 90), compared("a", 110, 80),  # measured fastest predicted 12.5% slower
            compared("b", 100, 90), compared("b", 110, 88),  # within 5%
            compared("c", 100, 80), compared("c", 110, 90),  # first
            compared("d", 100, 80)]
    assert suite.measured_sweeps(rows) == {"sweeps": 3, "first": 1, "within": 2}


def test_the_json_rows_carry_each_figure_and_what_its_memory_counts(capsys):
    """`dt plan --published SOURCE --json`: one object per row with the fields a script reads, the
    memory in 10^9 bytes beside what the published figure counts (nanotron's GiB converted)."""
    import json

    from dt.plan.cli import main

    assert main(["--published", "nanotron-2025", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == HELD["nanotron-2025"]["step"][0]
    assert set(rows[0]) == {"source", "model", "layout", "gpus", "metric", "published", "predicted", "step_s",
                            "published_memory_gb", "memory_scope", "predicted_memory_gb", "authors_rank",
                            "first_layout", "behind_first", "sweep"}
    first, worst = rows[0], HELD["nanotron-2025"]["memory"][2]
    assert first["memory_scope"] == "reserved"
    assert first["published_memory_gb"] == round(41.76 * 2**30 / 1e9, 2)  # the heatmap's "41.76GB" are GiB
    assert abs(first["predicted_memory_gb"] / first["published_memory_gb"] - 1) <= worst
