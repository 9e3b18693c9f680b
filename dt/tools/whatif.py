"""`dt model`: what would a collective cost on a machine you describe?

    dt model all_reduce --size 1GB --world 8 --bandwidth 450GB/s --latency 5us

prints, per algorithm, the cost model's sequential steps, bytes on the
critical path per rank, the latency term (steps * alpha), the bandwidth term
(bytes * beta), the reduction term (reduced bytes * gamma: 0 unless --reduce
is given, or a shared-memory wire is described, below) and their total.
That example reproduces the textbook figure: ring all-reduce of 1 GB on 8
ranks is 14 * 5 us + 2 * 7/8 * 1 GB / 450 GB/s = 0.07 + 3.89 = 3.96 ms,
bandwidth-bound; at --size 1MB it is 70 + 3.9 = 74 us, latency-bound, and
the doubling algorithms win.

    dt model all_reduce --size 256KB,1MB,4MB --world 2 --measured

uses the alpha, beta, gamma `dt tune` saved for this machine instead, runs
each algorithm here on --world processes, and prints the prediction next to
the measured median, for each wire (--transport shm|torch|both, default
both): on the shared-memory wire the point-to-point algorithms are priced
with its channels' alpha and beta and the load/store ones (one_shot,
two_shot) with its `sync` and `mem` figures. Without --measured, --sync and
--memcpy describe a shared-memory wire and add the load/store algorithms:
their bytes/rank is what a rank copies in plus what it reads from its peers
(one-shot all-reduce: n + (p-1) n), priced at the memcpy rate, and what they
read they also reduce, at --reduce, else dt tune's shared-memory gamma, else
the default one (said so on the first line): loads are never free.

    dt model --hosts 2 --per-host 8 --intra 450GB/s,5us --inter 50GB/s,10us --size 1GB

prices two link levels instead (dt/tools/whatif_hosts.py, dt.cost.levels): the
hierarchical algorithms among the others, with the bytes crossing each level
per rank and per host. --measured on launched ranks that span hosts (torchrun,
dt cluster) does the same with the group's figures, next to the measured time.

Units: sizes B, KB, MB, GB (powers of 1000), KiB, MiB, GiB (of 1024); rates
B/s, KB/s, MB/s, GB/s, KiB/s .. GiB/s, bit/s, Kbit/s, Mbit/s, Gbit/s; times ns,
us, ms, s.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

from dt import args as args_
from dt import cost
from dt.cost.overheads import Overheads
from dt.device import DEVICES, backend_for
from dt.tools import whatif_hosts, whatif_terms
from dt.units import fmt_bytes, fmt_time, parse_rate, parse_size, parse_time, plural  # noqa: F401 (dt model's units)

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
               "gather", "scatter", "barrier")
MEASURABLE = COLLECTIVES[:6]  # what dt/bench/harness.py builds buffers for (--measured)


def _algorithms(collective: str, shared_memory: bool = False) -> list[str]:
    from dt.collectives import auto  # registers every algorithm

    return auto.candidates(collective, shared_memory)


def table(collective: str, nbytes: int, world: int, alpha: float, beta: float,
          gamma: float, sync: float | None = None, mem: float | None = None,
          overheads: Overheads | None = None) -> list[tuple[str, cost.Estimate]]:
    """Every algorithm's estimate, cheapest first; with sync and mem (a shared-memory
    wire) the load/store algorithms too, as dt.collectives.auto prices them; with
    `overheads` (dt tune's terms) each estimate carries the terms beside the three."""
    from dt.collectives import auto
    from dt.transport.shm.host import DEFAULT_STAGE_BYTES

    fig = cost.Machine(alpha, beta, gamma, sync=sync or 0.0, mem=mem or 0.0)
    shared = sync is not None and mem is not None
    stage = DEFAULT_STAGE_BYTES if shared else None  # the host segment's staging, as it stages
    return _cheapest(auto.predictions(collective, nbytes, world, fig, shared, stage, overheads))


def tuned_table(collective: str, nbytes: int, world: int, saved: dict) -> list[tuple[str, cost.Estimate]]:
    """--measured: every algorithm priced with one wire's `dt tune` entry, cheapest first
    (dt.collectives.auto.tuned_predictions, which the scaling study's tables price with too)."""
    from dt.collectives import auto

    return _cheapest(auto.tuned_predictions(collective, nbytes, world, saved))


def _cheapest(pred: dict[str, cost.Estimate]) -> list[tuple[str, cost.Estimate]]:
    return sorted(pred.items(), key=lambda row: row[1].total)


TERM_COLUMNS = (("software", "software"), ("wake", "wake"), ("sharing", "sharing"),
                ("oversub", "oversubscription"))  # (header, dt.cost.Terms field)


def print_table(collective: str, nbytes: int, world: int, rows: list, measured: dict | None = None,
                out: Any = None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may be replaced
    print(f"\n{collective}, {fmt_bytes(nbytes, 3)} ({nbytes:,} B), {plural(world, 'rank')}", file=out)
    with_terms = any(e.terms.total or e.terms.oversubscription for _, e in rows)
    head = (f"  {'algorithm':<19} {'steps':>5} {'bytes/rank':>11} {'latency':>11} "
            f"{'bandwidth':>11} {'reduction':>11}"
            + "".join(f" {h:>10}" for h, _ in TERM_COLUMNS if with_terms) + f" {'total':>11}")
    if measured is not None:
        head += f" {'measured':>11} {'meas/pred':>9}"
    print(head, file=out)
    for i, (name, e) in enumerate(rows):
        line = (f"  {name + (' *' if i == 0 else ''):<19} {e.steps:>5} {fmt_bytes(e.bytes, 3):>11} "
                f"{fmt_time(e.latency, 3):>11} {fmt_time(e.bandwidth, 3):>11} "
                f"{fmt_time(e.reduction, 3):>11}"
                + "".join(f" {fmt_time(getattr(e.terms, f), 3):>10}" for _, f in TERM_COLUMNS if with_terms)
                + f" {fmt_time(e.total, 3):>11}")
        if measured is not None and name in measured:
            m = measured[name]
            line += f" {fmt_time(m, 3):>11} {m / e.total if e.total else float('nan'):>9.2f}"
        print(line, file=out)


# ---------------------------------------------------------------------------
# --measured: run each algorithm here and time it.
# ---------------------------------------------------------------------------


def _measure_worker(collective: str, algorithms: dict[str, list[str]], sizes: list[int],
                    reps: int) -> dict[str, dict[str, dict[str, float]]]:
    """Median seconds of each algorithm at each size, per wire (the harness's buffers and loop)."""
    import dt
    from dt.bench.harness import BenchCase, time_calls, wire_group

    dt.set_validation(False)  # time the algorithm, not dt's argument check
    out: dict[str, dict[str, dict[str, float]]] = {}
    for wire, algos in algorithms.items():
        g = wire_group(wire)
        out[wire] = {}
        for nbytes in sizes:
            case = BenchCase(collective, max(1, nbytes // 4))
            times = time_calls({a: case.call(a, group=g) for a in algos}, reps, warmup=1,
                               reset=case.reset)
            out[wire][str(nbytes)] = {a: statistics.median(t) for a, t in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt model", description=__doc__.splitlines()[0])
    parser.add_argument("collective", choices=COLLECTIVES, nargs="?", default=None)
    parser.add_argument("--size", type=args_.listed(args_.size), default="1MB",
                        help="message size(s), comma-separated: 1GB,1MB")
    parser.add_argument("--world", type=args_.ranks, default=None,
                        help="ranks (default 8; with --measured under torchrun: the launched ones)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    parser.add_argument("--bandwidth", type=args_.rate, default="100GB/s",
                        help="per-rank link rate (1/beta)")
    parser.add_argument("--latency", type=args_.duration, default="5us", help="per-step latency (alpha)")
    parser.add_argument("--reduce", type=args_.rate, default=None,
                        help="reduction rate (1/gamma), e.g. 50GB/s")
    parser.add_argument("--measured", action="store_true",
                        help="use dt tune's figures for this machine and time each algorithm here")
    parser.add_argument("--reps", type=args_.at_least(1), default=10,
                        help="repetitions per size (--measured)")
    parser.add_argument("--algorithms", type=args_.listed(str), default=None,
                        help="comma-separated subset")
    parser.add_argument("--transport", default="both", choices=("shm", "torch", "both"),
                        help="--measured: which wire(s) to price and time (default both)")
    parser.add_argument("--sync", type=args_.duration, default=None,
                        help="a shared-memory synchronisation, e.g. 15us (adds the load/store algorithms)")
    parser.add_argument("--memcpy", type=args_.rate, default=None,
                        help="memcpy rate of a shared-memory wire, e.g. 5GB/s")
    parser.add_argument("--hosts", type=args_.at_least(1), default=None,
                        help="two link levels: this many hosts (with --per-host, --intra, --inter)")
    parser.add_argument("--per-host", type=args_.at_least(1), default=None, help="ranks per host")
    parser.add_argument("--intra", type=whatif_hosts.link, default="450GB/s,5us",
                        help="a link inside a host: RATE,LATENCY (default 450GB/s,5us)")
    parser.add_argument("--inter", type=whatif_hosts.link, default="50GB/s,10us",
                        help="a link between hosts: RATE,LATENCY (default 50GB/s,10us)")
    parser.add_argument("--nics", type=args_.at_least(0), default=0,
                        help="NICs a host's ranks share (default 0: one per rank)")
    args = parser.parse_args(argv)
    if args.measured:  # timed on the launched ranks under torchrun, else on local ones
        from dt.launcher import launch, launched_size, resolve_world

        args.world = resolve_world(args.world, 8)
        where = "local processes" if launched_size() is None else "launched ranks (torchrun)"
    elif args.world is None:
        args.world = 8
    sizes = list(args.size)
    if (args.hosts is None) != (args.per_host is None):
        parser.error("--hosts and --per-host go together")
    if args.hosts is not None:
        if args.measured:
            parser.error("--measured times this machine; --hosts describes a cluster")
        if args.collective not in (None, *cost.levels.LEVELED):
            parser.error(f"--hosts prices {', '.join(cost.levels.LEVELED)}, not {args.collective}")
        return whatif_hosts.main(args.collective, sizes, args.hosts, args.per_host, args.intra,
                                 args.inter, 1 / args.reduce if args.reduce else 0.0, args.nics)
    if args.collective is None:
        parser.error("the following arguments are required: collective (or --hosts and --per-host)")
    if args.measured and args.collective not in MEASURABLE:
        parser.error(f"--measured times {', '.join(MEASURABLE)}, not {args.collective}")
    backend = backend_for(args.device)
    wires = ["shm", "torch"] if args.transport == "both" else [args.transport]
    if backend == "nccl":
        wires = ["torch"]  # GPU tensors stay on NCCL
    if args.measured and launched_size() is not None and args.collective in cost.levels.LEVELED:
        per_rank = launch(whatif_hosts.measure_worker, args.world, args.collective, sizes, args.reps,
                          wires, args.algorithms, timeout=1800, backend=backend)
        if any(per_rank[0].values()):  # the launched world spans hosts: price it on two levels
            whatif_hosts.print_measured(args.collective, sizes, per_rank)
            return 0
    figures: dict[str, Any] = {}  # per wire: dt tune's saved entry (--measured), else the figures
    if args.measured:
        from dt.cost import machine

        for wire in wires:
            saved = machine.figures("shm" if wire == "shm" else backend, args.world)
            if saved is None:
                print(f"dt model --measured: no figures saved for the {wire} wire; run `dt tune "
                      f"--world {args.world}` first", file=sys.stderr)
                return 2
            figures[wire] = saved
            extra = (f", sync {fmt_time(saved['sync'], 3)}, memcpy {saved['mem'] * 1e9:.3f} ns/B"
                     if "sync" in saved else "")
            load = f", load {saved['load']:.1f}" if isinstance(saved.get("load"), (int, float)) else ""
            print(f"{wire} wire: figures from dt tune (world {saved['world']}, "
                  f"{saved['measured_at']}{load}): "
                  f"alpha {fmt_time(saved['alpha'], 3)}, beta {saved['beta'] * 1e9:.3f} ns/B, "
                  f"gamma {saved['gamma'] * 1e9:.3f} ns/B{extra}")
            if "terms" in saved:
                print(f"  terms (dt.cost.overheads): {whatif_terms.describe(saved['terms'])}")
    else:
        alpha, beta = args.latency, 1 / args.bandwidth
        sync, mem = args.sync, (1 / args.memcpy if args.memcpy else None)
        gamma, whose = (1 / args.reduce, "") if args.reduce else (0.0, "")
        if not args.reduce and sync and mem:
            # a shared-memory wire reduces what it loads: never free (dt tune's figure, else the default)
            shm = cost.machine.machine("shm", args.world)
            gamma = shm.gamma
            named = "the shared-memory default" if shm.source == "default" else shm.source
            whose = f" ({named}; --reduce sets it)"
        figures["model"] = (alpha, beta, gamma, sync, mem)
        print(f"alpha {fmt_time(alpha, 3)} per step, 1/beta {fmt_bytes(1 / beta, 3)}/s per rank"
              + (f", 1/gamma {fmt_bytes(1 / gamma, 3)}/s{whose}" if gamma else ", reduction free")
              + (f"; shared memory: sync {fmt_time(sync, 3)}, memcpy {fmt_bytes(1 / mem, 3)}/s"
                 if sync and mem else ""))
    tables = {w: {n: tuned_table(args.collective, n, args.world, fig) if isinstance(fig, dict)
                  else table(args.collective, n, args.world, *fig) for n in sizes}
              for w, fig in figures.items()}
    if args.algorithms:
        known = {name for t in tables.values() for rows in t.values() for name, _ in rows}
        unknown = sorted(set(args.algorithms) - known)
        if unknown:
            parser.error(f"--algorithms: {args.collective} has no {', '.join(unknown)}; it has "
                         f"{', '.join(sorted(known))}")
        tables = {w: {n: [row for row in rows if row[0] in args.algorithms] for n, rows in t.items()}
                  for w, t in tables.items()}
    measured: dict[str, dict[str, dict[str, float]]] | None = None
    if args.measured:
        algos = {w: sorted({name for rows in t.values() for name, _ in rows}) for w, t in tables.items()}
        print(f"timing {', '.join(f'{w}: ' + ','.join(a) for w, a in algos.items())} on {args.world} "
              f"{where} (median of {args.reps}, validation off)...", flush=True)
        measured = launch(_measure_worker, args.world, args.collective, algos, sizes,
                          args.reps, timeout=1800, backend=backend)[0]
    for w, t in tables.items():
        for n, rows in t.items():
            if w != "model":
                print(f"\n[{w} wire]", end="")
            print_table(args.collective, n, args.world, rows,
                        measured[w][str(n)] if measured is not None else None)
    print("\n* = lowest predicted time (what algorithm=\"auto\" picks with these figures)")
    if measured is not None:
        for w, (good, total) in whatif_terms.within(tables, measured).items():
            print(f"{w} wire: {good} of {total} predictions within {whatif_terms.TOLERANCE:.0%} of the "
                  f"measurement (load average now {os.getloadavg()[0]:.1f})")
    return 0
