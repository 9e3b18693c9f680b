"""`dt bench collectives`: dt's algorithms against torch's own collective, nccl-tests style.

    dt bench collectives -b 1KB -e 64MB -f 4 --world 4 --collective all_reduce \\
        --algorithms ring,recursive_doubling,rabenseifner,auto --plot busbw.png

For each message size (from -b to -e, times -f each step) and each selected
algorithm, plus torch.distributed's own collective on the same gloo group,
this prints nccl-tests' columns: size (B), count (elements), type, redop,
root, then out-of-place and in-place time (us, median), algbw and busbw
(GB/s, busbw = algbw * nccl-tests' factor from dt.cost.BUSBW_FACTOR)
and #wrong (elements that differ from torch's result on the same input,
summed over ranks), then the time relative to torch's: the median over calls
of (this call / torch's call of the same round), in-place where there is one.

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
import contextlib
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import dt
from dt import args as args_
from dt import cost, transport
from dt.bench.harness import COLLECTIVES, TORCH, Case, registry_name, time_calls, wire_group
from dt.collectives import auto
from dt.collectives.registry import needs_shared_memory
from dt.device import DEVICES, backend_for
from dt.launcher import launch, resolve_world

DTYPES = {"float": torch.float32, "float32": torch.float32, "double": torch.float64,
          "float64": torch.float64, "half": torch.float16, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int": torch.int32,
          "int64": torch.int64}


def sizes_between(lo: int, hi: int, factor: float) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(int(s))
        s = s * factor if factor > 1 else s + 1
    return out


def _wrong(case: Case, algorithm: str, inplace: bool, group: Any = None) -> int:
    """Elements of this rank's result that differ from torch's on the same input."""
    ref_case = Case(case.collective, case.count, case.dtype, case.op, case.p, case.r)
    ref_case.reset()
    fn = ref_case.call(TORCH, inplace)
    if fn is None:
        return 0
    fn()
    ref = ref_case.result(inplace).clone()
    mine = Case(case.collective, case.count, case.dtype, case.op, case.p, case.r)
    mine.reset()
    mine.call(algorithm, inplace, group=group)()
    got = mine.result(inplace)
    if case.collective == "reduce" and case.r != 0:
        return 0  # only the root's buffer is defined
    return int((got != ref).sum())


def memcpy_seconds(nbytes: int, reps: int = 5) -> float:
    """Median time for every rank at once to copy nbytes (the bound of a shared-memory step)."""
    src, dst = torch.ones(max(1, nbytes // 4)), torch.empty(max(1, nbytes // 4))
    dst.copy_(src)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def deepspeed_all_reduce(p: int, r: int, token: str) -> Any:
    """DeepSpeed's shared-memory all-reduce op, initialised for this world (None if absent)."""
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return None
    os.environ.update(LOCAL_SIZE=str(p), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=token)
    get_accelerator().create_op_builder("ShareMemCommBuilder").load().initialize(p, r)
    return torch.ops.deepspeed.inference_all_reduce_


