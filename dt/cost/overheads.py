"""The terms the alpha-beta-gamma model leaves out, as arithmetic (`dt tune` measures them).

alpha, beta and gamma are measured with every rank of the group doing the
same thing at once: one exchange step of one element, an exchange of n
bytes, an add (dt/tools/tune.py). A collective does other things, and four
of them show in the measurements (dt/tools/tune_terms.py measures each
with a micro-benchmark that is not a collective):

- software: every message posted costs the transport's Python and
  bookkeeping. alpha's exchange posts one send and one receive per step; a
  rank that posts more (the naive root: p-1 receives, then p-1 sends) pays
  `post` for each one beyond those two per step:
      software = post * max(0, messages posted by the busiest rank - 2 * steps)
- wake: a shared-memory wait spins `spin` seconds, then sleeps on a futex,
  and waking it costs `wake`. alpha's one-element exchange is answered
  within the spin; a step whose bytes take longer (bytes * beta > spin) is
  not, and its receiver sleeps:
      wake = wake * (steps that carry bytes for longer than the spin)
  With spin = 0 (the torch wire, whose waits sleep at once; shared memory
  with more ranks than cores) every wait sleeps, alpha's exchange included,
  so alpha already holds the wake-up and the term is 0.
- sharing: the ranks of a host share its memory bandwidth. beta and gamma
  are measured with all p ranks copying at once; a rank copying alone
  pays `solo` (<= 1) of that per byte, so the host fits C = p * solo ranks'
  copying at full speed. A step in which rank r moves b_r bytes takes
      max(max_r b_r, sum_r b_r / C) * solo * beta
  (all p ranks moving b each: b * beta, as measured; b_r is the larger of
  what r sends and receives, its link carrying both at once), and the term
  is the sum over steps of that minus max_r b_r * beta: negative when fewer
  ranks copy than were measured (the naive root receiving alone), 0 when
  all do. The same for the bytes reduced, with `solo_reduce` and gamma.
- oversubscription: a host with more ranks than cores runs them in turns;
  every step waits for its ranks to get a core. alpha, measured on all p
  ranks, holds that wait; `oversub` is alpha minus the exchange of one pair
  while the other ranks sleep. The term is steps * oversub and the latency
  term shrinks by as much: it says how much of the latency is the cores,
  and moves no total.

The load/store algorithms (one_shot, two_shot) post no messages and their
ranks copy and sync together (what `sync` and `mem` were measured doing),
so software, wake and oversubscription are 0 for them. Their sharing term
is the read a reduction does not pay twice: the model charges each byte
read from a peer at `mem` and each byte reduced at gamma, but a reduced
byte is read by the add itself (out += peer, the add `dt tune` times:
gamma holds its loads), so `fused` (dt tune: the wire's mem) is taken off
per reduced byte:  sharing = -fused * reduced.

`level_terms` prices the same terms on two link levels (dt.cost.levels'
schedule, each message on its level's figures). No figure is fitted to a
collective's timings. All figures at their defaults: the plain model,
exactly (the reference's 3.96 ms ring).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from dt.cost import machine as machine_
from dt.cost.levels import LEVELED, Levels, schedule
from dt.cost.loadstore import LOADSTORE
from dt.cost.traffic import canonical, family, traffic_for

__all__ = ["NO_TERMS", "Overheads", "Terms", "level_terms", "overheads", "terms"]


@dataclass(frozen=True)
class Overheads:
    """The figures of the four terms (seconds; solo, solo_reduce: ratios of per-byte costs)."""

    post: float = 0.0  # per message posted beyond a step's one send and one receive
    wake: float = 0.0  # waking a wait that slept
    spin: float = 0.0  # how long a wait spins before it sleeps (0: it sleeps at once)
    solo: float = 1.0  # a byte copied by one rank alone / by all ranks at once
    solo_reduce: float = 1.0  # a byte reduced by one rank alone / by all ranks at once
    oversub: float = 0.0  # of each step's alpha, the wait for a core (more ranks than cores)
    fused: float = 0.0  # load/store: s/B of a peer's read the add's gamma already holds

    @classmethod
    def from_saved(cls, saved: dict[str, Any] | None) -> Overheads:
        """The "terms" `dt tune` saved with a wire's figures (missing ones: no term)."""
        got = (saved or {}).get("terms") or {}
        return cls(**{f.name: float(got[f.name]) for f in fields(cls)
                      if isinstance(got.get(f.name), (int, float))})


@dataclass(frozen=True)
class Terms:
    """Seconds each term adds to one call (oversubscription is also taken off the latency)."""

    software: float = 0.0
    wake: float = 0.0
    sharing: float = 0.0
    oversubscription: float = 0.0

    @property
    def total(self) -> float:
        return self.software + self.wake + self.sharing + self.oversubscription


NO_TERMS = Terms()


def overheads(backend: str, world: int) -> Overheads:
    """The terms `dt tune` saved for (backend, world), else none (the plain model)."""
    return Overheads.from_saved(machine_.figures(backend, world))


