"""`dt bench collectives`: dt's algorithms against torch's own collective, nccl-tests style.

    dt bench collectives -b 1KB -e 64MB -f 4 --world 4 --collective all_reduce \\
        --algorithms ring,recursive_doubling,rabenseifner,auto --plot busbw.png

For each message size and each selected algorithm, plus torch.distributed's
own collective on the same gloo group, this prints nccl-tests' columns, a
size's rows as soon as it is measured: size (B), count (elements), type,
redop, root, then out-of-place and in-place time (us, median), algbw and busbw
(GB/s, busbw = algbw * nccl-tests' factor from dt.cost.BUSBW_FACTOR)
and #wrong (elements that differ from the value the inputs imply, summed over
ranks, in the column of the mode it was checked in), then the
time relative to torch's: the median over calls of (this call / torch's call
of the same round), in-place where there is one. It closes with nccl-tests'
"# Out of bounds values" (the results with any #wrong: OK or FAILED, and the
exit status 1 when any), "# Avg bus bandwidth" (per row: the mean busbw over
every size and mode) and a summary per size: dt's fastest row, auto among
them, against torch's on the same wire where dt ran on torch's (labelled
"across wires" where it did not), and auto's pick.

As in nccl-tests: -r is the root of broadcast, reduce, gather and scatter;
-d takes int8, uint8, int32, int64, half, bfloat16, float, double; -o all runs
the sweep once per reduction (sum, prod, max, min, and avg on a floating type).
The check (-c 1, the default) runs after each size's timed calls: every call once
more on the pattern's inputs, with the result buffer poisoned first, against
the exact result (dt.bench.harness.BenchCase.expected); -c 0 prints N/A.

Sizes: -b, -b*f, -b*f^2, ... and -e itself (always measured, the last row).
Units as dt.units reads them: KB, MB, GB are 1000s, KiB, MiB, GiB 1024s, and
nccl-tests' bare K, M, G are 1024s as they are there: `-b 1K -e 16M -f 4`
steps 1,024 .. 16,777,216 B exactly; `-b 1KB -e 16MB -f 4` ends
4,096,000 B, 16,000,000 B. gather and scatter are sized as nccl-tests sizes
them (the root's whole buffer, p blocks); a barrier has one row, 0 B.

Timing: -w warm-up calls, then -n timed calls, every algorithm of a size
interleaved call by call (the order rotated every round) so that they share
whatever else the machine is doing; before each call a barrier lines the ranks
up, and a call's time is the slowest rank's (dt/bench/harness.py builds the
buffers and runs that loop). The median is reported, the spread (interquartile
range over the median) beside it. dt's cross-rank argument validation is OFF
during timing (dt.transport.set_validation(False)), as torch runs without
one; the #wrong check runs before timing.

Out-of-place for the in-place-only torch APIs (all_reduce, broadcast,
reduce) means copy the input into the output buffer, then run in place:
what an out-of-place call costs through that API.

Wires: `--transport shm` (default) runs dt's calls on a group whose ranks of
one host talk through shared memory, `--transport torch` on one that sends
everything through torch.distributed (gloo's TCP), `--transport both` runs
each dt algorithm on both groups, interleaved in the same processes (rows
"ring@shm", "ring@torch"). `--shared` allocates the buffers with
dt.shm_empty, so the load/store algorithms read them in place (zero-copy);
without it they are ordinary tensors, copied in once. Beside busbw, the
memcpy column is the physical bound: one copy of the buffer's bytes by
every rank at once (what a shared-memory collective cannot beat).
`--compare deepspeed` adds DeepSpeed's shared-memory all-reduce
(torch.ops.deepspeed.inference_all_reduce_) when deepspeed is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import torch

import dt
from dt import args as args_
from dt import record
from dt.bench.collectives_sweep import (
    DTYPES,
    REDUCTIONS,
    bytes_held,
    collective_worker,
    forget_deepspeed,
    reductions,
    row_names,
    sweep_sizes,
)
from dt.bench.collectives_table import headline, out_of_bounds, plot, print_avg, print_header, summary
from dt.bench.harness import COLLECTIVES, registry_name
from dt.collectives import auto
from dt.device import DEVICES, backend_for, gpu_free
from dt.launcher import launch, resolve_world

__all__ = ["deepspeed_builds", "main", "parse_args", "run", "sweep_config"]


def sweep_config(args: argparse.Namespace, deepspeed: bool | None = None) -> dict[str, Any]:
    """What every rank's sweep needs (dt/bench/collectives_sweep.py), from the checked options
    (`deepspeed`: whether its row runs; None: if --compare asks and it builds here)."""
    coll = args.collective
    transports = ["shm", "torch"] if args.transport == "both" else [args.transport]
    if backend_for(args.device) == "nccl":
        transports = ["torch"]  # GPU tensors stay on NCCL
    algos = [a for a in args.algorithms.split(",") if a] if args.algorithms else \
        auto.candidates(registry_name(coll), shared_memory="shm" in transports) + ["auto"]
    if deepspeed is None:
        deepspeed = "deepspeed" in (args.compare or "").split(",") and deepspeed_builds()
    sizes = [0] if coll == "barrier" else sweep_sizes(args.b, args.e, args.f)
    ops = reductions(args.o, coll, args.d)
    return {"collective": coll, "algorithms": algos, "sizes": sizes, "iters": args.n,
            "warmup": args.w, "check": bool(args.c), "op": ops[0], "ops": ops, "root": args.r,
            "dtype": args.d,
            "progress": not args.quiet and len(sizes) > 3, "in_place_only": args.in_place_only,
            "transports": transports, "shared": args.shared, "deepspeed": deepspeed,
            "token": str(os.getpid() % 50000 + 10000), "stream": True}


def deepspeed_builds() -> bool:
    """Whether DeepSpeed's shared-memory all-reduce can run here: importable, and its C++ op
    built (JIT, ninja + g++, about a minute the first time; cached in TORCH_EXTENSIONS_DIR,
    where the ranks then load it). Else one line on stderr says why, and the bench goes on
    without it (DeepSpeed is no requirement of dt's)."""
    try:
        from deepspeed.accelerator import get_accelerator
    except Exception as exc:  # ImportError, or a deepspeed that fails on import
        print(f"# --compare deepspeed skipped: deepspeed does not import here "
              f"({type(exc).__name__}: {_first_line(exc)})", file=sys.stderr)
        return False
    try:
        get_accelerator().create_op_builder("ShareMemCommBuilder").load()
    except Exception as exc:  # a failed compile raises RuntimeError, a missing tool others
        print(f"# --compare deepspeed skipped: its shared-memory op (ShareMemCommBuilder) did not "
              f"build ({type(exc).__name__}: {_first_line(exc)})", file=sys.stderr)
        return False
    return True


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep: the header printed here, then each size's rows as rank 0 prints them.

    Both go to stdout, the file the workers inherit, so they interleave in order.
    """
    cfg = sweep_config(args)
    coll, transports, deepspeed = cfg["collective"], cfg["transports"], cfg["deepspeed"]
    backend = backend_for(args.device)
    p = args.world
    machine = {"cores": os.cpu_count(), "torch": torch.__version__, "backend": backend,
               "world": p, "python": platform.python_version(), "host": platform.node(),
               "validation": False, "figures": auto.machine(p, backend).__dict__,
               "shm_figures": auto.machine(p, "shm").__dict__, "transports": transports,
               "shared": args.shared, "load": os.getloadavg(),
               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    data = {"collective": coll, "machine": machine, "config": cfg, "results": []}
    print_header(data, sys.stdout)  # flushed: rank 0's rows follow on the same terminal
    try:
        per_rank = launch(collective_worker, p, cfg, timeout=args.timeout, backend=backend)
    finally:
        if deepspeed:
            forget_deepspeed(cfg["token"])
    data["results"] = per_rank[0]["rows"]
    # what the groups connected (across hosts an shm group also has socket peers), not what was asked
    machine["connected_wires"] = {name: sorted({w for rk in per_rank for w in rk["wires"][name]})
                                  for name in transports}
    return data


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every one checked (dt.args) before any process starts."""
    parser = args_.Parser(prog="dt bench collectives", description=__doc__.splitlines()[0])
    parser.add_argument("-b", type=args_.size, default="1K",
                        help="smallest size (default 1K). K, M, G: 1024s, as nccl-tests reads them; "
                             "KiB, MiB, GiB too; KB, MB, GB: 1000s")
    parser.add_argument("-e", type=args_.size, default="16M",
                        help="largest size, always measured (default 16M; 1K * 4^7 lands on it)")
    parser.add_argument("-f", type=args_.positive, default=4, help="size step factor, > 1 (default 4)")
    parser.add_argument("-n", type=args_.at_least(1), default=20, help="timed calls per size (default 20)")
    parser.add_argument("-w", type=args_.at_least(0), default=3, help="warm-up calls per size (default 3)")
    parser.add_argument("-c", type=int, choices=(0, 1), default=1,
                        help="check each timed call's result against the exact one (default 1)")
    parser.add_argument("-o", default="sum", type=str.lower, choices=(*REDUCTIONS, "product", "all"),
                        help="reduction op: sum, prod, min, max, avg, or all of them in turn (default sum)")
    parser.add_argument("-d", default="float", choices=sorted(DTYPES), help="data type (default float)")
    parser.add_argument("-r", type=args_.at_least(0), default=0,
                        help="root rank of broadcast, reduce, gather, scatter (default 0)")
    parser.add_argument("--world", type=args_.world, default=None,
                        help="ranks (default 2; under torchrun: the launched ones)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    parser.add_argument("--collective", default="all_reduce", choices=COLLECTIVES)
    parser.add_argument("--algorithms", default=None,
                        help="comma-separated dt algorithms, 'auto' allowed (default: all + auto)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--plot", default=None, help="PNG of busbw against size per algorithm (log-log)")
    parser.add_argument("--timeout", type=args_.seconds, default=1800)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--in-place-only", action="store_true", help="skip the out-of-place column")
    parser.add_argument("--transport", default="shm", choices=("shm", "torch", "both"),
                        help="the wire dt's calls run on (both: side by side, rows algo@wire)")
    parser.add_argument("--shared", action="store_true",
                        help="buffers from dt.shm_empty (the load/store algorithms read them in place)")
    parser.add_argument("--compare", default=None,
                        help="'deepspeed': add DeepSpeed's shared-memory all-reduce (if installed)")
    record.add_option(parser)
    args = parser.parse_args(argv)
    args.world = resolve_world(args.world, 2)
    if args.r >= args.world:
        parser.error(f"-r {args.r}: the root must be one of the ranks, 0 to {args.world - 1} "
                     f"(--world {args.world})")
    deepspeed = "deepspeed" in (args.compare or "").split(",")
    if deepspeed and (args.collective != "all_reduce" or args.d not in ("float", "float32", "bfloat16",
                                                                         "half", "float16")
                      or args.o != "sum"):
        parser.error("--compare deepspeed needs all_reduce, sum, float/half/bf16")
    if args.b > args.e:
        parser.error(f"-b {args.b:,} B is larger than -e {args.e:,} B: nothing to measure")
    if args.f <= 1 and args.b != args.e:
        parser.error(f"-f {args.f:g} must be above 1 to step from -b to -e")
    if args.plot and args.collective == "barrier":
        parser.error("--plot draws busbw against size: a barrier has neither")
    if args.o == "prod":
        args.o = "product"
    if args.o == "avg" and not DTYPES[args.d].is_floating_point:
        parser.error(f"-o avg needs a floating -d, not {args.d}")
    known = dt.ALGORITHMS[registry_name(args.collective)]
    names = [a for a in (args.algorithms or "").split(",") if a]
    unknown = [a for a in names if a != "auto" and a not in known]
    if args.algorithms is not None and (unknown or not names):
        parser.error(f"--algorithms {args.algorithms!r}: {args.collective} has {sorted(known)} "
                     "(and auto)")
    _check_memory(parser, args)
    return args


def _check_memory(parser: args_.Parser, args: argparse.Namespace) -> None:
    """-e's buffers on every rank of this host, and the timings -n makes rank 0 keep."""
    dtype = DTYPES[args.d]
    held = bytes_held(args.collective, args.e, dtype, bool(args.c))
    parser.check_memory(f"-e {args.e:,} B", held, args_.ranks_on_this_host(args.world),
                        "a case's 2 buffers and the check's exact result",
                        gpu_free(args.device))
    cfg = sweep_config(args, deepspeed="deepspeed" in (args.compare or "").split(","))
    calls = len(row_names(cfg)) * (1 if args.in_place_only else 2)
    # every rank's timings of one size, gathered, and the slowest of each call for every size and op
    kept = calls * args.n * (args.world + len(cfg["sizes"]) * len(cfg["ops"]))
    parser.check_memory(f"-n {args.n:,}", kept * args_.SAMPLE_BYTES, 1, f"rank 0 keeps {kept:,} timings")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    entity = f"{args.collective}-w{args.world}"
    if (status := record.rerun("dt bench collectives", argv, args.record, "collectives", entity)) is not None:
        return status
    data = run(args)
    print_avg(data, sys.stdout)
    summary(data, sys.stdout)
    record.headline(headline(data))
    # The machine may be shared: the load at the end beside the header's at the start.
    print("# load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(data, fh, indent=1)
        print(f"# results written to {args.json}")
    if args.plot:
        plot(data, args.plot)
        print(f"# plot written to {args.plot}")
    return 0 if out_of_bounds(data["results"]) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
