"""auto across hosts: one decision on every rank, from rank 0's figures, keyed by topology.

Each rank gets its own tune file (XDG_CACHE_HOME per rank) with different
figures for the same topology; the group's ranks still choose alike (rank
0's), with validation off, and the collectives they run are correct.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost, transport
from dt.collectives import agreed, auto
from dt.cost import machine
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_hierarchical import marked_group

SIZES = (64, 32 << 10, 1 << 20, 32 << 20)


def _entry(backend: str, world: int, topology: str, alpha: float, beta: float) -> dict:
    return {"backend": backend, "world": world, "topology": topology, "alpha": alpha, "beta": beta,
            "gamma": 0.1e-9, "measured_at": "test"}


def _decide(hosts: list[int], files: bool) -> dict:
    r, p = dist.get_rank(), dist.get_world_size()
    saved = os.environ.get("XDG_CACHE_HOME")
    tmp = tempfile.mkdtemp(prefix="dt-tune-")
    os.environ["XDG_CACHE_HOME"] = tmp
    machine.forget()
    try:
        shape = f"2x{p // 2}"
        if files:  # rank 0: a slow, high-latency link between hosts; the others: a wide one, 50 ms a step
            slow = r == 0
            for e in (_entry("gloo", p, shape, 5e-3 if slow else 5e-2, 1e-8 if slow else 1e-12),
                      _entry("gloo", p, f"1x{p}", 1e-6, 1e-11)):  # a loopback figure, never used across
                machine.save(e)
        dt.set_validation(False)
        g = marked_group(hosts)
        view = transport.resolve_group(g)
        fig = view.links.agreed
        picks = {f"{c}:{n}": auto.choose(c, "auto", n, view)
                 for c in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")
                 for n in SIZES}
        x = torch.full((1001,), float(r + 1))
        dt.all_reduce(x, group=g)  # auto, validation off: every rank must run the same algorithm
        ok = torch.equal(x, torch.full((1001,), float(p * (p + 1) // 2)))
        mine = agreed.local_figures(view)
        return {"picks": picks, "ok": ok, "inter": [fig.levels.inter.alpha, fig.levels.inter.beta],
                "note": fig.note, "mine": mine["inter"][:2]}
    finally:
        dt.set_validation(None)
        machine.forget()
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved
        shutil.rmtree(tmp, ignore_errors=True)  # the rank's tune file and its directories


@pytest.mark.timeout(200)
def test_every_rank_decides_with_rank_0s_figures(run):
    res = run(4, _decide, [0, 0, 1, 1], True, timeout=150)
    assert all(r["ok"] for r in res)
    assert all(r["picks"] == res[0]["picks"] for r in res)  # one decision, whatever each file says
    assert all(r["inter"] == [5e-3, 1e-8] for r in res)  # rank 0's figures for 2x2
    assert res[1]["mine"] != res[0]["mine"]  # the files did differ
    assert all(r["note"] == "" for r in res)
    # rank 0's slow link makes the hierarchical all-reduce win at 1 MB; the others' wide,
    # high-latency one would have picked recursive doubling there (fewest steps, dt.cost.levels)
    wide = cost.Levels(machine.DEFAULT_SHM_MACHINE, cost.Machine(5e-2, 1e-12, 0.1e-9))
    assert auto.best_two_level("all_reduce", 1 << 20, (0, 0, 1, 1), wide) == "recursive_doubling"
    assert res[0]["picks"]["all_reduce:1048576"] == "hierarchical"


@pytest.mark.timeout(200)
def test_loopback_figures_are_not_used_across_hosts(run):
    res = run(4, _decide, [0, 0, 1, 1], False, timeout=150)
    assert all(r["picks"] == res[0]["picks"] for r in res)
    assert all("no `dt tune` figures" in r["note"] for r in res)
    assert all(r["inter"] == [machine.DEFAULT_MACHINE.alpha, machine.DEFAULT_MACHINE.beta] for r in res)


def test_figures_are_keyed_by_topology(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine.forget()
    machine.save(_entry("gloo", 4, "1x4", 1e-4, 1e-9))
    assert machine.figures("gloo", 4, "2x2") is None  # loopback world 4 does not price two hosts
    assert machine.figures("gloo", 4)["alpha"] == 1e-4
    machine.save(_entry("gloo", 4, "2x2", 2e-4, 2e-9))
    assert machine.figures("gloo", 4, "2x2")["alpha"] == 2e-4
    assert machine.figures("gloo", 4)["alpha"] == 1e-4  # the one-host entry still answers one host
    saved = json.loads((tmp_path / "dt" / "tune.json").read_text())
    assert sorted(saved) == ["gloo:2x2", "gloo:4"]
    machine.forget()
