"""`dt model`: what would a collective cost on a machine you describe?

    dt model all_reduce --size 1GB --world 8 --bandwidth 450GB/s --latency 5us

prints, per algorithm, the cost model's sequential steps, bytes on the
critical path per rank, the latency term (steps * alpha), the bandwidth term
(bytes * beta), the reduction term (reduced bytes * gamma, 0 unless --reduce
is given) and their total. That example reproduces the textbook figure: ring
all-reduce of 1 GB on 8 ranks is 14 * 5 us + 2 * 7/8 * 1 GB / 450 GB/s =
0.07 + 3.89 = 3.96 ms, bandwidth-bound; at --size 1MB it is 70 + 3.9 = 74 us,
latency-bound, and the doubling algorithms win.

    dt model all_reduce --size 256KB,1MB,4MB --world 2 --measured

uses the alpha, beta, gamma `dt tune` saved for this machine instead, runs
each algorithm here on --world processes, and prints the prediction next to
the measured median.

Units: sizes B, KB, MB, GB (powers of 1000), KiB, MiB, GiB (of 1024); rates
B/s, KB/s, MB/s, GB/s, KiB/s .. GiB/s, bit/s, Kbit/s, Mbit/s, Gbit/s; times ns,
us, ms, s.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from dt import args as args_
from dt import cost
from dt.device import DEVICES, backend_for
from dt.units import fmt_bytes, fmt_time, parse_rate, parse_size, parse_time  # noqa: F401 (dt model's units)

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all",
               "gather", "scatter", "barrier")
MEASURABLE = COLLECTIVES[:6]  # what dt/bench/harness.py builds buffers for (--measured)


def _algorithms(collective: str) -> list[str]:
    from dt.collectives import auto  # registers every algorithm

    return auto.candidates(collective)


def table(collective: str, nbytes: int, world: int, alpha: float, beta: float,
          gamma: float) -> list[tuple[str, cost.Estimate]]:
    from dt.collectives.ring import DEFAULT_SEGMENT_BYTES

    rows = [(name, cost.estimate(collective, name, nbytes, world, alpha=alpha, beta=beta,
                                       gamma=gamma, segment_bytes=DEFAULT_SEGMENT_BYTES))
            for name in _algorithms(collective)]
    return sorted(rows, key=lambda row: row[1].total)


def print_table(collective: str, nbytes: int, world: int, rows: list, measured: dict | None = None,
                out: Any = sys.stdout) -> None:
    print(f"\n{collective}, {fmt_bytes(nbytes, 3)} ({nbytes:,} B), {world} ranks", file=out)
    head = (f"  {'algorithm':<19} {'steps':>5} {'bytes/rank':>11} {'latency':>11} "
            f"{'bandwidth':>11} {'reduction':>11} {'total':>11}")
    if measured is not None:
        head += f" {'measured':>11} {'meas/pred':>9}"
    print(head, file=out)
    for i, (name, e) in enumerate(rows):
        line = (f"  {name + (' *' if i == 0 else ''):<19} {e.steps:>5} {fmt_bytes(e.bytes, 3):>11} "
                f"{fmt_time(e.latency, 3):>11} {fmt_time(e.bandwidth, 3):>11} "
                f"{fmt_time(e.reduction, 3):>11} {fmt_time(e.total, 3):>11}")
        if measured is not None and name in measured:
            m = measured[name]
            line += f" {fmt_time(m, 3):>11} {m / e.total if e.total else float('nan'):>9.2f}"
        print(line, file=out)


# ---------------------------------------------------------------------------
# --measured: run each algorithm here and time it.
# ---------------------------------------------------------------------------


def _measure_worker(collective: str, algorithms: list[str], sizes: list[int],
                    reps: int) -> dict[str, dict[str, float]]:
    """Median seconds of each algorithm at each size on this rank (the harness's buffers and loop)."""
    import dt
    from dt.bench.harness import Case, time_calls

    dt.set_validation(False)  # time the algorithm, not dt's argument check
    out: dict[str, dict[str, float]] = {}
    for nbytes in sizes:
        case = Case(collective, max(1, nbytes // 4))
        times = time_calls({a: case.call(a) for a in algorithms}, reps, warmup=1, reset=case.reset)
        out[str(nbytes)] = {a: statistics.median(t) for a, t in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt model", description=__doc__.splitlines()[0])
    parser.add_argument("collective", choices=COLLECTIVES)
    parser.add_argument("--size", type=args_.listed(args_.size), default="1MB",
                        help="message size(s), comma-separated: 1GB,1MB")
    parser.add_argument("--world", type=args_.world, default=8)
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
    args = parser.parse_args(argv)
    sizes = list(args.size)
    if args.measured and args.collective not in MEASURABLE:
        parser.error(f"--measured times {', '.join(MEASURABLE)}, not {args.collective}")
    if args.measured:
        from dt.cost import machine

        saved = machine.figures(backend_for(args.device), args.world)
        if saved is None:
            print("dt model --measured: no figures saved; run `dt tune --world "
                  f"{args.world}` first", file=sys.stderr)
            return 2
        alpha, beta, gamma = saved["alpha"], saved["beta"], saved["gamma"]
        print(f"figures from dt tune (world {saved['world']}, {saved['measured_at']}): "
              f"alpha {fmt_time(alpha, 3)}, beta {beta * 1e9:.3f} ns/B, gamma {gamma * 1e9:.3f} ns/B")
    else:
        alpha, beta = args.latency, 1 / args.bandwidth
        gamma = 1 / args.reduce if args.reduce else 0.0
        print(f"alpha {fmt_time(alpha, 3)} per step, 1/beta {fmt_bytes(1 / beta, 3)}/s per rank"
              + (f", 1/gamma {fmt_bytes(1 / gamma, 3)}/s" if gamma else ", reduction free"))
    tables = {n: table(args.collective, n, args.world, alpha, beta, gamma) for n in sizes}
    if args.algorithms:
        known = {name for rows in tables.values() for name, _ in rows}
        unknown = sorted(set(args.algorithms) - known)
        if unknown:
            parser.error(f"--algorithms: {args.collective} has no {', '.join(unknown)}; it has "
                         f"{', '.join(sorted(known))}")
        tables = {n: [row for row in rows if row[0] in args.algorithms] for n, rows in tables.items()}
    measured: dict[str, dict[str, float]] | None = None
    if args.measured:
        from dt.launcher import run_workers

        algos = sorted({name for rows in tables.values() for name, _ in rows})
        print(f"timing {', '.join(algos)} on {args.world} local processes "
              f"(median of {args.reps}, validation off)...", flush=True)
        measured = run_workers(_measure_worker, args.world, args.collective, algos, sizes,
                               args.reps, timeout=600, backend=backend_for(args.device))[0]
    for n, rows in tables.items():
        print_table(args.collective, n, args.world, rows,
                    measured[str(n)] if measured is not None else None)
    print("\n* = lowest predicted time (what algorithm=\"auto\" picks with these figures)")
    return 0