def _posted(collective: str, algorithm: str, nbytes: float, p: int) -> int:
    """Messages the busiest rank posts (sends + receives), as dt.traffic() counts them."""
    numel = max(1, int(nbytes) // 4)  # float32, as the benchmarks run
    blocks: int | list[int] = numel if family(collective) in ("all_reduce", "broadcast", "reduce") \
        else max(1, numel // p)
    most = 0
    for r in range(p):
        t = traffic_for(collective, algorithm, blocks, 4, p, r)
        most = max(most, t.messages_sent + t.messages_received)
    return most


def _step_bytes(collective: str, algorithm: str, nbytes: float,
                p: int) -> list[tuple[list[int], list[int], bool]] | None:
    """Per step: bytes each rank sends, bytes each receives, whether it reduces; None: no schedule."""
    if algorithm not in LEVELED.get(collective, ()) or algorithm == "hierarchical":
        return None
    numel = max(1, int(nbytes) // 4)
    count = numel if collective == "all_reduce" else max(1, numel // p)
    out = []
    for msgs, reduces in schedule(collective, algorithm, count, 4, (0,) * p):
        sent, received = [0] * p, [0] * p
        for src, dst, nb in msgs:
            sent[src] += nb
            received[dst] += nb
        out.append((sent, received, reduces))
    return out


def _shared(per_rank: list[int], p: int, solo: float) -> float:
    """Bytes-worth of one step when the ranks share the host's bandwidth (see the module doc)."""
    solo = min(1.0, solo)  # alone is never slower than in company (a noisy figure is not believed)
    if solo <= 0:
        return float(max(per_rank))
    # p * solo may be under 1 (company costing more than p times alone): all p moving b still gives b
    return max(max(per_rank), sum(per_rank) / (p * solo)) * solo


def terms(collective: str, algorithm: str, nbytes: float, p: int, steps: int, nb: float, reduced: float,
          beta: float, gamma: float, o: Overheads) -> Terms:
    """The four terms of one call of n bytes on p ranks (steps, nb, reduced: dt.cost.formula's)."""
    base = family(collective)
    name = canonical(base, algorithm)
    if p <= 1 or steps == 0:
        return NO_TERMS
    if (base, name) in LOADSTORE:
        return Terms(sharing=-o.fused * reduced)
    software = o.post * max(0, _posted(base, name, nbytes, p) - 2 * steps) if o.post else 0.0
    per_step = _step_bytes(base, name, nbytes, p)
    wake = sharing = 0.0
    if per_step is None:  # no schedule: the critical-path bytes spread evenly over the steps
        long_steps = steps if nb / steps * beta > o.spin else 0
    else:
        # a rank's link carries its sends and receives at once (as alpha's exchange does): a step
        # costs its larger side, and its receiver sleeps when that outlasts the spin
        links = [[max(s, r) for s, r in zip(sent, received)] for sent, received, _ in per_step]
        long_steps = sum(1 for link in links if max(link) * beta > o.spin)
        if o.solo != 1.0 or o.solo_reduce != 1.0:
            reducing = [received for _, received, red in per_step if red]
            sharing = (beta * sum(_shared(link, p, o.solo) - max(link) for link in links)
                       + gamma * sum(_shared(got, p, o.solo_reduce) - max(got) for got in reducing))
    if o.spin > 0 and o.wake:
        wake = o.wake * long_steps
    return Terms(software, wake, sharing, steps * o.oversub)


def level_terms(collective: str, algorithm: str, numels: int | list[int], itemsize: int,
                hosts: tuple[int, ...], levels: Levels, intra: Overheads, inter: Overheads) -> Terms:
    """The terms on two link levels (dt.cost.levels' schedule), each message on its level.

    Per step: software, the busiest rank's messages beyond one send and one
    receive, at the post of the level they cross (inter if any of its messages
    leaves the host); wake, the larger of the levels' wake where that level's
    bytes outlast its spin; sharing, inside each host only (a host's memory;
    the NICs' sharing is levels.nics'). Oversubscription stays in alpha here:
    two_level has no latency column to take it from.
    """
    software = wake = sharing = 0.0
    host_ranks: dict[int, list[int]] = {}
    for r, h in enumerate(hosts):
        host_ranks.setdefault(h, []).append(r)
    for msgs, _ in schedule(collective, algorithm, numels, itemsize, hosts):
        count = [[0, 0] for _ in hosts]  # per rank: messages inside its host, across
        link = {"intra": [0] * len(hosts), "inter": [0] * len(hosts)}
        for src, dst, nb in msgs:
            across = int(hosts[src] != hosts[dst])
            count[src][across] += 1
            count[dst][across] += 1
            level = "inter" if across else "intra"
            link[level][src] = max(link[level][src], nb)
            link[level][dst] = max(link[level][dst], nb)
        software += max((inter.post if n_inter else intra.post) * max(0, n_intra + n_inter - 2)
                        for n_intra, n_inter in count)
        woken = [o.wake for o, fig, name in ((intra, levels.intra, "intra"), (inter, levels.inter, "inter"))
                 if o.spin > 0 and max(link[name]) * fig.beta > o.spin]
        wake += max(woken, default=0.0)
        if intra.solo != 1.0:
            sharing += max((_shared([link["intra"][r] for r in ranks], len(ranks), intra.solo)
                            - max(link["intra"][r] for r in ranks)) * levels.intra.beta
                           for ranks in host_ranks.values())
    return Terms(software, wake, sharing)
