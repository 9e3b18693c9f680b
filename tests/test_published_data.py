"""The published-runs data: every row well formed, consistent with itself, and traceable to its source.

Static checks on the JSON files of dt/plan/published/ (milliseconds): a row that breaks one names the
file and the row. What each figure means is the source's `notes`; these checks only hold the data to
its own arithmetic and to what was printed.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import fields

import pytest

from dt.cost.devices import DEVICES
from dt.plan.published import (
    FFN_ACTIVATIONS,
    MEMORY_SCOPES,
    METRICS,
    ROW_KEYS,
    SECONDARY_METRICS,
    SOURCES,
    PublishedRow,
    describe,
    load,
    source_file,
)

ROWS = load()


def _where(row: PublishedRow) -> str:
    return f"{row.source}: {row.model.name}, {row.cluster.gpus} GPUs, {dict(row.printed)}"


def _numbers(value: object) -> list[float]:
    """Every number written in a printed cell (thousands separators and units stripped)."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    return [float(m.replace(",", "")) for m in re.findall(r"\d[\d,]*(?:\.\d+)?", str(value))]


def test_at_least_seven_sources_and_seventy_rows():
    assert len(SOURCES) >= 7 and len(ROWS) >= 70, (SOURCES, len(ROWS))
    assert {row.source for row in ROWS} == set(SOURCES), "a source file with no rows"


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_names_its_citation_and_how_it_was_checked(source):
    info = describe(source)
    for name in ("citation", "url", "table", "verified", "notes"):
        assert len(getattr(info, name)) > 20, f"{source}: {name} is empty or a stub"


@pytest.mark.parametrize("source", SOURCES)
def test_rows_carry_only_known_keys_and_every_key(source):
    doc = json.loads(source_file(source).read_text())
    for i, row in enumerate(doc["rows"]):
        merged = {**doc["defaults"], **row}
        assert set(merged) == set(ROW_KEYS), f"{source} row {i}: {set(merged) ^ set(ROW_KEYS)}"
        assert row.get("printed"), f"{source} row {i}: no printed columns"


def test_units_and_categories_are_known():
    for row in ROWS:
        assert row.metric in METRICS, _where(row)
        assert set(row.also) <= SECONDARY_METRICS, _where(row)
        assert row.layout.recompute in ("none", "selective", "full", None), _where(row)
        assert row.model.ffn_activation in (*FFN_ACTIVATIONS, None), _where(row)
        assert row.cluster.device in (*DEVICES, None), _where(row)
        assert row.layout.zero_stage in (0, 1, 2, 3, None), _where(row)


def test_every_number_is_positive():
    for row in ROWS:
        assert row.published > 0, _where(row)
        assert all(v > 0 for v in row.also.values()), _where(row)
        assert row.published_memory_gb is None or row.published_memory_gb > 0, _where(row)
        for record in (row.model, row.cluster, row.layout):
            for f in fields(record):
                value = getattr(record, f.name)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and f.name != "zero_stage":
                    assert value > 0, f"{f.name} = {value}: {_where(row)}"


def test_the_published_figure_is_one_the_source_printed():
    for row in ROWS:
        assert any(abs(n - row.published) < 1e-9 for n in _numbers(dict(row.printed))), _where(row)
        for value in row.also.values():
            assert any(abs(n - value) < 1e-9 for n in _numbers(dict(row.printed))), _where(row)


def test_memory_in_gb_is_printed_or_converted_from_printed_gib():
    for row in (r for r in ROWS if r.published_memory_gb is not None):
        printed = _numbers(dict(row.printed))
        as_printed = any(abs(n - row.published_memory_gb) < 1e-9 for n in printed)
        from_gib = any(abs(n * 2**30 / 1e9 - row.published_memory_gb) < 0.006 for n in printed)
        assert row.memory_kind and (as_printed or from_gib), _where(row)


def test_parallel_degrees_multiply_to_the_gpu_count():
    checked = 0
    for row in ROWS:
        lay = row.layout
        degrees = (lay.dp, lay.tp, lay.pp, lay.cp)
        if None not in degrees:
            assert lay.dp * lay.tp * lay.pp * lay.cp == row.cluster.gpus, _where(row)
            assert lay.model_parallel in (None, lay.tp * lay.pp), _where(row)
            checked += 1
        elif lay.model_parallel is not None:  # the product printed, not the split
            assert lay.dp * lay.model_parallel * (lay.cp or 1) == row.cluster.gpus, _where(row)
            assert str(lay.model_parallel) in row.printed.values(), _where(row)
    assert checked >= len(ROWS) // 2


def test_global_batch_is_dp_times_micro_batch_times_accumulation():
    checked = 0
    for row in ROWS:
        lay = row.layout
        if None not in (lay.dp, lay.micro_batch, lay.grad_accum, lay.global_batch):
            assert lay.dp * lay.micro_batch * lay.grad_accum == lay.global_batch, _where(row)
            checked += 1
    assert checked >= len(ROWS) // 2


def test_heads_split_evenly_over_tensor_parallel_ranks():
    for row in ROWS:
        tp = row.layout.tp
        if tp:
            assert row.model.heads % tp == 0, _where(row)
            assert row.model.kv_heads is None or row.model.kv_heads % tp == 0 or tp % row.model.kv_heads == 0


def test_a_sweep_is_one_model_on_one_cluster():
    sweeps: dict[str, list[PublishedRow]] = defaultdict(list)
    for row in ROWS:
        if row.sweep:
            sweeps[row.sweep].append(row)
    assert sweeps
    for name, members in sweeps.items():
        first = members[0]
        for row in members:
            assert (row.source, row.model, row.cluster, row.metric) == (
                first.source, first.model, first.cluster, first.metric), f"sweep {name}: {_where(row)}"
        if len(members) == 1:
            assert first.authors_choice, f"sweep {name} has one row: it must be the source's chosen layout"


def test_a_printed_memory_says_what_it_counts():
    """The planner compares a memory figure with its peak less what the figure leaves out
    (dt.plan.memory.MEMORY_SCOPES); a row printing one without its scope is refused by name."""
    from dt.plan.published import _row

    with_memory = [r for r in ROWS if r.published_memory_gb is not None]
    assert with_memory and all(r.memory_scope in MEMORY_SCOPES for r in with_memory)
    doc = json.loads(source_file("nanotron-2025").read_text())
    fields = {**doc["defaults"], **doc["rows"][0], "memory_scope": None}
    refusal = "nanotron-2025.json row 0: a printed memory needs memory_scope, one of device, reserved, "
    with pytest.raises(ValueError, match=refusal + "allocated; got None"):
        _row("nanotron-2025", 0, fields)


def test_an_unknown_source_is_refused_by_name():
    with pytest.raises(ValueError, match="no published source 'nope': one of"):
        load(["nope"])


def test_rows_are_frozen():
    with pytest.raises(AttributeError):
        ROWS[0].published = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        ROWS[0].printed["x"] = 1  # type: ignore[index]