def forget_deepspeed(token: str) -> None:
    """Unlink the segments DeepSpeed's op leaves in /dev/shm (named after MASTER_PORT = token)."""
    import glob

    for path in glob.glob(f"/dev/shm/deepspeed_*_127.0.0.1_{token}_*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def _deepspeed_call(op: Any, case: Case, inplace: bool) -> Any:
    x, y = case.input, case.output

    def run() -> None:
        if not inplace:
            y.copy_(x)
        op(y)
    return run


def _worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every size of the sweep on this rank: the #wrong check, then the timed calls."""
    p, r = dist.get_world_size(), dist.get_rank()
    transport.set_validation(False)
    dtype = DTYPES[cfg["dtype"]]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    wires = {w: wire_group(w) for w in cfg["transports"]}
    labels = wire_algorithms(cfg)
    ds = deepspeed_all_reduce(p, r, cfg["token"]) if cfg.get("deepspeed") else None
    out: dict[str, Any] = {"times": {}, "wrong": {}, "picked": {}, "count": {}, "memcpy": {}}
    sizes = cfg["sizes"]
    for i, nbytes in enumerate(sizes):
        if r == 0 and cfg["progress"]:
            print(f"[{i + 1}/{len(sizes)}] {nbytes:,} B ...", file=sys.stderr, flush=True)
        shared = wires.get("shm") if cfg.get("shared") else None
        case = Case(cfg["collective"], max(1, nbytes // itemsize), dtype, cfg["op"], p, r, shared=shared)
        calls = {}
        for a, w in labels + [(TORCH, None)] + ([("deepspeed", None)] if ds else []):
            name = a if len(cfg["transports"]) == 1 or w is None else f"{a}@{w}"
            if a == "auto":
                out["picked"][f"{nbytes}|{name}"] = auto.choose(
                    registry_name(cfg["collective"]), "auto", case.nbytes, transport.resolve_group(wires[w]))
            for inplace in (False, True) if not cfg.get("in_place_only") else (True,):
                fn = (_deepspeed_call(ds, case, inplace) if a == "deepspeed"
                      else case.call(a, inplace, group=wires.get(w)))
                if fn is not None:
                    calls[(name, inplace)] = fn
                    if cfg["check"] and a not in ("deepspeed",):
                        out["wrong"][f"{nbytes}|{name}|{int(inplace)}"] = _wrong(case, a, inplace,
                                                                               wires.get(w))
        case.reset()
        times = time_calls(calls, cfg["iters"], cfg["warmup"], reset=case.reset if ds else None)
        for (a, inplace), ts in times.items():
            out["times"][f"{nbytes}|{a}|{int(inplace)}"] = ts
        out["count"][str(nbytes)] = case.count
        out["memcpy"][str(nbytes)] = memcpy_seconds(case.nbytes)
    return out


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _stats(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    med = statistics.median(samples)
    return {"median": med, "p25": q[0], "p75": q[2], "min": min(samples), "max": max(samples),
            "spread": (q[2] - q[0]) / med if med else 0.0}


def row_names(cfg: dict[str, Any]) -> list[str]:
    """The rows of a sweep: each dt algorithm (per wire when both), torch's, DeepSpeed's."""
    both = len(cfg["transports"]) > 1
    names = [f"{a}@{w}" if both else a for a, w in wire_algorithms(cfg)]
    return names + [TORCH] + (["deepspeed"] if cfg.get("deepspeed") else [])


def wire_algorithms(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """(algorithm, wire) pairs timed: load/store algorithms only on the shm wire."""
    coll = registry_name(cfg["collective"])
    return [(a, w) for w in cfg["transports"] for a in cfg["algorithms"]
            if w == "shm" or a == "auto" or not needs_shared_memory(coll, a)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    coll = args.collective
    transports = ["shm", "torch"] if args.transport == "both" else [args.transport]
    algos = [a for a in args.algorithms.split(",") if a] if args.algorithms else \
        auto.candidates(registry_name(coll), shared_memory="shm" in transports) + ["auto"]
    deepspeed = "deepspeed" in (args.compare or "").split(",")
    if deepspeed and (coll != "all_reduce" or args.d not in ("float", "float32", "bfloat16", "half",
                                                             "float16") or args.o.lower() != "sum"):
        raise SystemExit("dt bench collectives: --compare deepspeed needs all_reduce, sum, float/half/bf16")
    if deepspeed:
        try:
            import deepspeed as _ds  # noqa: F401
        except ImportError:
            print("# deepspeed is not installed: --compare deepspeed skipped", file=sys.stderr)
            deepspeed = False
    sizes = sizes_between(args.b, args.e, args.f)
    cfg = {"collective": coll, "algorithms": algos, "sizes": sizes, "iters": args.n,
           "warmup": args.w, "check": bool(args.c), "op": args.o.upper(), "dtype": args.d,
           "progress": not args.quiet and len(sizes) > 3, "in_place_only": args.in_place_only,
           "transports": transports, "shared": args.shared, "deepspeed": deepspeed,
           "token": str(os.getpid() % 50000 + 10000)}
    backend = backend_for(args.device)
    if backend == "nccl":
        cfg["transports"] = transports = ["torch"]  # GPU tensors stay on NCCL
    try:
        per_rank = launch(_worker, args.world, cfg, timeout=args.timeout, backend=backend)
    finally:
        if deepspeed:
            forget_deepspeed(cfg["token"])
    itemsize = torch.empty(0, dtype=DTYPES[args.d]).element_size()
    p = args.world
    rows = []
    for nbytes in sizes:
        memcpy = max(rk["memcpy"][str(nbytes)] for rk in per_rank)
        for a in row_names(cfg):
            row: dict[str, Any] = {"size": per_rank[0]["count"][str(nbytes)] * itemsize,
                                   "count": per_rank[0]["count"][str(nbytes)],
                                   "type": args.d, "redop": args.o.lower()
                                   if coll in ("all_reduce", "reduce", "reduce_scatter") else "none",
                                   "root": 0 if coll in ("broadcast", "reduce") else -1,
                                   "algorithm": a, "wrong": 0}
            row["memcpy_gbps"] = row["size"] / memcpy / 1e9
            if f"{nbytes}|{a}" in per_rank[0]["picked"]:
                row["picked"] = per_rank[0]["picked"][f"{nbytes}|{a}"]
            for inplace in (False, True):
                key = f"{nbytes}|{a}|{int(inplace)}"
                if key not in per_rank[0]["times"]:
                    continue
                # a call ends when its slowest rank does
                slowest = [max(rk["times"][key][i] for rk in per_rank)
                           for i in range(len(per_rank[0]["times"][key]))]
                st = _stats(slowest)
                st["samples"] = slowest
                algbw, busbw = cost.bus_bandwidth(coll, row["size"], st["median"], p)
                row["in" if inplace else "out"] = {**st, "algbw": algbw / 1e9, "busbw": busbw / 1e9}
                row["wrong"] += sum(rk["wrong"].get(key, 0) for rk in per_rank)
            rows.append(row)
    for row in rows:
        ref = next(x for x in rows if x["size"] == row["size"] and x["algorithm"] == TORCH)
        mode = "in" if "in" in row else "out"
        # Median of per-call ratios: call i of each algorithm ran next to torch's
        # call i, under the same load, which a shared machine needs.
        row["vs_torch"] = statistics.median(
            a / b for a, b in zip(row[mode]["samples"], ref[mode]["samples"]))
        row["vs_torch_of_medians"] = row[mode]["median"] / ref[mode]["median"]
    import platform

    machine = {"cores": os.cpu_count(), "torch": torch.__version__, "backend": backend,
               "world": p, "python": platform.python_version(), "host": platform.node(),
               "validation": False, "figures": auto.machine(p, backend).__dict__,
               "shm_figures": auto.machine(p, "shm").__dict__, "transports": transports,
               "shared": args.shared, "load": os.getloadavg(),
               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return {"collective": coll, "machine": machine, "config": cfg, "results": rows}


def print_report(data: dict[str, Any], out: Any = None) -> None:
    out = out or sys.stdout  # looked up per call: a captured stdout may be replaced
    m = data["machine"]
    print(f"# dt bench collectives: {data['collective']}, world {m['world']}, backend {m['backend']}, "
          f"{m['cores']} cores, torch {m['torch']}, {m['when']}", file=out)
    print("# dt's cross-rank validation OFF during timing (dt.transport.set_validation(False)); "
          f"median of {data['config']['iters']} calls after {data['config']['warmup']} warm-up, "
          "slowest rank per call; spread = IQR/median", file=out)
    f = m["figures"]
    print(f"# auto's figures ({f['source']}): alpha {f['alpha'] * 1e6:.0f} us, "
          f"beta {f['beta'] * 1e9:.3f} ns/B, gamma {f['gamma'] * 1e9:.3f} ns/B", file=out)
    if "shm_figures" in m:
        g = m["shm_figures"]
        print(f"# wires {'+'.join(m['transports'])}{' (buffers from dt.shm_empty)' if m['shared'] else ''}; "
              f"shm figures ({g['source']}): sync {g['sync'] * 1e6:.0f} us, memcpy "
              f"{g['mem'] * 1e9:.3f} ns/B; load average {m['load'][0]:.1f}", file=out)
    print(f"#{'':71}{'out-of-place':^39}  {'in-place':^39}", file=out)
    print(f"# {'size':>10} {'count':>11} {'type':>7} {'redop':>5} {'root':>4}  {'algorithm':<30}"
          f"{'time':>9} {'spread':>6} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  "
          f"{'time':>9} {'spread':>6} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  {'vs torch':>8} "
          f"{'memcpy':>7}", file=out)
    print(f"# {'(B)':>10} {'(elements)':>11} {'':>7} {'':>5} {'':>4}  {'':<30}"
          f"{'(us)':>9} {'':>6} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  "
          f"{'(us)':>9} {'':>6} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  {'':>8} {'(GB/s)':>7}", file=out)
    last = None
    for row in data["results"]:
        if last is not None and row["size"] != last:
            print("", file=out)
        last = row["size"]
        name = row["algorithm"] + (f" ({row['picked']})" if "picked" in row else "")
        cols = []
        for mode in ("out", "in"):
            if mode in row:
                s = row[mode]
                cols.append(f"{s['median'] * 1e6:9.1f} {s['spread'] * 100:5.0f}% {s['algbw']:7.3f} "
                            f"{s['busbw']:7.3f} {row['wrong'] if mode == 'in' or 'in' not in row else '':>6}")
            else:
                cols.append(f"{'N/A':>9} {'':>6} {'':>7} {'':>7} {'':>6}")
        bound = f"{row['memcpy_gbps']:7.2f}" if "memcpy_gbps" in row else ""
        print(f"  {row['size']:>10} {row['count']:>11} {row['type']:>7} {row['redop']:>5} "
              f"{row['root']:>4}  {name:<30}{cols[0]}  {cols[1]}  {row['vs_torch']:8.2f} {bound}", file=out)


def summary(data: dict[str, Any], out: Any = None) -> None:
    """Per size: dt's fastest algorithm, auto's pick and its time over the fastest's."""
    out = out or sys.stdout  # looked up per call: a captured stdout may be replaced
    rows = data["results"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    print("\n# summary: fastest dt algorithm (median time), then medians of per-call ratios", file=out)
    for size in sizes:
        here = {r["algorithm"]: r for r in rows if r["size"] == size}
        mode = "in" if "in" in here["torch"] else "out"
        dt_algos = {a: r[mode]["median"] for a, r in here.items()
                    if a not in ("torch", "deepspeed") and not a.startswith("auto")}
        if not dt_algos:
            continue
        fastest = min(dt_algos, key=dt_algos.get)

        def ratio(a: str, b: str, here: dict = here, mode: str = mode) -> float:
            """Median of per-call ratios, as in the vs torch column."""
            return statistics.median(x / y for x, y in zip(here[a][mode]["samples"],
                                                           here[b][mode]["samples"]))

        line = f"#   {size:>10} B  fastest {fastest:<19} {ratio(fastest, 'torch'):5.2f}x torch"
        for a in (a for a in here if a.startswith("auto")):
            line += (f"   {a} -> {here[a].get('picked', '?'):<16} "
                     f"{ratio(a, fastest):5.2f}x fastest, {ratio(a, 'torch'):5.2f}x torch")
        if "deepspeed" in here:
            line += f"   deepspeed {ratio('deepspeed', 'torch'):5.2f}x torch, {fastest} " \
                    f"{ratio(fastest, 'deepspeed'):5.2f}x deepspeed"
        print(line, file=out)


def plot(data: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for a in dict.fromkeys(r["algorithm"] for r in data["results"]):
        rows = [r for r in data["results"] if r["algorithm"] == a]
        mode = "in" if "in" in rows[0] else "out"
        ax.plot([r["size"] for r in rows], [r[mode]["busbw"] for r in rows], marker="o",
                label=a, linestyle="--" if a == "torch" else "-")
    first = [r for r in data["results"] if r["algorithm"] == data["results"][0]["algorithm"]]
    if first and "memcpy_gbps" in first[0]:
        ax.plot([r["size"] for r in first], [r["memcpy_gbps"] for r in first], color="black",
                linestyle=":", label="memcpy (bound)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    m = data["machine"]
    ax.set_title(f"{data['collective']}, world {m['world']}, {'+'.join(m.get('transports', ['gloo']))}, "
                 f"{m['cores']} cores")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, every one checked (dt.args) before any process starts."""
    parser = args_.Parser(prog="dt bench collectives", description=__doc__.splitlines()[0])
    parser.add_argument("-b", type=args_.size, default="1KB", help="smallest size (default 1KB)")
    parser.add_argument("-e", type=args_.size, default="16MB", help="largest size (default 16MB)")
    parser.add_argument("-f", type=args_.positive, default=4, help="size step factor, > 1 (default 4)")
    parser.add_argument("-n", type=args_.at_least(1), default=20, help="timed calls per size (default 20)")
    parser.add_argument("-w", type=args_.at_least(0), default=3, help="warm-up calls per size (default 3)")
    parser.add_argument("-c", type=int, choices=(0, 1), default=1,
                        help="check results against torch (default 1)")
    parser.add_argument("-o", default="sum", type=str.lower, choices=("sum", "prod", "product", "min",
                                                                      "max", "avg"),
                        help="reduction op: sum, prod, min, max, avg")
    parser.add_argument("-d", default="float", choices=sorted(DTYPES), help="data type")
    parser.add_argument("--world", type=args_.world, default=None,
                        help="ranks (default 2; under torchrun: the launched ones)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    parser.add_argument("--collective", default="all_reduce", choices=COLLECTIVES)
    parser.add_argument("--algorithms", default=None,
                        help="comma-separated dt algorithms, 'auto' allowed (default: all + auto)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--plot", default=None, help="PNG of busbw against size per algorithm")
    parser.add_argument("--timeout", type=args_.seconds, default=1800)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--in-place-only", action="store_true", help="skip the out-of-place column")
    parser.add_argument("--transport", default="shm", choices=("shm", "torch", "both"),
                        help="the wire dt's calls run on (both: side by side, rows algo@wire)")
    parser.add_argument("--shared", action="store_true",
                        help="buffers from dt.shm_empty (the load/store algorithms read them in place)")
    parser.add_argument("--compare", default=None,
                        help="'deepspeed': add DeepSpeed's shared-memory all-reduce (if installed)")
    args = parser.parse_args(argv)
    args.world = resolve_world(args.world, 2)
    if args.b > args.e:
        parser.error(f"-b {args.b:,} B is larger than -e {args.e:,} B: nothing to measure")
    if args.f <= 1 and args.b != args.e:
        parser.error(f"-f {args.f:g} must be above 1 to step from -b to -e")
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
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = run(args)
    print_report(data)
    summary(data)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(data, fh, indent=1)
        print(f"# results written to {args.json}")
    if args.plot:
        plot(data, args.plot)
        print(f"# plot written to {args.plot}")
    return 0 if all(r["wrong"] == 0 for r in data["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
