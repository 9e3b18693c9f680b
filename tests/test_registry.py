"""One record per algorithm: what @algorithm registers is what every cost table knows, and no more.

Adding an algorithm touches its own file (its @algorithm line names its traffic, formula and
two-level schedule in dt.cost) and at most one test line: these checks fail when an
algorithm is registered without its traffic or a price, or when a cost table names an
algorithm the registry does not have.
"""

from __future__ import annotations

import pytest

from dt import cost
from dt.bench.scaling.model import MODELED_ALL_REDUCE
from dt.collectives import ALGORITHMS, auto, registry
from dt.cost import records
from dt.cost.records import ALIASES, COSTS, LEVELED, CostRecord


def test_every_registered_algorithm_has_a_complete_record():
    assert registry.unpriced() == []


def test_every_cost_table_names_registered_algorithms():
    for (collective, name), record in COSTS.items():
        assert name in ALGORITHMS[collective], (collective, name)
        assert (record.collective, record.name) == (collective, name)
    for collective, algos in LEVELED.items():
        assert set(algos) <= set(ALGORITHMS[collective]), collective
        assert all(COSTS[(collective, a)].levels is not None for a in algos)
    for (collective, alias), target in ALIASES.items():
        assert ALGORITHMS[collective][alias] is ALGORITHMS[collective][target], (collective, alias)
    assert set(MODELED_ALL_REDUCE) <= set(auto.candidates("all_reduce"))


def test_a_record_is_dt_costs_arithmetic():
    """The record points at dt.cost (the layer below): the textbook and two-level functions live there."""
    for record in COSTS.values():
        for fn in (record.formula, record.levels):
            assert fn is None or fn.__module__.startswith("dt.cost."), (record.name, fn)
        assert record.wires in (("shm",), registry.POINT_TO_POINT)
        assert (record.wires == ("shm",)) == registry.needs_shared_memory(record.collective, record.name)
        assert (record.wires == ("shm",)) == ((record.collective, record.name) in records.LOADSTORE)


def test_tables_are_the_records():
    """traffic_for, formula, schedule and auto's candidates answer from the records alone."""
    for (collective, name), record in COSTS.items():
        call = records.call_of(collective, name, 10, 4, 4, 1, root=2)
        assert cost.traffic_for(collective, name, 10, 4, 4, 1, root=2) == record.traffic(call)
        if record.formula is None:
            with pytest.raises(KeyError):
                cost.formula(collective, name, 4096.0, 4)
        else:
            assert cost.formula(collective, name, 4096.0, 4) == record.formula(4096.0, 4, None, None)
        assert (name in auto.candidates(collective)) == (record.formula is not None)
    with pytest.raises(KeyError):
        cost.traffic_for("all_reduce", "no_such_algorithm", 10, 4, 4, 0)


def _scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty registry and cost table (one table seen from both modules), so a test can
    register on its own."""
    costs: dict = {}
    for module, name, empty in ((registry, "ALGORITHMS", {}), (registry, "SHARED_MEMORY", set()),
                                (registry, "COSTS", costs), (records, "COSTS", costs),
                                (records, "LEVELED", {}), (records, "LOADSTORE", set())):
        monkeypatch.setattr(module, name, empty)


def test_an_algorithm_without_traffic_or_formula_is_named(monkeypatch):
    _scratch_registry(monkeypatch)

    @registry.algorithm("all_reduce", "priced", traffic=cost.traffic.hierarchical_traffic,
                        formula=cost.textbook.ring_all_reduce)
    def priced(tensor, op=None, group=None):  # noqa: ANN001, ANN202
        pass

    assert registry.unpriced() == []

    @registry.algorithm("all_reduce", "uncounted", formula=cost.textbook.ring_all_reduce)
    def uncounted(tensor, op=None, group=None):  # noqa: ANN001, ANN202
        pass

    @registry.algorithm("broadcast", "unpriced", traffic=cost.traffic.hierarchical_traffic)
    def unpriced(tensor, src, group=None):  # noqa: ANN001, ANN202
        pass

    assert registry.unpriced() == ["all_reduce uncounted: registered without traffic=",
                                   "broadcast unpriced: registered without formula= (or levels=)"]


def test_a_cost_record_without_its_algorithm_is_named():
    record = CostRecord("all_reduce", "ghost", lambda c: None, None, None, ("shm",))
    costs = {**COSTS, ("all_reduce", "ghost"): record}
    assert registry.unpriced(costs=costs) == ["all_reduce ghost: a cost record names no registered algorithm"]
    algorithms = {**ALGORITHMS, "all_reduce": {**ALGORITHMS["all_reduce"], "unrecorded": print}}
    assert registry.unpriced(algorithms=algorithms) == [
        "all_reduce unrecorded: registered without a cost record"]
