"""The two-level model: what crosses the fast links inside a host and the slow ones between hosts.

A cluster has two kinds of links: inside a host (NVLink, shared memory:
hundreds of GB/s) and between hosts (a NIC: tens of GB/s). The flat model
(dt.cost.time) gives every rank one link; here each message of an
algorithm's schedule is placed on its level by the hosts of its two ends,
and time is counted step by step:

    step time = max(intra, inter) + reduced * gamma
    intra     = alpha_intra + max over ranks of bytes sent inside the host * beta_intra
    inter     = alpha_inter + max(max over ranks of bytes sent across * beta_inter,
                                  max over hosts of bytes leaving the host * beta_inter / nics)
    time      = sum over steps

(a level with no message in a step costs nothing; nics = 0 means one NIC
per rank, the rail-optimised clusters of the reference, so only the first
term counts). Bytes per level, per rank and per host, are exact: the
transport counts the same messages (dt.traffic().by_wire splits them,
"shm" inside a host, "torch" across, on hosts marked with DT_HOST).

Textbook figures it reproduces, H hosts of G ranks (p = HG), n bytes:

- ring all-reduce over host-contiguous ranks: 2(p-1)/p n per rank, and the
  rank at each host's boundary sends all of it across: 2(p-1)/p n leaves
  every host, through one NIC;
- hierarchical all-reduce: 2(G-1)/G n per rank inside the host, 2(H-1)/H n/G
  per rank across (every NIC busy), 2(H-1)/H n leaving each host;
- Rabenseifner over host-contiguous ranks: its first, largest halving step
  (n/2 per rank) would pair r with r xor p/2, across hosts; on a group
  spanning hosts the partner order is reversed (dt.layout.Fold), so that
  step pairs r with r xor 1 inside a host and only the n/p step crosses.

The memory term of shared memory (Machine.mem, sync) prices the load/store
algorithms, which need a group on one host; across hosts none is a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.cost.machine import Machine
from dt.cost.records import LEVELED, Call, call_of, record_for
from dt.hosts import members, phases
from dt.layout import Fold, doubling_gather, edges, halving_doubling, ring_received, split_sizes

__all__ = ["LEVELED", "Levels", "nics_from", "TwoLevelEstimate", "level_bytes", "schedule", "two_level",
           "hierarchical", "naive_all_reduce", "rabenseifner_all_reduce", "recursive_doubling_all_reduce",
           "bruck_all_gather",
           "recursive_doubling_all_gather", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]

Message = tuple[int, int, int]  # (sender, receiver, bytes): group ranks
Step = tuple[list[Message], bool]  # the step's messages; whether it reduces what it receives


@dataclass(frozen=True)
class Levels:
    """Figures of both levels: intra (inside a host), inter (between hosts).

    nics: NICs a host's inter-host traffic shares (0: one per rank).
    """

    intra: Machine
    inter: Machine
    nics: int = 0


def nics_from(beta_pair: float, beta_rails: float, per_host: int) -> int:
    """NICs a host's ranks share, from one pair's beta and each rank's beta when all `per_host`
    rails send at once: per_host ranks through n NICs see beta_pair * per_host / n each.
    0 means one per rank (nothing shared), as Levels.nics counts."""
    if beta_rails <= 0 or beta_pair <= 0 or per_host < 2:
        return 0
    n = max(1, min(per_host, round(per_host * beta_pair / beta_rails)))
    return 0 if n == per_host else n


def _ring(ms: tuple[int, ...], chunks: list[int], itemsize: int, first: int, laps: int,
          reduce: bool) -> list[Step]:
    """A ring over `ms` (group ranks): at step s position i sends chunk (i - s + first) to i+1."""
    m = len(ms)
    out: list[Step] = []
    for s in range(laps * (m - 1)):
        msgs = [(ms[i], ms[(i + 1) % m], chunks[ring_received(i, m, s - 1, first)] * itemsize)
                for i in range(m)]
        out.append((msgs, reduce and s < m - 1))
    return out


def _fold_steps(p: int, nbytes_in: list[int], nbytes_out: int,
                reduce: bool) -> tuple[list[Step], list[Step]]:
    """MPICH's fold: even rank 2i of the first 2e hands nbytes_in[2i] to 2i+1; gets nbytes_out back."""
    e = p - (1 << (p.bit_length() - 1))
    if not e:
        return [], []
    fin = [(2 * i, 2 * i + 1, nbytes_in[2 * i]) for i in range(e)]
    fout = [(2 * i + 1, 2 * i, nbytes_out) for i in range(e)]
    return [(fin, reduce)], [(fout, False)]


