"""A collective's tensor forms are the collective: one function (dt.cost.family) says so for every table.

traffic_for, formula, auto's candidates and the bench all look a form up through it,
and every tensor form comes from one adapter (registry.tensor_forms).
"""

from __future__ import annotations

import pytest

from dt import cost
from dt.collectives import ALGORITHMS
from dt.collectives.auto import candidates


@pytest.mark.parametrize("form, base", sorted(cost.FORMS.items()))
def test_forms_price_and_count_as_their_collective(form, base):
    assert cost.family(form) == base and cost.family(base) == base
    for algo in candidates(form):
        assert cost.formula(form, algo, 4096.0, 4) == cost.formula(base, algo, 4096.0, 4)
        for rank in range(4):
            same = cost.traffic_for(base, algo, 100, 4, 4, rank)
            assert cost.traffic_for(form, algo, 100, 4, 4, rank) == same


def test_every_registered_tensor_form_has_its_list_form():
    for form, base in cost.FORMS.items():
        assert set(ALGORITHMS.get(form, {})) <= set(ALGORITHMS[base]), form
    for name in ("ring", "hierarchical"):  # the adapter's: named after what they run
        assert ALGORITHMS["all_gather_into_tensor"][name].__name__ == f"{name}_all_gather_into_tensor"
        assert ALGORITHMS["reduce_scatter_tensor"][name].__name__ == f"{name}_reduce_scatter_tensor"
    for form in ("all_gather_into_tensor", "reduce_scatter_tensor"):  # every tensor form is the adapter's
        for name, fn in ALGORITHMS[form].items():
            assert fn.__name__ == f"{name}_{form}" and fn.__qualname__.startswith("tensor_forms."), fn
