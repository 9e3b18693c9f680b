"""Hierarchical collectives against torch's, on hosts simulated with DT_HOST.

Each test makes a fresh group whose ranks are marked as hosts (DT_HOST) at
its first collective: ranks of one host talk over shared memory, the others
over the torch wire, as on a real cluster. Layouts: 2x2, 2x3, 3x2, uneven
(3+1, 2+3), interleaved (0,1,0,1: hosts not contiguous), one host, one rank
per host, world 1, and a subgroup.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import dt
from dt import hosts as H
from dt import transport
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_collectives import DTYPES, OPS, _same, _torch_op, data


def marked_group(hosts: list[int], ranks: list[int] | None = None):
    """A fresh group (of `ranks`, default all), connected with rank r marked as host hosts[r]."""
    r, p = dist.get_rank(), dist.get_world_size()
    saved = os.environ.get("DT_HOST")
    os.environ["DT_HOST"] = f"host{hosts[r]}"
    try:
        g = dist.new_group(ranks if ranks is not None else list(range(p)))
        if ranks is None or r in ranks:
            dt.barrier(group=g, algorithm="dissemination")  # connects it
    finally:
        if saved is None:
            os.environ.pop("DT_HOST", None)
        else:
            os.environ["DT_HOST"] = saved
    return g


def _cases(g, failures: list[str], tag: str) -> None:
    """Every hierarchical algorithm on group g against torch's collective on g."""
    view = transport.resolve_group(g)
    r, p = view.rank, view.size
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if op == "AVG" and not dtype.is_floating_point:
                continue
            if dtype == torch.bool and op not in ("MIN", "MAX"):
                continue
            sizes = (0, 1, max(p - 1, 1), 13, 1000) if dtype == torch.float32 else (13,)
            for n in sizes:
                case += 1
                x = data(case, r, n, dtype, op)
                ref = x.clone()
                dist.all_reduce(ref, op=_torch_op(op), group=g)
                dt.all_reduce(x, op=_torch_op(op), group=g, algorithm="hierarchical")
                if not _same(x, ref):
                    failures.append(f"{tag} all_reduce {dtype} {op} n={n}")
    for dtype, op in ((torch.float32, "SUM"), (torch.float64, "AVG"), (torch.int64, "MAX"),
                      (torch.int32, "PRODUCT")):
        for n in (0, 1, 5, 257):  # per rank
            case += 1
            full = data(case, r, n * p, dtype, op)
            ref = full.clone()
            dist.all_reduce(ref, op=_torch_op(op), group=g)
            out = torch.full((n,), 7, dtype=dtype)
            dt.reduce_scatter_tensor(out, full, op=_torch_op(op), group=g, algorithm="hierarchical")
            if not _same(out, ref[r * n:(r + 1) * n]):
                failures.append(f"{tag} reduce_scatter_tensor {dtype} {op} n={n}")
    for n in (0, 1, 6, 301):
        case += 1
        mine = data(case, r, n, torch.float16)
        refs = [torch.empty(n, dtype=torch.float16) for _ in range(p)]
        dist.all_gather(refs, mine, group=g)
        outs = torch.empty(n * p, dtype=torch.float16)
        dt.all_gather_into_tensor(outs, mine, group=g, algorithm="hierarchical")
        if not _same(outs, torch.cat(refs)):
            failures.append(f"{tag} all_gather_into_tensor n={n}")
    # uneven blocks: block j has j+3 elements (rank j's), checked against each rank's data
    case += 1
    lens = [j + 3 for j in range(p)]
    gathered = [torch.empty(k, dtype=torch.int64) for k in lens]
    dt.all_gather(gathered, data(case, r, lens[r], torch.int64), group=g, algorithm="hierarchical")
    if not all(_same(gathered[j], data(case, j, lens[j], torch.int64)) for j in range(p)):
        failures.append(f"{tag} all_gather uneven")
    ins = [data(case + 1 + j, r, lens[j], torch.float32) for j in range(p)]
    out = torch.empty(lens[r])
    dt.reduce_scatter(out, ins, group=g, algorithm="hierarchical")
    expect = sum(data(case + 1 + r, q, lens[r], torch.float32) for q in range(p))
    if not _same(out, expect):
        failures.append(f"{tag} reduce_scatter uneven")


