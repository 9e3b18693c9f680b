"""`dt tune` on a group spanning hosts: alpha and beta of each link level, from one pair each.

The two-level model (dt.cost.levels) prices a message inside a host at
alpha_intra + bytes * beta_intra and one between hosts at alpha_inter +
bytes * beta_inter. A ring exchange over the whole group (dt/tools/tune.py)
mixes both: its step waits for the slowest hop, the one between hosts. So
each level is timed on its own pair (dt.hosts.level_pairs), the other
ranks idle:

- intra: the first two ranks of one host, over the wire they use there
  (the shared-memory wire where the group has it);
- inter: the first rank of host 0 and of host 1, over the torch wire;
- rails: every rank of host 0 with the rank of the same local index on
  host 1, all at once: if the host's ranks share its NICs each sees a
  slower beta (dt.cost.levels.nics_from turns the two into `nics`).

Each pair exchanges n bytes both ways at once (one step of a ring or a
doubling algorithm, as the whole-group curve does): alpha from bursts of
1-element exchanges (the fastest of the repeats, as the whole group's), beta
the slope of the curve from 256 KiB up. The curves are
held to the same noise rule as every `dt tune` curve (time grows with size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dt.bench.harness import slope
from dt.hosts import level_pairs, rail_pairs
from dt.tools.tune_curves import EXCHANGE_SIZES, REPEATS, latencies, median_time, steady_curve

__all__ = ["combine", "measure_levels"]


def _exchange(comm: Any, peer: int | None, nbytes: int) -> Callable[[], None]:
    """One exchange of nbytes (float32) with `peer` both ways at once; nothing for a rank in no pair."""
    import torch

    send = torch.ones(max(1, nbytes // 4))
    recv = torch.empty_like(send)

    def step() -> None:
        if peer is not None:
            comm.exchange(send, peer, recv, peer)

    return step


def measure_levels(group: Any, reps: int, attempts: int = 3, repeats: int = REPEATS) -> dict[str, Any]:
    """This rank's figures of each level it timed ({} on ranks in no pair); collective on `group`."""

    from dt.transport import Comm, resolve_group, topology_of

    g = resolve_group(group)
    comm = Comm(g, "tune", "level pair")
    hosts = tuple(topology_of(g).hosts)
    out: dict[str, Any] = {}
    rails = rail_pairs(hosts)
    runs = {level: [pair] for level, pair in level_pairs(hosts).items()}
    if len(rails) > 1:  # every rank of host 0 with its peer on host 1 at once: do they share a NIC?
        runs["rails"] = rails
    for level, pairs in sorted(runs.items()):
        peer = next((b if g.rank == a else a for a, b in pairs if g.rank in (a, b)), None)

        # alpha as the whole group's (dt/tools/tune_curves.py): bursts, the fastest of the repeats
        alpha = latencies({"alpha": _exchange(comm, peer, 4)}, reps, repeats)["alpha"]

        def curve(peer: int | None = peer, alpha: float = alpha.seconds) -> dict[int, float]:
            points = {EXCHANGE_SIZES[0]: alpha}  # the smallest point: the burst-timed latency
            for nbytes in EXCHANGE_SIZES[1:]:  # ranks in no pair idle, but join each timing's barrier
                fewer = reps if nbytes < 4 << 20 else max(5, reps // 3)
                points[nbytes] = median_time(_exchange(comm, peer, nbytes), fewer)
            return points if peer is not None else {}

        points, why = steady_curve(curve, attempts)  # every rank takes part (the verdict is shared)
        if peer is None:
            continue
        wire = g.wire_for(peer, "cpu").name
        out[level] = {"alpha": points[min(points)], "beta": slope({k: v for k, v in points.items()
                                                                   if k >= 1 << 18}),
                      "pair": [g.ranks[q] for q in pairs[0]], "wire": wire, "noisy": why, "pairs": len(pairs),
                      "spread": alpha.spread,
                      "exchange": {str(k): v for k, v in points.items()}}
    return out


def combine(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The group's level figures from every rank's: per level, the slower end of its pair."""
    out: dict[str, Any] = {}
    for mine in per_rank:
        for level, fig in mine.items():
            if level not in out:
                out[level] = dict(fig)
            else:
                for k in ("alpha", "beta", "spread"):
                    out[level][k] = max(out[level][k], fig[k])
                out[level]["noisy"] = out[level]["noisy"] or fig["noisy"]
    return out
