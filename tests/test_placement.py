"""`dt train --layout tp-inside|tp-across` on hosts marked with DT_HOST (no root).

The two layouts place tp's groups inside a host or across hosts; both train
the same trajectory, and across hosts the report prints both layouts' predicted
tp and dp time per step from the two-level model. No timing assertions.
"""

from __future__ import annotations

import itertools

import pytest

from dt import cost, train
from dt.parallel.mesh import grid_of, mesh_groups
from dt.train.placement import predict
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_mesh_train import _args
from tests.test_tune_levels import _marked


def test_tp_across_spreads_tp_over_host_contiguous_ranks():
    inside, across = mesh_groups(2, 2, 1), mesh_groups(2, 2, 1, tp_across=True)
    assert inside["tp"] == [(0, 1), (2, 3)] and inside["dp"] == [(0, 2), (1, 3)]
    assert across["tp"] == [(0, 2), (1, 3)] and across["dp"] == [(0, 1), (2, 3)]
    for dp, tp, pp, cp, flag in itertools.product((1, 2, 3), (1, 2), (1, 2), (1, 2), (False, True)):
        grid = grid_of(dp, tp, pp, cp, tp_across=flag, rank=0)
        for r in range(dp * tp * pp * cp):
            c = grid.coords(r)
            inner = (c["pp"] * dp + c["dp"]) * cp + c["cp"]  # tp outermost, or innermost
            assert r == (c["tp"] * (dp * cp * pp) + inner if flag else inner * tp + c["tp"])
            assert grid.rank_at(c) == r


def test_tp_across_is_predicted_slower_on_a_slow_link():
    args = _args(2, 2, 1)
    levels = cost.Levels(cost.Machine(5e-6, 1e-11, 0.0), cost.Machine(1e-4, 1e-9, 0.0))
    pred = predict(args, (0, 0, 1, 1), levels, grad_bytes=1 << 16, itemsize=8)
    assert pred["tp-across"]["tp"] > pred["tp-inside"]["tp"]
    assert pred["tp-across"]["dp"] < pred["tp-inside"]["dp"]  # dp moves inside the host
    assert pred["tp-inside"]["total"] == pred["tp-inside"]["tp"] + pred["tp-inside"]["dp"]


def _train(hosts: list[int], layout_name: str) -> dict:
    return _marked(hosts, train.train_worker, _args(2, 2, 1, steps=2, layout=layout_name))


@pytest.mark.timeout(240)
def test_both_layouts_train_alike_and_report_the_prediction(run):
    inside = run(4, _train, [0, 0, 1, 1], "tp-inside", timeout=200)
    across = run(4, _train, [0, 0, 1, 1], "tp-across", timeout=200)
    assert all(abs(a - b) < 1e-9 for x, y in zip(inside, across) for a, b in zip(x["losses"], y["losses"]))
    assert inside[1]["coords"][:2] == (0, 1) and across[1]["coords"][:2] == (1, 0)
    text = train.report(_args(2, 2, 1, steps=2, layout="tp-across"), across)
    assert "across 2 hosts, this run tp-across" in text
    assert "tp-across (this run)" in text and "tp-across - tp-inside:" in text
    assert inside[0]["placement"]["predicted"] == across[0]["placement"]["predicted"]


def _one_host() -> dict:
    return _marked([0, 0], train.train_worker, _args(2, 1, 1, steps=1))


def test_no_prediction_on_one_host(run):
    assert all(r["placement"] is None for r in run(2, _one_host))
