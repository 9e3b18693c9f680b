"""Index arithmetic over hosts: who shares a host, rings that cross hosts once, rails, who owns what.

Nothing here moves a byte. A group's topology is a tuple `hosts`: hosts[r] is
the host index of group rank r (0, 1, ... in order of first appearance, as
dt.transport.topology numbers them). The hierarchical collectives post their
messages from these functions and the two-level cost model counts those
messages from the same ones: one definition, so the model's bytes per level
are the transport's.

- members        each host's ranks, in group order
- local_index    a rank's position among its host's ranks (NCCL's localRank)
- host_order     the ranks with each host's contiguous: a ring over it crosses each host boundary
                 once per lap (NCCL orders its rings so)
- rail           the ranks with the same local index on every host (rail-optimised networks:
                 GPU i of every host on one switch)
- level_pairs    the two pairs `dt tune` times the levels on (two ranks of a host; of two hosts)
- rail_pairs     host 0's and host 1's ranks paired by local index (every NIC busy at once)
- crossings      how many of a ring's hops go from one host to another
- pieces, owned  how a hierarchical all-reduce cuts its buffer: S = the largest host's rank
                 count pieces; on a host of G ranks local rank i owns the i-th of G contiguous
                 runs of pieces (split_sizes(S, G)), one piece each where G = S
- runs           the inter-host all-reduces: maximal runs of pieces whose owners (one per host)
                 are the same ranks; with equal hosts, run i is rail i
- delivery       the inter-host reduce-scatters / all-gathers: destination d is served on host h
                 by local rank (local_index(d) mod G_h); destinations grouped by those owners
- phases         the rings one rank runs in a hierarchical collective, level by level

With equal hosts (H hosts of G ranks) everything reduces to the textbook:
rail i = local index i, and local rank i owns 1/G of the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.layout import edges, split_sizes

__all__ = ["Delivery", "Phase", "PieceRun", "collected_by", "crossings", "delivery", "host_order",
           "level_pairs", "local_index", "members", "owned", "phases", "pieces", "rail", "rail_pairs",
           "runs", "uniform"]


def members(hosts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """members(hosts)[h]: the group ranks on host h, in group order. (0,1,0,1) -> [(0,2), (1,3)]."""
    out: list[list[int]] = [[] for _ in range(max(hosts) + 1 if hosts else 0)]
    for r, h in enumerate(hosts):
        out[h].append(r)
    return [tuple(m) for m in out]


def local_index(hosts: tuple[int, ...], rank: int) -> int:
    """rank's position among its host's ranks, in group order."""
    return sum(1 for q in range(rank) if hosts[q] == hosts[rank])


def host_order(hosts: tuple[int, ...]) -> tuple[int, ...]:
    """The group ranks, host by host (hosts in order, ranks in group order within a host)."""
    return tuple(r for m in members(hosts) for r in m)


def rail(hosts: tuple[int, ...], index: int) -> tuple[int, ...]:
    """Rank with local index `index` on each host that has one, in host order."""
    return tuple(m[index] for m in members(hosts) if len(m) > index)


def level_pairs(hosts: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    """The pairs `dt tune` times each level on: "intra", the first two ranks of the first host with
    two; "inter", the first rank of host 0 and of host 1. A level the group lacks has no pair."""
    ms = members(hosts)
    out = {}
    shared = [m for m in ms if len(m) > 1]
    if shared:
        out["intra"] = (shared[0][0], shared[0][1])
    if len(ms) > 1:
        out["inter"] = (ms[0][0], ms[1][0])
    return out


def rail_pairs(hosts: tuple[int, ...]) -> list[tuple[int, int]]:
    """Local rank i of host 0 with local rank i of host 1, for every i both have: every NIC busy."""
    ms = members(hosts)
    return list(zip(ms[0], ms[1])) if len(ms) > 1 else []


def uniform(hosts: tuple[int, ...]) -> bool:
    """Every host has the same number of ranks."""
    return len({len(m) for m in members(hosts)}) <= 1


def crossings(hosts: tuple[int, ...], order: tuple[int, ...] | None = None) -> int:
    """Hops of a ring over `order` (default: group order) between different hosts.

    A host-contiguous ring crosses exactly H times when H > 1 (0 for one host).
    """
    ring = order if order is not None else tuple(range(len(hosts)))
    p = len(ring)
    return sum(1 for i in range(p) if hosts[ring[i]] != hosts[ring[(i + 1) % p]]) if p > 1 else 0


def pieces(hosts: tuple[int, ...]) -> int:
    """How many pieces a hierarchical all-reduce cuts the buffer into: the largest host's rank count."""
    return max(len(m) for m in members(hosts)) if hosts else 1


def owned(local_ranks: int, count: int) -> list[tuple[int, int]]:
    """[first, end) pieces each of a host's `local_ranks` ranks owns, of `count` pieces."""
    e = edges(split_sizes(count, local_ranks))
    return [(e[i], e[i + 1]) for i in range(local_ranks)]


