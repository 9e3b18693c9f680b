"""The two-level model (dt.cost.levels): textbook figures, and its bytes equal the per-rank table's."""

from __future__ import annotations

import pytest

from dt import cost
from dt.cost.levels import LEVELED, Levels, level_bytes, schedule, two_level
from dt.cost.machine import Machine

LAYOUTS = [(0,), (0, 0, 1, 1), (0, 0, 0, 1), (0, 1, 0, 1), (0, 0, 1, 1, 1), (0, 0, 1, 1, 2, 2), (0, 0, 0),
           (0, 1, 2)]
CLUSTER = Levels(Machine(5e-6, 1 / 450e9, 0.0), Machine(10e-6, 1 / 50e9, 0.0))


def _hosts(h: int, g: int) -> tuple[int, ...]:
    return tuple(i for i in range(h) for _ in range(g))


@pytest.mark.parametrize("hosts", LAYOUTS)
def test_level_bytes_add_up_to_traffic_for(hosts):
    p = len(hosts)
    for coll, algos in LEVELED.items():
        for algo in algos:
            for n in (0, 1, 7, 1000):
                uneven = [n if algo == "bruck" else n + j % 2 for j in range(p)]
                numels = n if coll == "all_reduce" else uneven
                per = level_bytes(schedule(coll, algo, numels, 4, hosts), hosts)
                for r in range(p):
                    t = cost.traffic_for(coll, algo, numels, 4, p, r, hosts=hosts)
                    assert per["intra_sent"][r] + per["inter_sent"][r] == t.bytes_sent, (coll, algo, n, r)
                    assert per["intra_received"][r] + per["inter_received"][r] == t.bytes_received


@pytest.mark.parametrize("h,g", [(2, 8), (4, 4), (3, 2)])
def test_textbook_two_level_figures(h, g):
    hosts, p = _hosts(h, g), h * g
    n = 4 * p * h * 1000  # elements: every split exact
    nb = 4 * n
    hier = two_level("all_reduce", "hierarchical", n, 4, hosts, CLUSTER)
    assert hier.inter_rank == 2 * (h - 1) * nb // (h * g)  # 2(H-1)/H n/G per rank across hosts
    assert hier.inter_host == 2 * (h - 1) * nb // h  # 2(H-1)/H n leaving each host
    assert hier.intra_rank == 2 * (g - 1) * nb // g
    ring = two_level("all_reduce", "ring", n, 4, hosts, CLUSTER)
    assert ring.inter_rank == ring.inter_host == 2 * (p - 1) * nb // p  # the boundary rank sends it all
    assert ring.steps == 2 * (p - 1) and hier.steps == 2 * (g - 1) + 2 * (h - 1)
    assert hier.total < ring.total  # slow link: 1/G of the bytes per NIC
    rs = two_level("reduce_scatter", "hierarchical", n // p, 4, hosts, CLUSTER)
    assert rs.inter_rank == (h - 1) * nb // (h * g)


def test_one_host_is_the_flat_ring():
    hosts = (0,) * 4
    flat = cost.estimate("all_reduce", "ring", 4000, 4, alpha=5e-6, beta=1 / 450e9)
    two = two_level("all_reduce", "ring", 1000, 4, hosts, CLUSTER)
    assert two.inter_rank == 0 and two.steps == flat.steps
    assert two.total == pytest.approx(flat.total)
    # on one host the hierarchical all-reduce is the ring's two laps
    assert two_level("all_reduce", "hierarchical", 1000, 4, hosts, CLUSTER).total == pytest.approx(flat.total)


def test_rabenseifner_first_halving_stays_inside_a_host():
    hosts = _hosts(2, 2)
    steps = schedule("all_reduce", "rabenseifner", 1000, 4, hosts)
    # the partner order reversed across hosts: 0-1, 2-3 first (n/2), not 0-2, 1-3 (the measurement)
    assert all(hosts[a] == hosts[b] and nb == 2000 for a, b, nb in steps[0][0])
    assert all(hosts[a] != hosts[b] and nb == 1000 for a, b, nb in steps[1][0])
    flat = schedule("all_reduce", "rabenseifner", 1000, 4, (0, 0, 0, 0))[0][0]
    assert sorted((a, b) for a, b, _ in flat)[:2] == [(0, 2), (1, 3)]  # one host: the usual order


def test_shared_nic_slows_what_leaves_the_host():
    hosts = _hosts(2, 4)
    one_nic = Levels(CLUSTER.intra, CLUSTER.inter, nics=1)
    hier, ring = (two_level("all_reduce", a, 1 << 20, 4, hosts, one_nic) for a in ("hierarchical", "ring"))
    per_rank = two_level("all_reduce", "hierarchical", 1 << 20, 4, hosts, CLUSTER)
    assert hier.total > per_rank.total  # four ranks share one NIC
    assert hier.inter_host < ring.inter_host


def test_dt_model_two_levels(capsys):
    from dt.tools import whatif

    assert whatif.main(["--hosts", "2", "--per-host", "8", "--intra", "450GB/s,5us", "--inter",
                        "50GB/s,10us", "--size", "1GB", "all_reduce"]) == 0
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.strip().startswith("hierarchical"))
    assert "125 MB" in line and "1.75 GB" in line  # 2(H-1)/H n/G across, 2(G-1)/G n inside
    # Rabenseifner, partner order reversed across hosts, halves inside the host first: the same bytes
    # across, in 8 steps, not 16 (its first step would otherwise send n/2 across)
    raben = next(s for s in out.splitlines() if s.strip().startswith("rabenseifner"))
    assert "*" in raben and "125 MB" in raben and "1.75 GB" in raben
    ring = next(s for s in out.splitlines() if s.strip().startswith("ring"))
    assert ring.endswith("1.88 GB")  # 2(p-1)/p n leaves each host through its boundary rank
    with pytest.raises(SystemExit):
        whatif.main(["--hosts", "2", "--size", "1MB"])  # --per-host missing
    with pytest.raises(SystemExit):
        whatif.main(["--hosts", "2", "--per-host", "2", "--inter", "50GB/s"])  # no latency
