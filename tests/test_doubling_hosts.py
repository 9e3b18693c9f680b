"""The doubling all-reduces across hosts: partner order reversed so the big steps stay inside a host.

Hosts marked with DT_HOST (no root). Checked against torch's all_reduce, the
transport's counts against dt.cost.traffic_for, and the bytes crossing hosts
against the two-level schedule (tests/test_hierarchical.py checks every
algorithm's bytes per wire against dt.cost.levels on more layouts).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost, transport
from dt.layout import Fold, bit_reverse
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)
from tests.test_collectives import _same, _torch_op, data
from tests.test_hierarchical import marked_group

ALGOS = ("rabenseifner", "recursive_doubling")


def test_reversed_fold():
    assert [bit_reverse(v, 3) for v in range(8)] == [0, 4, 2, 6, 1, 5, 3, 7]
    for p in (2, 3, 4, 5, 6, 8, 12):
        for reverse in (False, True):
            folds = [Fold(p, r, reverse) for r in range(p)]
            playing = {f.vrank: r for r, f in enumerate(folds) if f.vrank is not None}
            assert sorted(playing) == list(range(folds[0].p2))
            assert all(folds[0].real(v) == r for v, r in playing.items())
    # 2 hosts x 2: the first halving step (distance p'/2 in virtual ranks) pairs ranks 0 and 1
    f = Fold(4, 0, True)
    assert f.real(f.vrank ^ 2) == 1 and f.real(f.vrank ^ 1) == 2


def test_half_the_bytes_cross_hosts():
    hosts = (0, 0, 1, 1)
    flat = cost.level_bytes(cost.schedule("all_reduce", "rabenseifner", 1000, 4, (0, 0, 0, 0)), (0, 1, 2, 3))
    across = cost.level_bytes(cost.schedule("all_reduce", "rabenseifner", 1000, 4, hosts), hosts)
    assert flat["inter_sent"][0] == 4 * (500 + 250 + 250 + 500)  # ranks 0..3 all apart: every step
    assert across["inter_sent"] == [4 * (250 + 250)] * 4  # only the two quarter steps cross
    assert across["intra_sent"] == [4 * (500 + 500)] * 4


def _check(hosts: list[int]) -> list[str]:
    g = marked_group(hosts)
    view = transport.resolve_group(g)
    r, p = view.rank, view.size
    topo = tuple(transport.topology_of(view).hosts)
    bad: list[str] = []
    dt.set_validation(False)  # count the algorithm's messages only
    try:
        _cases(g, r, p, topo, hosts, bad)
    finally:
        dt.set_validation(None)
    return bad


def _cases(g, r: int, p: int, topo: tuple[int, ...], hosts: list[int], bad: list[str]) -> None:
    case = 0
    for algo in ALGOS:
        for dtype, op in ((torch.float32, "SUM"), (torch.int64, "MAX"), (torch.float64, "AVG")):
            for n in (0, 1, p - 1, 13, 1000):
                case += 1
                x = data(case, r, n, dtype, op)
                ref = x.clone()
                dist.all_reduce(ref, op=_torch_op(op), group=g)
                with dt.traffic() as t:
                    dt.all_reduce(x, op=_torch_op(op), group=g, algorithm=algo)
                if not _same(x, ref):
                    bad.append(f"{hosts} {algo} {dtype} {op} n={n}: wrong result on rank {r}")
                want = cost.traffic_for("all_reduce", algo, n, x.element_size(), p, r, hosts=topo)
                if (t.bytes_sent, t.bytes_received) != (want.bytes_sent, want.bytes_received):
                    bad.append(f"{hosts} {algo} n={n} rank {r}: sent/received {t.bytes_sent}/"
                               f"{t.bytes_received}, traffic_for {want.bytes_sent}/{want.bytes_received}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 1, 1, 2, 2]])
def test_against_torch_across_hosts(run, hosts):
    for bad in run(len(hosts), _check, hosts, timeout=240):
        assert bad == []