@dataclass(frozen=True)
class PieceRun:
    """Consecutive pieces [lo, hi) all-reduced across hosts among the same `owners`
    (one group rank per host, host order)."""

    lo: int
    hi: int
    owners: tuple[int, ...]


def runs(hosts: tuple[int, ...]) -> list[PieceRun]:
    """The inter-host all-reduces of a hierarchical all-reduce, in the order every rank runs them.

    Each rank takes part in its runs in this (ascending piece) order, so the
    sequence is deadlock-free whatever the host sizes.
    """
    hs = members(hosts)
    s = pieces(hosts)
    owner_of = []  # owner_of[h][j]: group rank owning piece j on host h
    for m in hs:
        row = [0] * s
        for i, (lo, hi) in enumerate(owned(len(m), s)):
            for j in range(lo, hi):
                row[j] = m[i]
        owner_of.append(row)
    out: list[PieceRun] = []
    for j in range(s):
        owners = tuple(row[j] for row in owner_of)
        if out and out[-1].owners == owners:
            out[-1] = PieceRun(out[-1].lo, j + 1, owners)
        else:
            out.append(PieceRun(j, j + 1, owners))
    return out


@dataclass(frozen=True)
class Delivery:
    """Destinations `dests` served across hosts by `owners` (one group rank per host, host order).

    Every destination is one of the owners (it serves itself on its own host).
    """

    owners: tuple[int, ...]
    dests: tuple[int, ...]


def delivery(hosts: tuple[int, ...]) -> list[Delivery]:
    """The inter-host reduce-scatters (all-gathers) of a hierarchical reduce-scatter (all-gather).

    Destination d's block is collected on host h by local rank
    local_index(d) mod G_h; destinations with the same owners form one
    reduce-scatter among them. Ordered by first destination, the order
    every rank runs them in. With equal hosts: one per rail.
    """
    hs = members(hosts)
    sets: dict[tuple[int, ...], list[int]] = {}
    for d in range(len(hosts)):
        i = local_index(hosts, d)
        sets.setdefault(tuple(m[i % len(m)] for m in hs), []).append(d)
    return [Delivery(o, tuple(ds)) for o, ds in sets.items()]


def collected_by(hosts: tuple[int, ...], rank: int) -> list[int]:
    """Destinations whose blocks `rank` collects on its host (ascending): its packed block."""
    return sorted(d for dl in delivery(hosts) if rank in dl.owners for d in dl.dests)


@dataclass(frozen=True)
class Phase:
    """One ring a rank of a hierarchical collective takes part in.

    level: "host" (inside this rank's host) or "rail" (across hosts);
    kind: "reduce_scatter", "all_gather" or "all_reduce" (both laps);
    members: the ring's group ranks in ring order; chunks: the element count
    each ring position owns; position: this rank's place in the ring.
    """

    level: str
    kind: str
    members: tuple[int, ...]
    chunks: tuple[int, ...]
    position: int


def phases(collective: str, hosts: tuple[int, ...], rank: int, numels: list[int]) -> list[Phase]:
    """The rings `rank` runs in a hierarchical collective, in order (what the algorithm posts).

    numels: [n] for all_reduce (the buffer); every rank's block for
    reduce_scatter / all_gather. Rings of one member (a host of one rank, a
    rail of one host) move nothing and are left out.
    """
    mine = members(hosts)[hosts[rank]]
    out: list[Phase] = []

    def ring(level: str, kind: str, ms: tuple[int, ...], chunks: list[int]) -> None:
        if len(ms) > 1:
            out.append(Phase(level, kind, ms, tuple(chunks), ms.index(rank)))

    if collective == "all_reduce":
        s = pieces(hosts)
        e = edges(split_sizes(numels[0], s))
        host = [e[hi] - e[lo] for lo, hi in owned(len(mine), s)]
        ring("host", "reduce_scatter", mine, host)
        for run in runs(hosts):
            if rank in run.owners:
                ring("rail", "all_reduce", run.owners,
                     split_sizes(e[run.hi] - e[run.lo], len(run.owners)))
        ring("host", "all_gather", mine, host)
        return out
    packs = [sum(numels[d] for d in collected_by(hosts, m)) for m in mine]
    rails = [(dl.owners, [numels[o] if o in dl.dests else 0 for o in dl.owners])
             for dl in delivery(hosts) if rank in dl.owners]
    if collective == "reduce_scatter":
        ring("host", "reduce_scatter", mine, packs)
        for owners, chunks in rails:
            ring("rail", "reduce_scatter", owners, chunks)
    elif collective == "all_gather":
        for owners, chunks in rails:
            ring("rail", "all_gather", owners, chunks)
        ring("host", "all_gather", mine, packs)
    else:
        raise KeyError(f"no hierarchical {collective}")
    return out