def _hierarchical(collective: str, numels: list[int], itemsize: int, hosts: tuple[int, ...]) -> list[Step]:
    """Every rank's rings (dt.hosts.phases), each started once all its members are free."""
    p = len(hosts)
    free = [0] * p
    at: dict[int, list[Message]] = {}
    reducing: dict[int, bool] = {}
    count = [0] * p
    plans = [phases(collective, hosts, r, numels) for r in range(p)]
    pending = True
    while pending:  # each ring once all its members have reached it (their phases' order)
        pending = False
        for r in range(p):
            if count[r] >= len(plans[r]):
                continue
            ph = plans[r][count[r]]
            if not all(count[q] < len(plans[q]) and plans[q][count[q]].members == ph.members
                       and plans[q][count[q]].kind == ph.kind for q in ph.members):
                continue
            start = max(free[q] for q in ph.members)
            first = 0 if ph.kind == "all_gather" else -1
            laps = 2 if ph.kind == "all_reduce" else 1
            for s, (msgs, red) in enumerate(_ring(ph.members, list(ph.chunks), itemsize, first, laps,
                                                  ph.kind != "all_gather")):
                at.setdefault(start + s, []).extend(msgs)
                reducing[start + s] = reducing.get(start + s, False) or red
            for q in ph.members:
                free[q] = start + laps * (len(ph.members) - 1)
                count[q] += 1
            pending = True
    return [(at.get(s, []), reducing.get(s, False)) for s in range(max(free, default=0))]


def schedule(collective: str, algorithm: str, numels: int | list[int], itemsize: int,
             hosts: tuple[int, ...]) -> list[Step]:
    """Every message of one call, step by step, as the algorithm posts it (all ranks).

    numels: the buffer's elements (all_reduce); every rank's block, or one int for
    equal blocks (reduce_scatter, all_gather). The algorithm's record (`levels=`,
    declared beside it) names the function below that lists them.
    """
    if len(hosts) == 1:
        return []
    listed = record_for(collective, algorithm).levels
    if listed is None:
        raise KeyError(f"no two-level schedule for {collective} {algorithm}")
    return listed(call_of(collective, algorithm, numels, itemsize, len(hosts), 0, hosts=hosts))


# The `levels=` of each algorithm's record: its messages, every rank's, step by step.

def hierarchical(c: Call) -> list[Step]:
    """Rings inside each host and on the rails (dt.hosts.phases)."""
    return _hierarchical(c.collective, [c.n] if c.collective == "all_reduce" else c.blocks, c.itemsize,
                         c.placed)


def ring_all_reduce(c: Call) -> list[Step]:
    return _ring(tuple(range(c.p)), split_sizes(c.n, c.p), c.itemsize, -1, 2, True)


def ring_reduce_scatter(c: Call) -> list[Step]:
    return _ring(tuple(range(c.p)), c.blocks, c.itemsize, -1, 1, True)


def ring_all_gather(c: Call) -> list[Step]:
    return _ring(tuple(range(c.p)), c.blocks, c.itemsize, 0, 1, False)


def naive_all_reduce(c: Call) -> list[Step]:
    nb = c.n * c.itemsize
    return [([(r, 0, nb) for r in range(1, c.p)], True), ([(0, r, nb) for r in range(1, c.p)], False)]


def bruck_all_gather(c: Call) -> list[Step]:
    out, d, p = [], 1, c.p
    while d < p:
        out.append(([(r, (r - d) % p, min(d, p - d) * c.blocks[0] * c.itemsize) for r in range(p)], False))
        d *= 2
    return out


def _folded_all_reduce(c: Call, body: list[Step]) -> list[Step]:
    """The fold's step in and out around the power-of-two body (every rank's whole buffer)."""
    nb = c.n * c.itemsize
    fin, fout = _fold_steps(c.p, [nb] * c.p, nb, True)
    return fin + body + fout


def _virtual(c: Call) -> tuple[Fold, list[int]]:
    """The fold of rank 0 and the real rank of each virtual one (partner order reversed across
    hosts, as the collectives run it)."""
    fold = Fold(c.p, 0)
    return fold, [Fold(c.p, 0, c.spans_hosts).real(v) for v in range(fold.p2)]


