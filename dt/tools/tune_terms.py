"""`dt tune`'s measurements of the terms alpha, beta and gamma leave out (dt.cost.overheads).

Each is a micro-benchmark of its own, never a collective (the model is not
fitted to the curves it then predicts); run on every rank of the group, on
the group's wire:

- post: ranks 0 and 1 post k one-element sends and k receives to each
  other at once (k = 1, 2, 4, 8); the slope of a burst's time over k, per
  message posted (2 per k), is the software cost of one more message;
- wake: rank 1 busy-waits twice the wire's spin (2 ms where waits do not
  spin) before it sends one element to rank 0, whose wait has gone to
  sleep by then; what rank 0 waits beyond that, less the same reply sent
  at once, is the wake-up. `spin` is how long the wire's waits spin first (shared memory:
  dt.transport.shm.sync.default_spin; the torch wire's waits sleep at once);
- solo, solo_reduce: a memcpy (an add) by rank 0 alone while the others
  sleep in a barrier, against every rank at once: the ratio of the slopes
  over 1..16 MiB, how much of the host's memory bandwidth the company takes;
- oversub: one pair's one-element exchange while the other ranks sleep,
  against every rank's at once, timed in turns; on a host with more ranks
  than cores the difference is each step's wait for a core (0 otherwise).

Every rank returns the same figures (the slowest rank's: a step waits for
the last one). `quick` (tests) times fewer and smaller points.
"""

from __future__ import annotations

import time
from typing import Any

from dt.bench.harness import slope
from dt.tools.tune_curves import REPEATS, latencies, median_time

__all__ = ["FANS", "measure_terms"]

FANS = (1, 2, 4, 8)  # messages posted at once each way, for the per-message slope
COPY_SIZES = (1 << 20, 4 << 20, 16 << 20)
QUICK_COPY_SIZES = (1 << 18, 1 << 20)
LATE = 2e-3  # how late the late reply comes where waits do not spin (the torch wire)


def late_by(spin: float) -> float:
    """How late the late reply comes: twice the spin, a wait just past it (what the wake term
    charges: a step a little longer than the spin), else LATE: a delay long against the spin on a
    crowded machine measures the crowd's wake-ups, not the wire's, which cost far less."""
    return 2 * spin if spin > 0 else LATE


def _fan_calls(comm: Any, r: int, fans: tuple[int, ...], pair: tuple[int, int]) -> dict[str, Any]:
    import torch

    from dt.transport import RECV, SEND

    calls = {}
    for k in fans:
        sends = [torch.zeros(1) for _ in range(k)]
        recvs = [torch.empty(1) for _ in range(k)]

        def fan(sends: list = sends, recvs: list = recvs) -> None:
            if r in pair:
                peer = pair[1] if r == pair[0] else pair[0]
                ops = [(SEND, t, peer) for t in sends] + [(RECV, t, peer) for t in recvs]
                for handle in comm.batch(ops):
                    handle.wait()

        calls[f"fan {k}"] = fan
    return calls


def _reply(comm: Any, r: int, delay: float, pair: tuple[int, int]) -> Any:
    import torch

    one = torch.zeros(1)

    def reply() -> None:
        if r == pair[0]:
            comm.recv(one, pair[1])
        elif r == pair[1]:
            end = time.perf_counter() + delay  # busy: a sleep would add its own timer slack
            while time.perf_counter() < end:
                pass
            comm.send(one, pair[0])

    return reply


def _copy_slopes(r: int, sizes: tuple[int, ...], reps: int, repeats: int) -> dict[str, float]:
    """Slopes (s/B) of a memcpy and an add, by rank 0 alone and by every rank at once.

    All of them timed in turns (dt/tools/tune_curves.latencies), so a load that
    drifts hits alone and together alike: their ratio is what matters.
    """
    import torch

    calls, kinds = {}, []
    for nbytes in sizes:
        a, b = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        for name in ("copy", "add"):
            for who in ("alone", "all"):
                busy = who == "all" or r == 0
                op = (lambda a=a, b=b: b.copy_(a)) if name == "copy" else (lambda a=a, b=b: a.add_(b))
                calls[f"{name} {who} {nbytes}"] = op if busy else (lambda: None)
                kinds.append((name, who))
    timed = latencies(calls, reps, repeats, burst=2)
    return {f"{name} {who}": slope({n: timed[f"{name} {who} {n}"].seconds for n in sizes})
            for name, who in dict.fromkeys(kinds)}


