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
    return tuple(seen.setdefault(rank // per_host, len(seen)) for rank in ranks)


def _exact(collective: str, algorithm: str, nbytes: int, itemsize: int, hosts: tuple[int, ...],
           levels: Levels) -> float:
    p = len(hosts)
    if p > BIG_GROUP and max(hosts) > 0:
        return _composed(collective, nbytes, hosts, levels)
    if max(hosts) == 0:  # one host
        link = levels.intra
        return estimate(collective, algorithm, nbytes, p, alpha=link.alpha, beta=link.beta,
                        gamma=link.gamma).total
    return _across(collective, algorithm, nbytes, itemsize, hosts, levels)


def _across(collective: str, algorithm: str, nbytes: int, itemsize: int, hosts: tuple[int, ...],
            levels: Levels) -> float:
    p = len(hosts)
    if collective == "all_to_all":  # every rank sends (p-1)/p of its bytes, most of it across
        link = levels.inter
        return estimate("all_to_all", "pairwise", nbytes, p, alpha=link.alpha, beta=link.beta).total
    numels = nbytes // itemsize
    return two_level(collective, algorithm, numels if collective == "all_reduce" else [numels // p] * p,
                     itemsize, hosts, levels).total


BIG_GROUP = 64  # ranks past which a group across hosts is priced level by level, not message by message


def _composed(collective: str, nbytes: int, hosts: tuple[int, ...], levels: Levels) -> float:
    """A big group spanning hosts (data parallel over hundreds of GPUs), hierarchically: inside
    each host of G ranks a reduce-scatter, across the H hosts the collective on 1/G of the bytes
    (one NIC per rank: every local rank's slice crosses at once), inside again an all-gather;
    with an all-to-all, every rank's bytes cross. dt.cost.time's flat formulas on each level."""
    host_count = max(hosts) + 1
    per_host = len(hosts) // host_count
    intra, inter = levels.intra, levels.inter
    if collective == "all_to_all":
        return estimate("all_to_all", "pairwise", nbytes, len(hosts), alpha=inter.alpha,
                        beta=inter.beta).total
    inside = {"all_reduce": ("reduce_scatter", "all_gather"), "reduce_scatter": ("reduce_scatter",),
              "all_gather": ("all_gather",)}[collective]
    within = sum(estimate(step, "ring", nbytes, per_host, alpha=intra.alpha, beta=intra.beta,
                          gamma=intra.gamma).total for step in inside)
    return within + estimate(collective, "ring", nbytes / per_host, host_count, alpha=inter.alpha,
                             beta=inter.beta, gamma=inter.gamma).total


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
    small = p * itemsize * max(1, PROBE[0] // (p * itemsize))  # whole numbers per rank
    big = p * itemsize * max(1, PROBE[1] // (p * itemsize))
    if p > BIG_GROUP and max(hosts) > 0:
        algos = ("hierarchical",)
    elif max(hosts) == 0:  # every registered algorithm auto would consider (dt.collectives.auto)
        algos = tuple(candidates(collective, shared_memory))
    else:
        algos = ("pairwise",) if collective == "all_to_all" else LEVELED[collective]
    out = []
    for algorithm in algos:
        at_small, at_big = (_exact(collective, algorithm, nbytes, itemsize, hosts, levels)
                            for nbytes in (small, big))
        slope = (at_big - at_small) / (big - small)
        out.append((at_small - slope * small, slope))
    return out


SWEPT = {"all_reduce": "all_reduce", "all_gather": "all_gather_into_tensor",
         "reduce_scatter": "reduce_scatter_tensor"}  # the planner's names -> dt tune's sweep's


def _auto_choice(collective: str, nbytes: int, ranks: int, figures: Machine) -> str:
    """What dt's auto runs for this call on a one-host shared-memory group of `ranks`."""
    from dt.collectives.auto import best, measured_best
    from dt.transport.shm.host import DEFAULT_STAGE_BYTES

    measured = measured_best(SWEPT.get(collective, collective), nbytes, ranks, "shm")
    return measured or best(collective, nbytes, ranks, figures, True, DEFAULT_STAGE_BYTES)


def _swept_seconds(collective: str, algorithm: str, nbytes: int, ranks: int) -> float | None:
    """The sweep's median for this algorithm at nbytes (log-log between the swept sizes; inside
    the swept range only), or None."""
    table = winners("shm", ranks).get(SWEPT.get(collective, ""), [])
    rows = [(size, times[algorithm]) for size, _, times in table if algorithm in times]
    if not rows:
        return None
    (smallest, _), (largest, _) = rows[0], rows[-1]
    if not smallest <= nbytes <= largest:
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
    p, figures = len(hosts), cluster.levels.intra
    # More ranks on this machine than cores: a group of p waits on cores the others hold too, so
    # it is priced by the figures `dt tune` measured with all of them running (a pair's sync at
    # world 4 on 2 cores: 265 us, against 30 us at world 2), not by the p-rank sweep. Every rank
    # of this machine's cluster counts, a simulated cluster's other hosts too: they share its cores.
    here = cluster.world
    crowded = here > p and here > (os.cpu_count() or 1)
    algo = _auto_choice(collective, nbytes, p, figures) if algorithm == "auto" else algorithm  # as the run's
    if crowded and cluster.hosts > 1:  # a simulated host's figures are its pair's; the crowd's are
        figures = machine("shm", here)  # what dt tune measured with all of this machine's ranks
    swept = None if crowded else _swept_seconds(collective, algo, nbytes, p)
    if swept is not None:
        return swept
    loadstore = needs_shared_memory(collective, algo)
    terms = overheads("shm", here if crowded else p)
    return estimate(collective, algo, nbytes, p, alpha=figures.sync if loadstore else figures.alpha,
                    beta=figures.mem if loadstore else figures.beta, gamma=figures.gamma,
                    overheads=terms).total


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
    # the algorithm the model prices lowest, as auto picks
    return min(at_zero + per_byte * nbytes for at_zero, per_byte in lines)


def send_seconds(cluster: Cluster, nbytes: float, sender: int, receiver: int) -> float:
    """One point-to-point message from rank `sender` to rank `receiver`."""
    same_host = cluster.host_of(sender) == cluster.host_of(receiver)
    link = cluster.levels.intra if same_host else cluster.levels.inter
    return link.alpha + nbytes * link.beta
