"""The scaling study's tables 8 (expert parallel) and 9 (context parallel), from tiny real runs.

The workers run for real at world 2 with tiny sizes (the study's --quick is
CI's job); the tables are built from their results as the study would, and
must show the transport's bytes equal to dt.cost's, on every rank.
"""

from __future__ import annotations

from types import SimpleNamespace

from dt.bench.scaling.layer_workers import attention_worker, moe_worker
from dt.bench.scaling.settings import StudySettings
from dt.bench.scaling.tables import TABLES, needs_of
from dt.bench.scaling.tables.t8_expert_parallel import label as moe_label
from dt.bench.scaling.tables.t9_context_parallel import label as cp_label


def _settings() -> StudySettings:
    return StudySettings(tables=(8, 9), moe_worlds=(1, 2), moe_tokens=48, moe_hidden=8, moe_experts=3,
                         moe_top_ks=(1, 2), moe_capacity=1.0, moe_reps=1, cp_worlds=(2,),
                         cp_seq_lens=(12, 31), cp_heads=2, cp_head_dim=4, cp_reps=1)


def test_tables_8_and_9_from_tiny_runs(run):
    s = _settings()
    needs = needs_of(s)
    assert set(needs.runs) == {moe_label(1), moe_label(2), cp_label(2)} and needs.worlds() == {1, 2}
    runs = {}
    for key, r in needs.runs.items():
        assert r.fn in (moe_worker, attention_worker)
        runs[key] = run(r.world, r.fn, *r.args)
    st = SimpleNamespace(s=s, cores=2, runs=runs)
    t8, t9 = TABLES[8].build(st), TABLES[9].build(st)
    assert [row[:2] for row in t8.rows] == [[1, 1], [1, 2], [2, 1], [2, 2]]
    for row, entry in zip(t8.rows, t8.data):
        assert row[4] == "yes" and entry["bytes_sent_per_rank"] == entry["model_exact_per_rank"]
        assert (min(entry["bytes_sent_per_rank"]) > 0) == (entry["ep"] > 1)
    assert any(e["dropped"] > 0 for e in t8.data)  # capacity factor 1.0 drops some
    assert [(e["seq_len"], e["method"]) for e in t9.data] == [
        (S, m) for S in (12, 31) for m in ("none", "ring", "ulysses")]
    for e in t9.data:
        assert e["bytes_sent_per_rank"] == e["model_per_rank"]
        assert (e["method"] == "none") == (max(e["bytes_sent_per_rank"]) == 0)
    for t in (t8, t9):  # every row as wide as the header
        assert {len(r) for r in t.rows} == {len(t.headers)}
    empty = SimpleNamespace(s=s, cores=2, runs={})  # a failed measurement leaves a gap
    assert "not measured" in TABLES[8].build(empty).markdown()
    assert "not measured" in TABLES[9].build(empty).markdown()
