"""`dt tune` across hosts times each link level on its own pair; auto prices with those figures.

Hosts are marked with DT_HOST (no root): on one machine the "intra" pair talks
over shared memory and the "inter" pair over the torch wire, as on a cluster.
No timing assertions: the figures are checked for where they came from.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch.distributed as dist

from dt import hosts as H
from dt import transport
from dt.cost import machine
from dt.cost.levels import LEVELED, nics_from
from dt.tools import tune
from dt.tools.tune_levels import combine
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_hierarchical import marked_group


def test_level_pairs():
    assert H.level_pairs((0, 0, 1, 1)) == {"intra": (0, 1), "inter": (0, 2)}
    assert H.level_pairs((0, 1, 0, 1)) == {"intra": (0, 2), "inter": (0, 1)}
    assert H.level_pairs((0, 1, 1)) == {"intra": (1, 2), "inter": (0, 1)}  # host 0 has one rank
    assert H.level_pairs((0, 1)) == {"inter": (0, 1)}
    assert H.level_pairs((0, 0, 0)) == {"intra": (0, 1)}
    assert H.level_pairs((0,)) == {}
    assert H.rail_pairs((0, 0, 1, 1)) == [(0, 2), (1, 3)]
    assert H.rail_pairs((0, 0, 0, 1)) == [(0, 3)]
    assert H.rail_pairs((0, 0)) == []


def test_nics_from_the_rails_slowdown():
    assert nics_from(8e-9, 16e-9, 2) == 1  # two ranks through one NIC: each at half the rate
    assert nics_from(8e-9, 8.3e-9, 2) == 0  # no slowdown: one NIC per rank
    assert nics_from(8e-9, 16e-9, 4) == 2
    assert nics_from(8e-9, 0.0, 2) == 0 and nics_from(8e-9, 16e-9, 1) == 0


def _marked(hosts: list[int], fn, *args):
    """fn(*args) with this rank marked as host hosts[rank] and an empty tune cache (removed after)."""
    saved = {k: os.environ.get(k) for k in ("DT_HOST", "XDG_CACHE_HOME")}
    os.environ["DT_HOST"] = f"host{hosts[dist.get_rank()]}"
    machine.forget()
    try:
        with tempfile.TemporaryDirectory(prefix="dt-tune-") as cache:  # never the user's figures
            os.environ["XDG_CACHE_HOME"] = cache
            return fn(*args)
    finally:
        transport.reset()  # the world group connected across the marked hosts: not the next run's
        machine.forget()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tune(hosts: list[int]) -> dict:
    # the model's other terms quick: this test checks the level pairs (test_cost_terms checks the terms)
    return _marked(hosts, tune._worker, 3, False, 1, 0, ["shm", "torch"], 1, tune.REPEATS, "quick")


@pytest.mark.timeout(240)
def test_tune_times_each_level_on_its_pair(run):
    res = run(4, _tune, [0, 0, 1, 1], timeout=200)
    shm = combine([r["shm"]["levels"] for r in res])
    assert res[0]["shm"]["topology"] == "2x2"
    # filed apart ("shm:2x2", "gloo:2x2"): the group with shared memory inside each host is the shm wire's
    assert (res[0]["shm"]["wire"], res[0]["torch"]["wire"]) == ("shm", "torch")
    assert shm["intra"]["pair"] == [0, 1] and shm["intra"]["wire"] == "shm"
    assert shm["inter"]["pair"] == [0, 2] and shm["inter"]["wire"] == "torch"
    assert [sorted(r["shm"]["levels"]) for r in res] == [["inter", "intra", "rails"], ["intra", "rails"],
                                                         ["inter", "rails"], ["rails"]]
    assert shm["rails"]["pairs"] == 2 and shm["rails"]["wire"] == "torch"
    torch_wire = combine([r["torch"]["levels"] for r in res])
    assert torch_wire["intra"]["wire"] == "torch"  # the torch-only group: loopback inside a host
    for lv in (*shm.values(), *torch_wire.values()):
        assert lv["alpha"] > 0 and lv["beta"] >= 0 and lv["spread"] >= 1.0  # fastest of the repeats
        assert sorted(map(int, lv["exchange"])) == sorted(tune.EXCHANGE_SIZES)
    for mine in (r[w]["levels"][level] for r in res for w in ("shm", "torch") for level in r[w]["levels"]):
        assert mine["exchange"]["4"] == mine["alpha"]  # each end's curve holds its burst-timed alpha
    # the group's figures are the slower end of each pair
    ends = [r["shm"]["levels"]["intra"]["alpha"] for r in res[:2]]
    assert shm["intra"]["alpha"] == max(ends)


def _agreed(hosts: list[int], entries: list[dict]) -> dict:
    saved = os.environ.get("XDG_CACHE_HOME")
    machine.forget()
    try:
        with tempfile.TemporaryDirectory(prefix="dt-tune-") as cache:  # removed with what was saved
            os.environ["XDG_CACHE_HOME"] = cache
            for e in entries:
                machine.save(e)
            view = transport.resolve_group(marked_group(hosts))
            lv = view.links.agreed.levels
            return {"intra": [lv.intra.alpha, lv.intra.beta, lv.intra.gamma], "nics": lv.nics,
                    "inter": [lv.inter.alpha, lv.inter.beta], "source": view.links.agreed.source}
    finally:
        transport.reset()  # the world group connected across the marked hosts: not the next run's
        machine.forget()
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


def _agreed_rank0(hosts: list[int], entries: list[dict]) -> dict:
    return _agreed(hosts, entries if dist.get_rank() == 0 else [])


def _entry(backend: str, alpha: float, levels: dict | None) -> dict:
    e = {"backend": backend, "world": 4, "topology": "2x2", "alpha": alpha, "beta": 1e-9, "gamma": 3e-10,
         "measured_at": "test"}
    if levels is not None:
        e["levels"] = levels
    return e


@pytest.mark.timeout(200)
def test_auto_prices_with_the_pairs_figures(run):
    levels = {"intra": {"alpha": 7e-6, "beta": 2e-10}, "inter": {"alpha": 3e-4, "beta": 8e-9}}
    # rank 0's file only: the group talks over shared memory inside a host, so the "shm" entry's pairs
    entries = [_entry("gloo", 1e-3, None), dict(_entry("shm", 2e-3, levels), nics=1)]
    res = run(4, _agreed_rank0, [0, 0, 1, 1], entries, timeout=150)
    for r in res:
        assert r["intra"] == [7e-6, 2e-10, 3e-10]
        assert r["inter"] == [3e-4, 8e-9]
        assert "timed on their own pairs" in r["source"] and r["nics"] == 1


@pytest.mark.timeout(200)
def test_without_pairs_the_whole_group_prices_the_link_between_hosts(run):
    res = run(4, _agreed, [0, 0, 1, 1], [_entry("gloo", 1e-3, None)], timeout=150)
    assert all(r["inter"] == [1e-3, 1e-9] for r in res)
    assert all("pairs" not in r["source"] for r in res)


def _model_measured(hosts: list[int]) -> dict:
    from dt.tools import whatif_hosts

    return _marked(hosts, whatif_hosts.measure_worker, "all_reduce", [4096, 1 << 16], 2, ["shm", "torch"])


@pytest.mark.timeout(200)
def test_model_measured_across_hosts_prints_both_columns(run, capsys):
    from dt.tools import whatif_hosts

    res = run(4, _model_measured, [0, 0, 1, 1], timeout=150)
    assert res[0]["shm"]["hosts"] == [0, 0, 1, 1]
    whatif_hosts.print_measured("all_reduce", [4096, 1 << 16], res)
    out = capsys.readouterr().out
    assert out.count("all_reduce, 65.5 KB, 2 hosts, 4 ranks") == 2  # both wires
    for algo in LEVELED["all_reduce"]:
        assert out.count(f"  {algo}") + out.count(f"  {algo} *") >= 4, out
    assert "meas/pred" in out and "no `dt tune` figures" in out  # defaults, said so


def _one_host(hosts: list[int]) -> dict:
    from dt.tools import whatif_hosts

    return _marked(hosts, whatif_hosts.measure_worker, "all_reduce", [4096], 1, ["shm"])


def test_model_measured_on_one_host_is_the_flat_table(run):
    assert run(2, _one_host, [0, 0]) == [{"shm": None}, {"shm": None}]
