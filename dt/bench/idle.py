"""`dt bench idle`: what a rank waiting in a collective costs the machine while it waits.

    dt bench idle --world 2 --wait 2

Rank 0 enters an all-reduce at once; every other rank sleeps `--wait`
seconds first. Rank 0's CPU time over its wall time inside the call is the
price of waiting: a rank that spins burns a core its peers (on a machine
whose ranks share cores) need. Measured for each wire and algorithm given,
and for torch's gloo all-reduce (and DeepSpeed's, with --compare deepspeed,
whose waits spin). The shared-memory wire spins for at most 50 us (none when
ranks outnumber cores), then sleeps on a futex with wake-ups every 50 ms to
check for dead peers: the target is under 10% of a core.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import dt
from dt import args as args_
from dt import transport
from dt.bench.collectives_sweep import deepspeed_all_reduce, forget_deepspeed
from dt.bench.harness import wire_group
from dt.launcher import run_workers

__all__ = ["main"]


def _worker(cases: list[tuple[str, str]], wait: float, token: str) -> dict[str, Any]:
    r, p = dist.get_rank(), dist.get_world_size()
    transport.set_validation(False)
    groups = {w: wire_group(w) for w in {w for _, w in cases if w in ("shm", "torch")}}
    ds = deepspeed_all_reduce(p, r, token) if any(a == "deepspeed" for a, _ in cases) else None
    out = {}
    for algorithm, wire in cases:
        x = torch.ones(1024)
        dist.barrier()
        if r != 0:
            time.sleep(wait)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if algorithm == "torch":
            dist.all_reduce(x)
        elif algorithm == "deepspeed":
            ds(x)
        else:
            dt.all_reduce(x, algorithm=algorithm, group=groups[wire])
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        out[f"{algorithm}@{wire}"] = (cpu, wall)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt bench idle", description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=args_.world, default=2)
    parser.add_argument("--wait", type=args_.positive, default=2.0,
                        help="seconds rank 0 waits for the others")
    parser.add_argument("--algorithms", default="one_shot,two_shot,ring",
                        help="dt algorithms, on the shm wire (ring also on the torch wire)")
    parser.add_argument("--compare", default=None, help="'deepspeed': its all-reduce too (installed)")
    args = parser.parse_args(argv)
    cases = [(a, "shm") for a in args.algorithms.split(",") if a]
    cases += [("ring", "torch"), ("torch", "gloo")]
    if args.compare == "deepspeed":
        try:
            import deepspeed  # noqa: F401
            cases.append(("deepspeed", "shm"))
        except ImportError:
            print("# deepspeed is not installed: skipped", file=sys.stderr)
    import os

    token = str(os.getpid() % 50000 + 10000)
    try:
        res = run_workers(_worker, args.world, cases, args.wait, token,
                          timeout=120 + 4 * args.wait * len(cases))
    finally:
        forget_deepspeed(token)
    print(f"# dt bench idle: world {args.world}, rank 0 waits {args.wait:g} s in an all-reduce of "
          f"4 KiB for the others; load average {os.getloadavg()[0]:.1f}")
    print(f"# {'algorithm@wire':<22} {'wall (s)':>9} {'cpu (s)':>9} {'% of a core':>12}")
    for key, (cpu, wall) in res[0].items():
        print(f"  {key:<22} {wall:9.3f} {cpu:9.3f} {100 * cpu / wall if wall else 0:11.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
