"""`dt model --hosts H --per-host G --intra RATE,LATENCY --inter RATE,LATENCY`: two link levels.

    dt model --hosts 2 --per-host 8 --intra 450GB/s,5us --inter 50GB/s,10us --size 1GB

prints, for all-reduce, reduce-scatter and all-gather (or the collective
named), every algorithm's predicted time on H hosts of G ranks (ranks of a
host contiguous, as torchrun numbers them), cheapest first, with the bytes
crossing each level: sent inside the host by the busiest rank, sent to
other hosts by the busiest rank, and leaving the busiest host. The model is
dt.cost.levels: per step, the slower level's alpha + bytes * beta; --nics N
makes a host's ranks share N NICs (default: one per rank).

Textbook check at 1 GB, 2 x 8, 450 GB/s / 50 GB/s: the flat ring sends
2(p-1)/p n = 1.875 GB through the boundary rank's NIC (all of it leaves
each host); the hierarchical all-reduce sends 2(H-1)/H n/G = 125 MB per
rank across hosts (1 GB per host, over 8 NICs) and 2(G-1)/G n = 1.75 GB
inside the host.

    torchrun ... -m dt model all_reduce --size 1MB,32MB --measured

on a world spanning hosts (dt cluster up, or real machines) times the
hierarchical algorithm and the others on the launched ranks and prints the
two-level prediction next to each (the figures every rank prices with:
rank 0's `dt tune` levels for this topology, else defaults, with a note).
"""

from __future__ import annotations

import sys
from typing import Any

from dt import args as args_
from dt import cost
from dt.cost.overheads import Overheads, level_terms
from dt.units import fmt_bytes, fmt_time

__all__ = ["link", "measure_worker", "print_levels", "print_measured", "rows"]


def link(text: str) -> tuple[float, float]:
    """'450GB/s,5us' -> (1/beta bytes per second, alpha seconds)."""
    parts = [s.strip() for s in str(text).split(",")]
    if len(parts) != 2:
        raise args_.InputError(f"a link is RATE,LATENCY (e.g. 450GB/s,5us), got {text!r}")
    return args_.rate(parts[0]), args_.duration(parts[1])


def _numels(collective: str, nbytes: int, p: int) -> int:
    """float32 elements of the buffer (all-reduce) or of one rank's block (the others)."""
    return nbytes // 4 if collective == "all_reduce" else max(nbytes // 4 // p, 0)


def rows(collective: str, nbytes: int, hosts: tuple[int, ...],
         levels: cost.Levels) -> list[tuple[str, cost.TwoLevelEstimate]]:
    """Every algorithm the two-level model prices for `collective`, cheapest first.

    nbytes: the buffer (all-reduce) or the whole gathered / scattered buffer, in float32 elements.
    """
    numels = _numels(collective, nbytes, len(hosts))
    out = [(a, cost.two_level(collective, a, numels, 4, hosts, levels))
           for a in cost.levels.LEVELED[collective]]
    return sorted(out, key=lambda row: row[1].total)


def print_levels(collective: str, nbytes: int, h: int, g: int, levels: cost.Levels,
                 out: Any = None) -> None:
    out = out or sys.stdout  # read at the call: a test may have replaced it
    hosts = tuple(i for i in range(h) for _ in range(g))
    print(f"\n{collective}, {fmt_bytes(nbytes, 3)}, {h} hosts x {g} ranks", file=out)
    print(f"  {'algorithm':<21} {'steps':>5} {'time':>10} {'intra/rank':>11} {'inter/rank':>11} "
          f"{'inter/host':>11}", file=out)
    for i, (name, e) in enumerate(rows(collective, nbytes, hosts, levels)):
        print(f"  {name + (' *' if i == 0 else ''):<21} {e.steps:>5} {fmt_time(e.total, 3):>10} "
              f"{fmt_bytes(e.intra_rank, 3):>11} {fmt_bytes(e.inter_rank, 3):>11} "
              f"{fmt_bytes(e.inter_host, 3):>11}", file=out)


def main(collective: str | None, sizes: list[int], h: int, g: int, intra: tuple[float, float],
         inter: tuple[float, float], gamma: float, nics: int) -> int:
    """The two-level tables (dt model's --hosts path)."""
    levels = cost.Levels(cost.Machine(intra[1], 1 / intra[0], gamma),
                         cost.Machine(inter[1], 1 / inter[0], gamma), nics)
    print(f"{h} hosts x {g} ranks; inside a host {fmt_bytes(intra[0], 3)}/s, {fmt_time(intra[1], 3)} "
          f"per step; between hosts {fmt_bytes(inter[0], 3)}/s, {fmt_time(inter[1], 3)} per step, "
          + (f"{nics} NIC(s) per host" if nics else "one NIC per rank")
          + (f"; 1/gamma {fmt_bytes(1 / gamma, 3)}/s" if gamma else "; reduction free"))
    for c in [collective] if collective else list(cost.levels.LEVELED):
        for n in sizes:
            print_levels(c, n, h, g, levels)
    print("\n* = lowest predicted time (what algorithm=\"auto\" picks across hosts with these figures)"
          "\nintra/rank, inter/rank: bytes the busiest rank sends inside its host / to other hosts; "
          "inter/host: bytes leaving the busiest host")
    return 0


