"""dt.hosts: the index arithmetic over hosts (no processes)."""

from __future__ import annotations

import itertools

import pytest

from dt import hosts as H

LAYOUTS = [(0,), (0, 0, 1, 1), (0, 0, 0, 1, 1, 1), (0, 0, 1, 1, 2, 2), (0, 0, 0, 1), (0, 1, 0, 1),
           (0, 0, 1, 1, 1), (0, 1, 2), (0, 0, 0), (0, 1, 1, 0, 2)]


def test_textbook_layout():
    hosts = (0, 0, 1, 1)
    assert H.members(hosts) == [(0, 1), (2, 3)]
    assert [H.local_index(hosts, r) for r in range(4)] == [0, 1, 0, 1]
    assert H.rail(hosts, 1) == (1, 3)
    assert H.runs(hosts) == [H.PieceRun(0, 1, (0, 2)), H.PieceRun(1, 2, (1, 3))]
    assert H.delivery(hosts) == [H.Delivery((0, 2), (0, 2)), H.Delivery((1, 3), (1, 3))]
    assert H.collected_by(hosts, 3) == [1, 3]
    assert H.crossings(hosts) == 2 and H.uniform(hosts)


def test_interleaved_hosts_order_contiguously():
    hosts = (0, 1, 0, 1, 0, 1)
    assert H.host_order(hosts) == (0, 2, 4, 1, 3, 5)
    assert H.crossings(hosts) == 6  # every hop of the group-order ring crosses
    assert H.crossings(hosts, H.host_order(hosts)) == 2  # one slow hop into and out of each host


def test_uneven_hosts():
    hosts = (0, 0, 0, 1)  # 3 + 1: the lone rank owns every piece and meets each rank of the other host
    assert H.pieces(hosts) == 3
    assert H.owned(1, 3) == [(0, 3)] and H.owned(2, 3) == [(0, 2), (2, 3)]
    assert [r.owners for r in H.runs(hosts)] == [(0, 3), (1, 3), (2, 3)]
    assert H.collected_by(hosts, 3) == [0, 1, 2, 3]
    assert not H.uniform(hosts)


@pytest.mark.parametrize("hosts", LAYOUTS)
def test_every_piece_and_destination_is_served_once(hosts):
    p, s = len(hosts), H.pieces(hosts)
    assert sorted(H.host_order(hosts)) == list(range(p))
    assert H.crossings(hosts, H.host_order(hosts)) == (len(H.members(hosts)) if len(H.members(hosts)) > 1
                                                        else 0)
    # runs tile the pieces; each run has one owner per host, the owner of those pieces there
    covered = [j for run in H.runs(hosts) for j in range(run.lo, run.hi)]
    assert covered == list(range(s))
    for run in H.runs(hosts):
        assert [hosts[o] for o in run.owners] == list(range(len(H.members(hosts))))
    # every destination in exactly one delivery, served by itself on its own host
    dests = sorted(d for dl in H.delivery(hosts) for d in dl.dests)
    assert dests == list(range(p))
    for dl in H.delivery(hosts):
        assert set(dl.dests) <= set(dl.owners)
    # a host's ranks collect disjoint sets covering every destination
    for m in H.members(hosts):
        collected = list(itertools.chain.from_iterable(H.collected_by(hosts, r) for r in m))
        assert sorted(collected) == list(range(p))