def _ratio(alone: float, together: float) -> float:
    """A byte alone / a byte in company, never above 1 (noise cannot make company faster); 1 where
    either slope came out 0 (slope's floor: noise over the few sizes swamped the bytes' cost), which
    measured nothing: a byte is never free, alone or in company."""
    return min(1.0, alone / together) if together > 0 and alone > 0 else 1.0


def _spin(g: Any, r: int, pair: tuple[int, int]) -> float:
    """How long the pair's waits spin: shared memory's (dt.transport.shm.sync) for the ranks of
    this rank's host; none on the torch wire or between hosts (gloo's waits sleep at once)."""
    from dt.transport import topology_of

    topology = topology_of(g)
    wires = g.links.wires or ()
    if topology.hosts[pair[0]] != topology.hosts[pair[1]] or (
            g.links.board is None and not any(w.name == "shm" for w in wires)):
        return 0.0
    from dt.transport.shm.sync import default_spin

    return default_spin(topology.per_host[topology.hosts[r]])


def measure_terms(group: Any, reps: int = 20, repeats: int = REPEATS, quick: bool = False,
                  pair: tuple[int, int] = (0, 1), copies: bool = True) -> dict[str, Any]:
    """The terms' figures on `group` (its wire), the same on every rank (see the module doc).

    `pair`: the two ranks the messages go between (across hosts: one on each, for the
    link between hosts); copies=False skips solo (memory is a host's, not a link's).
    """
    import torch

    import dt
    from dt.args import cores
    from dt.transport import Comm, resolve_group, set_validation

    g = resolve_group(group)
    comm = Comm(g, "tune", "terms")
    p, r = comm.size, comm.rank
    fans = FANS[:3] if quick else FANS
    one, got = torch.zeros(1), torch.empty(1)
    other = {pair[0]: pair[1], pair[1]: pair[0]}
    calls = {**_fan_calls(comm, r, fans, pair),
             "pair": lambda: comm.exchange(one, other[r], got, other[r]) if r in other else None,
             "all": lambda: comm.exchange(one, (r + 1) % p, got, (r - 1) % p)}
    set_validation(False)
    timed = latencies(calls, reps, 1 if quick else repeats)
    spin = _spin(g, r, pair)
    late = median_time(_reply(comm, r, late_by(spin), pair), reps)
    prompt = median_time(_reply(comm, r, 0.0, pair), reps)
    set_validation(None)
    slopes = (_copy_slopes(r, QUICK_COPY_SIZES if quick else COPY_SIZES, max(3, reps // 4),
                           1 if quick else repeats) if copies else {})
    raw = {f"fan {k}": timed[f"fan {k}"].seconds for k in fans}
    raw.update(pair=timed["pair"].seconds, all=timed["all"].seconds, late=late, prompt=prompt, **slopes)
    # every rank takes the slowest rank's figure (rank 0's waits on rank 1 and the other way round)
    names = sorted(raw)
    agreed = torch.tensor([raw[k] for k in names], dtype=torch.float64)
    dt.all_reduce(agreed, op=dt.ReduceOp.MAX, algorithm="naive")
    raw = dict(zip(names, agreed.tolist()))
    post = slope({2 * k: raw[f"fan {k}"] for k in fans})  # 2 messages (a send, a receive) per k
    return {"post": post, "wake": max(0.0, raw["late"] - late_by(spin) - raw["prompt"]), "spin": spin,
            "solo": _ratio(raw["copy alone"], raw["copy all"]) if copies else 1.0,
            "solo_reduce": _ratio(raw["add alone"], raw["add all"]) if copies else 1.0,
            "oversub": max(0.0, raw["all"] - raw["pair"]) if p > cores() else 0.0,
            "raw": raw}