# ---------------------------------------------------------------------------
# dt model --measured on a world spanning hosts: the two-level model next to the clock.
# ---------------------------------------------------------------------------


def measure_worker(collective: str, sizes: list[int], reps: int, wires: list[str],
                   algorithms: list[str] | None = None) -> dict[str, Any]:
    """On every rank, per wire: None where its group is on one host; else the hosts, the figures
    every rank prices with (rank 0's, dt.collectives.agreed) and each leveled algorithm's median."""
    import statistics

    import torch.distributed as dist

    import dt
    from dt.bench.harness import BenchCase, time_calls, wire_group
    from dt.collectives import agreed
    from dt.cost import machine
    from dt.transport import resolve_group, topology_of

    dt.set_validation(False)  # time the algorithm, not dt's argument check
    out: dict[str, Any] = {}
    for wire in wires:
        g = wire_group(wire)
        view = resolve_group(g)
        hosts = tuple(topology_of(view).hosts)
        fig = agreed.agree(view)
        if fig is None:
            out[wire] = None
            continue
        algos = [a for a in cost.levels.LEVELED[collective] if not algorithms or a in algorithms]
        times: dict[str, dict[str, float]] = {}
        for n in sizes:
            case = BenchCase(collective, max(1, n // 4))
            med = time_calls({a: case.call(a, group=g) for a in algos}, reps, warmup=1, reset=case.reset)
            times[str(n)] = {a: statistics.median(t) for a, t in med.items()}
        lv = fig.levels
        saved = machine.figures("shm" if wire == "shm" else dist.get_backend(), len(hosts),
                                topology_of(view).shape()) or {}
        out[wire] = {"hosts": list(hosts), "source": fig.source, "note": fig.note, "times": times,
                     "levels": [[m.alpha, m.beta, m.gamma] for m in (lv.intra, lv.inter)] + [lv.nics],
                     "terms": [saved.get("terms") or {}, saved.get("terms_inter") or {}]}
    return out


def print_measured(collective: str, sizes: list[int], per_rank: list[dict[str, Any]],
                   out: Any = None) -> None:
    """The two-level prediction next to the measured time (the slowest rank's median) per size."""
    out = out or sys.stdout
    for wire, mine in per_rank[0].items():
        if mine is None:
            continue
        hosts = tuple(mine["hosts"])
        (ia, ib, ig), (xa, xb, xg), nics = mine["levels"]
        levels = cost.Levels(cost.Machine(ia, ib, ig), cost.Machine(xa, xb, xg), nics)
        h, p = max(hosts) + 1, len(hosts)
        print(f"\n[{wire} wire] {h} hosts, {p} ranks; inside a host alpha {fmt_time(ia, 3)}, "
              f"beta {ib * 1e9:.3f} ns/B; between hosts alpha {fmt_time(xa, 3)}, beta {xb * 1e9:.3f} ns/B"
              f"\n  figures: {mine['source']}" + (f"\n  note: {mine['note']}" if mine["note"] else ""),
              file=out)
        intra, inter = (Overheads.from_saved({"terms": t}) for t in mine.get("terms", [{}, {}]))
        for n in sizes:
            measured = {a: max(r[wire]["times"][str(n)][a] for r in per_rank)
                        for a in mine["times"][str(n)]}
            print(f"\n{collective}, {fmt_bytes(n, 3)}, {h} hosts, {p} ranks", file=out)
            print(f"  {'algorithm':<21} {'steps':>5} {'two-level':>10} {'software':>9} {'wake':>9} "
                  f"{'sharing':>9} {'predicted':>10} {'measured':>10} {'meas/pred':>9} "
                  f"{'inter/rank':>11} {'inter/host':>11}", file=out)
            for i, (name, e) in enumerate(r for r in rows(collective, n, hosts, levels) if r[0] in measured):
                m = measured[name]
                t = level_terms(collective, name, _numels(collective, n, p), 4, hosts, levels, intra, inter)
                total = e.total + t.total
                print(f"  {name + (' *' if i == 0 else ''):<21} {e.steps:>5} {fmt_time(e.total, 3):>10} "
                      f"{fmt_time(t.software, 3):>9} {fmt_time(t.wake, 3):>9} {fmt_time(t.sharing, 3):>9} "
                      f"{fmt_time(total, 3):>10} {fmt_time(m, 3):>10} "
                      f"{m / total if total else float('nan'):>9.2f} "
                      f"{fmt_bytes(e.inter_rank, 3):>11} {fmt_bytes(e.inter_host, 3):>11}", file=out)
    print("\n* = lowest predicted time (what algorithm=\"auto\" picks across hosts with these figures, "
          "unless dt tune measured winners on this topology)", file=out)
