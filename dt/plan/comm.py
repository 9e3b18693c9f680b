"""The price of one collective on a group of the cluster's ranks, on the level(s) it sits on.

A group inside one host is priced by dt.cost.time.estimate with the intra
figures (the cheapest of the algorithms dt's `auto` chooses among, as auto
picks the model's lowest); one spanning hosts by dt.cost.levels.two_level
on its hosts. A point-to-point send is one step: alpha + bytes * beta.
"""

from __future__ import annotations

import functools

from dt.cost.levels import LEVELED, Levels, two_level
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
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(cluster.host_of(r), len(seen)) for r in ranks)


@functools.lru_cache(maxsize=65536)
def _priced(collective: str, nbytes: int, itemsize: int, hosts: tuple[int, ...], levels: Levels,
            shared_memory: bool) -> float:
    p = len(hosts)
    if p < 2 or nbytes <= 0:
        return 0.0
    if max(hosts) == 0:  # one host
        m = levels.intra
        algos = ONE_HOST[collective] + (LOADSTORE[collective] if shared_memory else ())
        return min(estimate(collective, a, nbytes, p, alpha=m.alpha, beta=m.beta, gamma=m.gamma).total
                   for a in algos)
    if collective == "all_to_all":  # every rank sends (p-1)/p of its bytes, most of it across
        m = levels.inter
        return estimate("all_to_all", "pairwise", nbytes, p, alpha=m.alpha, beta=m.beta).total
    numels = nbytes // itemsize
    if collective != "all_reduce":
        numels = [numels // p] * p  # every rank's block
    return min(two_level(collective, a, numels, itemsize, hosts, levels).total for a in LEVELED[collective])


def collective_seconds(cluster: Cluster, collective: str, nbytes: float, ranks: tuple[int, ...]) -> float:
    """Seconds of one call moving `nbytes` (the buffer; all_gather: the gathered whole) on `ranks`."""
    return _priced(collective, int(nbytes), cluster.itemsize, group_hosts(cluster, ranks), cluster.levels,
                   cluster.shared_memory)


def send_seconds(cluster: Cluster, nbytes: float, a: int, b: int) -> float:
    """One point-to-point message from rank a to rank b."""
    m = cluster.levels.intra if cluster.host_of(a) == cluster.host_of(b) else cluster.levels.inter
    return m.alpha + nbytes * m.beta