def _layout(hosts: list[int]) -> dict:
    g = marked_group(hosts)
    view = transport.resolve_group(g)
    topo = transport.topology_of(view)
    failures: list[str] = []
    _cases(g, failures, f"hosts={hosts}")
    wires = [view.wire_for(q).name for q in range(view.size)]
    return {"hosts": list(topo.hosts), "order": list(topo.order), "rail": list(topo.rail()),
            "wires": wires, "bad": failures}


LAYOUTS = {
    "2x2": [0, 0, 1, 1],
    "2x3": [0, 0, 0, 1, 1, 1],
    "3x2": [0, 0, 1, 1, 2, 2],
    "3+1": [0, 0, 0, 1],
    "2+3": [0, 0, 1, 1, 1],
    "interleaved": [0, 1, 0, 1],
    "one host": [0, 0, 0],
    "one rank per host": [0, 1, 2],
    "world 1": [0],
}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_hierarchical_matches_torch(run, name):
    hosts = LAYOUTS[name]
    results = run(len(hosts), _layout, hosts, timeout=360)
    for r, res in enumerate(results):
        assert res["bad"] == [], res["bad"]
        numbered = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
        assert res["hosts"] == [numbered[h] for h in hosts]
        assert res["order"] == list(H.host_order(tuple(res["hosts"])))
        assert res["rail"] == list(H.rail(tuple(res["hosts"]), H.local_index(tuple(res["hosts"]), r)))
        if len(hosts) > 1:  # peers on this rank's host over shared memory, the others over torch
            assert [w == "shm" for q, w in enumerate(res["wires"]) if q != r] == \
                [hosts[q] == hosts[r] for q in range(len(hosts)) if q != r]


def _subgroup() -> list[str]:
    r = dist.get_rank()
    g = marked_group([0, 0, 1, 1], ranks=[1, 2, 3])
    failures: list[str] = []
    if r != 0:
        _cases(g, failures, "subgroup [1,2,3]")
    return failures


@pytest.mark.timeout(300)
def test_hierarchical_on_a_subgroup(run):
    for failures in run(4, _subgroup, timeout=240):
        assert failures == []


def _per_level(hosts: list[int]) -> list[str]:
    """Each algorithm's bytes per wire (shm inside a host, torch across) against dt.cost.level_bytes."""
    from dt import cost

    g = marked_group(hosts)
    view = transport.resolve_group(g)
    r, p = view.rank, view.size
    topo = tuple(transport.topology_of(view).hosts)
    dt.set_validation(False)
    bad = []
    try:
        for coll, algos in cost.levels.LEVELED.items():
            for algo in algos:
                for n in (1, 13, 1001):
                    x = data(n, r, n * p, torch.float32)
                    with dt.traffic() as t:
                        if coll == "all_reduce":
                            dt.all_reduce(x, group=g, algorithm=algo)
                            numels: int | list[int] = n * p
                        elif coll == "reduce_scatter":
                            dt.reduce_scatter_tensor(torch.empty(n), x, group=g, algorithm=algo)
                            numels = n
                        else:
                            dt.all_gather_into_tensor(torch.empty(n * p), x[:n], group=g, algorithm=algo)
                            numels = n
                    model = cost.level_bytes(cost.schedule(coll, algo, numels, 4, topo), topo)
                    got = (t.by_wire["shm"].bytes_sent, t.by_wire["shm"].bytes_received,
                           t.by_wire["torch"].bytes_sent, t.by_wire["torch"].bytes_received)
                    want = (model["intra_sent"][r], model["intra_received"][r], model["inter_sent"][r],
                            model["inter_received"][r])
                    if got != want:
                        bad.append(f"{coll} {algo} n={n} rank {r}: measured {got}, model {want}")
    finally:
        dt.set_validation(None)
    return bad


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["2x2", "3+1", "interleaved", "2+3"])
def test_bytes_per_level_match_the_model(run, name):
    hosts = LAYOUTS[name]
    for bad in run(len(hosts), _per_level, hosts, timeout=240):
        assert bad == []
