"""The price of one collective on a group of the cluster's ranks, on the level(s) it sits on.

A group inside one host is priced by dt.cost.time.estimate with the intra
figures (the cheapest of the registered algorithms dt's `auto` chooses among,
dt.collectives.auto.candidates, as auto picks the model's lowest); one spanning hosts by
dt.cost.levels.two_level on its hosts. A point-to-point send is one step: alpha + bytes * beta.

On this machine (one host, shared memory) a call is priced as dt runs it:
the algorithm is the one the caller names (ZeRO's and FSDP's "ring") or the
one `auto` runs (dt.collectives.auto.choose's rule: what `dt tune` measured
fastest at the nearest swept size, else the model's lowest, the load/store
algorithms at the wire's sync and mem figures); its seconds are what the sweep
measured for that algorithm, interpolated between the swept sizes (log-log),
where the sweep covers the call, else dt.cost.time.estimate with the terms
`dt tune` measured (dt.cost.overheads).
"""

from __future__ import annotations

import functools
import math
import os

from dt.collectives.auto import candidates
from dt.collectives.registry import needs_shared_memory
from dt.cost.levels import LEVELED, Levels, two_level
from dt.cost.machine import Machine, machine, winners
from dt.cost.overheads import overheads
from dt.cost.time import estimate
from dt.plan.cluster import Cluster

__all__ = ["collective_seconds", "group_hosts", "send_seconds"]



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
    elif max(hosts) == 0:  # every registered algorithm auto would consider (dt.collectives.auto)
        algos = tuple(candidates(collective, shared_memory))
    else:
        algos = ("pairwise",) if collective == "all_to_all" else LEVELED[collective]
    out = []
    for a in algos:
        t1, t2 = (_exact(collective, a, x, itemsize, hosts, levels) for x in (n, big))
        slope = (t2 - t1) / (big - n)
        out.append((t1 - slope * n, slope))
    return out


SWEPT = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
         "reduce_scatter": "reduce_scatter_tensor"}  # the planner's names -> dt tune's sweep's


def _auto_choice(collective: str, nbytes: int, p: int, m: Machine) -> str:
    """What dt's auto runs for this call on a one-host shared-memory group of p ranks."""
    from dt.collectives.auto import best, measured_best
    from dt.transport.shm.host import DEFAULT_STAGE_BYTES

    measured = measured_best(SWEPT.get(collective, collective), nbytes, p, "shm")
    return measured or best(collective, nbytes, p, m, True, DEFAULT_STAGE_BYTES)


def _swept_seconds(collective: str, algorithm: str, nbytes: int, p: int) -> float | None:
    """The sweep's median for this algorithm at nbytes (log-log between the swept sizes; inside
    the swept range only), or None."""
    table = winners("shm", p).get(SWEPT.get(collective, ""), [])
    rows = [(size, times[algorithm]) for size, _, times in table if algorithm in times]
    if not rows or not rows[0][0] <= nbytes <= rows[-1][0]:
        return None
    for (s0, t0), (s1, t1) in zip(rows, rows[1:] + rows[-1:]):
        if s0 <= nbytes <= s1:
            if s1 == s0:
                return t0
            f = math.log(nbytes / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


@functools.lru_cache(maxsize=65536)
def _with_terms(collective: str, nbytes: int, hosts: tuple[int, ...], cluster: Cluster,
                algorithm: str = "auto") -> float:
    """This machine, one host: the algorithm dt runs, at the sweep's measured time where it
    covers the call, else dt.cost.time.estimate with the terms `dt tune` measured
    (dt.cost.overheads: per message, wake-up, shared bandwidth, oversubscription)."""
    p, m = len(hosts), cluster.levels.intra
    # More ranks on this machine than cores: a group of p waits on cores the others hold too, so
    # it is priced by the figures `dt tune` measured with all of them running (a pair's sync at
    # world 4 on 2 cores: 265 us, against 30 us at world 2), not by the p-rank sweep. Every rank
    # of this machine's cluster counts, a simulated cluster's other hosts too: they share its cores.
    here = cluster.world
    crowded = here > p and here > (os.cpu_count() or 1)
    algo = _auto_choice(collective, nbytes, p, m) if algorithm == "auto" else algorithm  # as the run's
    if crowded and cluster.hosts > 1:  # a simulated host's figures are its pair's; the crowd's are
        m = machine("shm", here)       # what dt tune measured with all of this machine's ranks
    swept = None if crowded else _swept_seconds(collective, algo, nbytes, p)
    if swept is not None:
        return swept
    loadstore = needs_shared_memory(collective, algo)
    terms = overheads("shm", here if crowded else p)
    return estimate(collective, algo, nbytes, p, alpha=m.sync if loadstore else m.alpha,
                    beta=m.mem if loadstore else m.beta, gamma=m.gamma, overheads=terms).total


def collective_seconds(cluster: Cluster, collective: str, nbytes: float, ranks: tuple[int, ...],
                       algorithm: str = "auto") -> float:
    """Seconds of one call moving `nbytes` (the buffer; all_gather: the gathered whole) on `ranks`,
    by `algorithm` (auto: the one dt's auto runs)."""
    if len(ranks) < 2 or nbytes <= 0:
        return 0.0
    hosts = group_hosts(cluster, ranks)
    if cluster.shared_memory and max(hosts) == 0:
        return _with_terms(collective, int(nbytes), hosts, cluster, algorithm)
    lines = _lines(collective, cluster.itemsize, group_hosts(cluster, ranks), cluster.levels,
                   cluster.shared_memory)
    return min(a + b * nbytes for a, b in lines)  # the algorithm the model prices lowest, as auto picks


def send_seconds(cluster: Cluster, nbytes: float, a: int, b: int) -> float:
    """One point-to-point message from rank a to rank b."""
    m = cluster.levels.intra if cluster.host_of(a) == cluster.host_of(b) else cluster.levels.inter
    return m.alpha + nbytes * m.beta
