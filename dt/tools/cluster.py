"""`dt cluster`: a simulated cluster on this machine (network namespaces, tc-capped links).

    dt cluster up --hosts 2 --per-host 2 --link 1Gbit [--delay 0.1ms] -- python -m dt bench collectives
    dt cluster down [--all | JOB ...]     remove what a killed run left (default: jobs whose owner died)
    dt cluster list                       jobs with something left, and whether their owner lives
                                          (one line saying so when there are none)

`up` makes the hosts, runs the command on every one under torchrun (each
host's lines prefixed [h0], [h1], ...), tears everything down however it ends,
and exits with the worst host's status. Root and ip/tc are needed: without
them it says so in one line (exit 2). See dt/launcher/cluster.
"""

from __future__ import annotations

import sys

from dt.args import InputError, Parser, at_least, check_local_world, duration, link, seconds
from dt.launcher.cluster import ClusterError, check_tools, cluster, destroy, jobs, stale

__all__ = ["main"]


def _parser() -> Parser:
    p = Parser(prog="dt cluster", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="make the hosts, run CMD on each under torchrun, tear down")
    up.add_argument("--hosts", type=at_least(1), default=2)
    up.add_argument("--per-host", type=at_least(1), default=2, help="ranks per host (torchrun's nproc)")
    up.add_argument("--link", type=link, default=None,
                    help="each host's link rate, both ways (1Gbit, 10Gbit/s); default: uncapped")
    up.add_argument("--delay", type=duration, default=0.0, help="one-way added delay per link (netem)")
    up.add_argument("--timeout", type=seconds, default=None, help="stop the run after this many seconds")
    up.add_argument("cmd", nargs="+", help="the command every host runs (after --)")
    down = sub.add_parser("down", help="remove leftovers of killed runs")
    down.add_argument("--all", action="store_true", help="every job, even one whose owner still runs")
    down.add_argument("job", nargs="*")
    sub.add_parser("list", help="jobs with something left")
    return p


def _list() -> int:
    """One line per job with something left; one line saying so when there is none."""
    found, dead = jobs(), set(stale())
    if not found:
        print("dt cluster: no jobs: no namespace, link or state file of a simulated cluster is left")
        return 0
    for j in found:
        print(f"{j}  {'stale (owner gone)' if j in dead else 'running'}")
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action == "up":  # the simulated hosts all run on this machine: its bound holds their sum
        try:
            check_local_world(args.hosts * args.per_host, "ranks (--hosts x --per-host)")
        except InputError as exc:
            parser.error(str(exc))
    try:
        check_tools()
    except ClusterError as exc:
        print(f"dt cluster: {exc}", file=sys.stderr)
        return 2
    if args.action == "list":
        return _list()
    if args.action == "down":
        targets = args.job or (jobs() if args.all else stale())
        for j in targets:
            destroy(j)
            print(f"dt cluster: removed {j}")
        return 0
    try:
        with cluster(args.hosts, args.per_host, args.link, args.delay) as c:
            print(f"dt cluster: job {c.net.job}: {args.hosts} hosts x {args.per_host} ranks, link "
                  f"{'uncapped' if not args.link else f'{args.link / 1e9:g} Gbit/s'} each way"
                  f"{f', delay {args.delay * 1e3:g} ms' if args.delay else ''}", file=sys.stderr)
            code = c.run(args.cmd, timeout=args.timeout)
    except ClusterError as exc:
        print(f"dt cluster: {exc}", file=sys.stderr)
        return 2
    if code == 124 and args.timeout:
        print(f"dt cluster: stopped after --timeout {args.timeout:g}s", file=sys.stderr)
    return code
