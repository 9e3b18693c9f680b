"""The price of one collective on a group of the cluster's ranks, on the level(s) it sits on.

A group inside one host is priced by dt.cost.time.estimate with the intra
figures (the cheapest of the algorithms dt's `auto` chooses among, as auto
picks the model's lowest; on this machine with the terms `dt tune` measured,
dt.cost.overheads); one spanning hosts by dt.cost.levels.two_level
on its hosts. A point-to-point send is one step: alpha + bytes * beta.
"""

from __future__ import annotations

import functools

from dt.cost.levels import LEVELED, Levels, two_level
from dt.cost.overheads import overheads
from dt.cost.time import estimate
from dt.plan.cluster import Cluster

__all__ = ["collective_seconds", "group_hosts", "send_seconds"]

ONE_HOST = {"all_reduce": ("ring", "naive", "rabenseifner", "recursive_doubling"),
            "reduce_scatter": ("ring",), "all_gather": ("ring", "bruck", "recursive_doubling"),
            "all_to_all": ("pairwise",)}
LOADSTORE = {"all_reduce": ("one_shot", "two_shot"), "reduce_scatter": ("one_shot",),
             "all_gather": ("one_shot",), "all_to_all": ("one_shot",)}


def group_hosts(cluster: Cluster, ranks: tuple[int, ...]) -> tuple[int, ...]:
    """Host index of each rank, renumbered 0, 1, ... in order of first appearance (dt.hosts')."""
    return _hosts(cluster.per_host, ranks)


@functools.lru_cache(maxsize=65536)
def _hosts(per_host: int, ranks: tuple[int, ...]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(r // per_host, len(seen)) for r in ranks)


def _exact(collective: str, algorithm: str, nbytes: int, itemsize: int, hosts: tuple[int, ...],
           levels: Levels) -> float:
    p = len(hosts)
    if p > BIG_GROUP and max(hosts) > 0:
        return _composed(collective, nbytes, hosts, levels)
    if max(hosts) == 0:  # one host
        m = levels.intra
        return estimate(collective, algorithm, nbytes, p, alpha=m.alpha, beta=m.beta, gamma=m.gamma).total
    return _across(collective, algorithm, nbytes, itemsize, hosts, levels)


def _across(collective: str, algorithm: str, nbytes: int, itemsize: int, hosts: tuple[int, ...],
            levels: Levels) -> float:
    p = len(hosts)
    if collective == "all_to_all":  # every rank sends (p-1)/p of its bytes, most of it across
        m = levels.inter
        return estimate("all_to_all", "pairwise", nbytes, p, alpha=m.alpha, beta=m.beta).total
    numels = nbytes // itemsize
    return two_level(collective, algorithm, numels if collective == "all_reduce" else [numels // p] * p,
                     itemsize, hosts, levels).total


BIG_GROUP = 64  # ranks past which a group across hosts is priced level by level, not message by message


def _composed(collective: str, nbytes: int, hosts: tuple[int, ...], levels: Levels) -> float:
    """A big group spanning hosts (data parallel over hundreds of GPUs), hierarchically: inside
    each host of G ranks a reduce-scatter, across the H hosts the collective on 1/G of the bytes
    (one NIC per rank: every local rank's slice crosses at once), inside again an all-gather;
    with an all-to-all, every rank's bytes cross. dt.cost.time's flat formulas on each level."""
    h = max(hosts) + 1
    g = len(hosts) // h
    a, e = levels.intra, levels.inter
    if collective == "all_to_all":
        return estimate("all_to_all", "pairwise", nbytes, len(hosts), alpha=e.alpha, beta=e.beta).total
    inside = {"all_reduce": ("reduce_scatter", "all_gather"), "reduce_scatter": ("reduce_scatter",),
              "all_gather": ("all_gather",)}[collective]
    t = sum(estimate(k, "ring", nbytes, g, alpha=a.alpha, beta=a.beta, gamma=a.gamma).total for k in inside)
    return t + estimate(collective, "ring", nbytes / g, h, alpha=e.alpha, beta=e.beta, gamma=e.gamma).total


PROBE = (1 << 20, 1 << 26)  # bytes at which each algorithm's line is measured off the model


@functools.lru_cache(maxsize=4096)
def _lines(collective: str, itemsize: int, hosts: tuple[int, ...], levels: Levels,
           shared_memory: bool) -> list[tuple[float, float]]:
    """(seconds at 0 bytes, seconds per byte) of each candidate algorithm on these hosts.

    Every model here is a sum over steps of alpha + bytes x beta (+ reduced x gamma):
    affine in the buffer's bytes, so two evaluations give the line exactly (up to the
    integer split of chunks); the planner prices thousands of layouts with two calls
    per algorithm and host pattern instead of one message schedule per call.
    """
    p = len(hosts)
    n = p * itemsize * max(1, PROBE[0] // (p * itemsize))
    big = p * itemsize * max(1, PROBE[1] // (p * itemsize))
    if p > BIG_GROUP and max(hosts) > 0:
        algos = ("hierarchical",)
    elif max(hosts) == 0:
        algos = ONE_HOST[collective] + (LOADSTORE[collective] if shared_memory else ())
    else:
        algos = ("pairwise",) if collective == "all_to_all" else LEVELED[collective]
    out = []
    for a in algos:
        t1, t2 = (_exact(collective, a, x, itemsize, hosts, levels) for x in (n, big))
        slope = (t2 - t1) / (big - n)
        out.append((t1 - slope * n, slope))
    return out


@functools.lru_cache(maxsize=65536)
def _with_terms(collective: str, nbytes: int, hosts: tuple[int, ...], cluster: Cluster) -> float:
    """This machine, one host: dt.cost.time.estimate with the terms `dt tune` measured
    (dt.cost.overheads: per message, wake-up, shared bandwidth, oversubscription), the
    cheapest algorithm; exact per call (the terms are not affine in the bytes)."""
    p, m = len(hosts), cluster.levels.intra
    terms = overheads("shm", p)
    algos = ONE_HOST[collective] + LOADSTORE[collective]
    return min(estimate(collective, a, nbytes, p, alpha=m.alpha, beta=m.beta, gamma=m.gamma,
                        overheads=terms).total for a in algos)


def collective_seconds(cluster: Cluster, collective: str, nbytes: float, ranks: tuple[int, ...]) -> float:
    """Seconds of one call moving `nbytes` (the buffer; all_gather: the gathered whole) on `ranks`."""
    if len(ranks) < 2 or nbytes <= 0:
        return 0.0
    hosts = group_hosts(cluster, ranks)
    if cluster.shared_memory and max(hosts) == 0:
        return _with_terms(collective, int(nbytes), hosts, cluster)
    lines = _lines(collective, cluster.itemsize, group_hosts(cluster, ranks), cluster.levels,
                   cluster.shared_memory)
    return min(a + b * nbytes for a, b in lines)  # the algorithm the model prices lowest, as auto picks


def send_seconds(cluster: Cluster, nbytes: float, a: int, b: int) -> float:
    """One point-to-point message from rank a to rank b."""
    m = cluster.levels.intra if cluster.host_of(a) == cluster.host_of(b) else cluster.levels.inter
    return m.alpha + nbytes * m.beta