def recursive_doubling_all_reduce(c: Call) -> list[Step]:
    """The whole buffer exchanged with the partner at distance 2^k in round k."""
    fold, virtual = _virtual(c)
    nb = c.n * c.itemsize
    return _folded_all_reduce(c, [([(virtual[v], virtual[v ^ (1 << k)], nb) for v in range(fold.p2)], True)
                                  for k in range(fold.rounds)])


def rabenseifner_all_reduce(c: Call) -> list[Step]:
    """Recursive halving (reducing), then recursive doubling of the reduced pieces."""
    fold, virtual = _virtual(c)
    e = edges(split_sizes(c.n, fold.p2))
    plans = [halving_doubling(v, fold.p2) for v in range(fold.p2)]
    body = []
    for k in range(2 * fold.rounds):
        msgs = []
        for v in range(fold.p2):
            st = (plans[v][0] + plans[v][1])[k]
            msgs.append((virtual[v], virtual[st.peer], (e[st.mine[1]] - e[st.mine[0]]) * c.itemsize))
        body.append((msgs, k < fold.rounds))
    return _folded_all_reduce(c, body)


def recursive_doubling_all_gather(c: Call) -> list[Step]:
    p, blocks, itemsize = c.p, c.blocks, c.itemsize
    fold = Fold(p, 0)
    virtual = [fold.real(v) for v in range(fold.p2)]
    e = edges(blocks)
    fin, fout = _fold_steps(p, [b * itemsize for b in blocks], sum(blocks) * itemsize, False)
    body = [([(virtual[v], virtual[st.peer], (e[fold.lo(st.mine[1])] - e[fold.lo(st.mine[0])]) * itemsize)
              for v in range(fold.p2) for st in [doubling_gather(v, fold.p2)[k]]], False)
            for k in range(fold.rounds)]
    return fin + body + fout


def level_bytes(steps: list[Step], hosts: tuple[int, ...]) -> dict[str, list[int]]:
    """Bytes each rank sends / receives inside its host and across hosts, over a schedule.

    Keys: intra_sent, intra_received, inter_sent, inter_received (per group rank).
    """
    p = len(hosts)
    out = {k: [0] * p for k in ("intra_sent", "intra_received", "inter_sent", "inter_received")}
    for msgs, _ in steps:
        for src, dst, nb in msgs:
            level = "intra" if hosts[src] == hosts[dst] else "inter"
            out[f"{level}_sent"][src] += nb
            out[f"{level}_received"][dst] += nb
    return out


@dataclass(frozen=True)
class TwoLevelEstimate:
    """Predicted time of one call on two levels, with the bytes crossing each level."""

    total: float
    steps: int
    intra_rank: int  # most bytes one rank sends inside its host
    inter_rank: int  # most bytes one rank sends to other hosts
    inter_host: int  # most bytes leaving one host


def two_level(collective: str, algorithm: str, numels: int | list[int], itemsize: int,
              hosts: tuple[int, ...], levels: Levels) -> TwoLevelEstimate:
    """Sum over steps of the slower level's cost (see the module doc)."""
    steps = schedule(collective, algorithm, numels, itemsize, hosts)
    host_count = len(members(hosts))
    total = 0.0
    for msgs, reduces in steps:
        intra = [0] * len(hosts)
        inter = [0] * len(hosts)
        leaving = [0] * host_count
        received = [0] * len(hosts)
        for src, dst, nb in msgs:
            if not nb:
                continue
            received[dst] += nb
            if hosts[src] == hosts[dst]:
                intra[src] += nb
            else:
                inter[src] += nb
                leaving[hosts[src]] += nb
        cost = 0.0
        if any(intra):
            cost = levels.intra.alpha + max(intra) * levels.intra.beta
        if any(inter):
            wire = max(inter) * levels.inter.beta
            if levels.nics:
                wire = max(wire, max(leaving) * levels.inter.beta / levels.nics)
            cost = max(cost, levels.inter.alpha + wire)
        if reduces:
            cost += max(received) * levels.intra.gamma
        total += cost
    per = level_bytes(steps, hosts)
    leaving_total = [0] * host_count
    for r, nb in enumerate(per["inter_sent"]):
        leaving_total[hosts[r]] += nb
    return TwoLevelEstimate(total, len(steps), max(per["intra_sent"], default=0),
                            max(per["inter_sent"], default=0), max(leaving_total, default=0))
