"""What one planned all-reduce costs this rank: Python calls, files, CPU and wall time per call.

    python -m dt.bench.collectives_percall --world 2 --sizes 4KiB,64KiB,256KiB --calls 3000

On a connected group (warm-up calls first, so each shape has its plan: dt.collectives.plan),
rank 0 traces a few calls (the fewest counts) with a profile hook (sys.setprofile: Python
functions and C functions called, and which of dt's files they are in), then times `--calls`
calls back to back with no barrier between them: the median wall time (time.perf_counter) and
CPU time of the calling thread (time.thread_time). The CPU figure is what the call itself costs;
the wall figure adds waiting for the peers. "slowest" is the median over calls of the slowest
rank's wall time for that call (every rank's i-th call is the same collective), the measure `dt
bench collectives` takes between barriers: rank 0's own median misses the wake-ups of calls
where only the peer slept (at world 2 on a busy machine one rank sleeps in nearly every call,
each about half of them). Validation is off unless --validate (as `dt bench collectives` times);
--traffic makes every call inside an open dt.traffic() record (as dt train's step does). The
load average is printed beside the figures (a shared machine inflates both).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import dt
from dt import args as args_
from dt.launcher import launch, resolve_world
from dt.transport import set_validation

__all__ = ["main", "per_call", "slowest_us"]

WARM = 20  # calls before tracing: connect, choose, plan
TRACED = 5  # calls traced; the fewest files and Python calls are reported


def _traced(x: torch.Tensor) -> dict[str, int]:
    """One call under a profile hook: Python calls, C calls, dt files visited."""
    root = os.path.dirname(dt.__file__)
    counts = {"python": 0, "c": 0}
    files: set[str] = set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts["python"] += 1
            if frame.f_code.co_filename.startswith(root):
                files.add(frame.f_code.co_filename)
        elif event == "c_call":
            counts["c"] += 1

    sys.setprofile(hook)
    try:
        dt.all_reduce(x)
    finally:
        sys.setprofile(None)
    return {**counts, "files": len(files)}


def per_call(sizes: list[int], calls: int, validate: bool,
             counted: bool = False) -> dict[int, dict[str, Any]]:
    """This rank's figures per size (bytes of float32), every rank calling alike; `counted`:
    inside a dt.traffic() record."""
    set_validation(validate)
    out: dict[int, dict[str, Any]] = {}
    try:
        with dt.traffic() if counted else contextlib.nullcontext():
            _sizes_timed(sizes, calls, out)
    finally:
        set_validation(None)
    return out


def _sizes_timed(sizes: list[int], calls: int, out: dict[int, dict[str, Any]]) -> None:
    """Each size: warm calls (its plan made), one traced call, then `calls` timed back to back."""
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4))
        for _ in range(WARM):
            dt.all_reduce(x)
        dist.barrier()
        # the fewest of a few traced calls: one whose wait went to sleep also visits the liveness
        # checks (on a busy machine), not the call's own path
        traced = min((_traced(x) for _ in range(TRACED)), key=lambda t: (t["files"], t["python"]))
        dist.barrier()
        wall, cpu = [], []
        for _ in range(calls):
            t0, c0 = time.perf_counter(), time.thread_time()
            dt.all_reduce(x)
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - t0)
        out[nbytes] = {**traced, "wall_us": statistics.median(wall) * 1e6,
                       "cpu_us": statistics.median(cpu) * 1e6, "walls": wall}


def slowest_us(per_rank: list[dict[int, dict[str, Any]]], nbytes: int) -> float:
    """Median over calls of the slowest rank's wall time for that call, in microseconds."""
    return statistics.median(max(walls) for walls in zip(*(r[nbytes]["walls"] for r in per_rank))) * 1e6


def _sizes(text: str) -> list[int]:
    """Comma-separated sizes, each read as dt.args.size reads one (a bad one: its one-line error)."""
    return [args_.size(part) for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="python -m dt.bench.collectives_percall", description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=args_.world, default=None, help="ranks (default 2)")
    parser.add_argument("--sizes", type=_sizes, default="4KiB,64KiB,256KiB",
                        help="message sizes, comma-separated (default 4KiB,64KiB,256KiB)")
    parser.add_argument("--calls", type=args_.at_least(1), default=3000, help="timed calls per size")
    parser.add_argument("--validate", action="store_true", help="cross-rank validation on")
    parser.add_argument("--traffic", action="store_true", help="every call inside a dt.traffic() record")
    a = parser.parse_args(argv)
    world = resolve_world(a.world, 2)
    parser.check_memory(f"--sizes {max(a.sizes):,} B", max(a.sizes), args_.ranks_on_this_host(world),
                        "a buffer of that size")
    timings = world * a.calls * len(a.sizes)  # every call's wall time, every size, kept and gathered
    parser.check_memory(f"--calls {a.calls:,}", timings * args_.SAMPLE_BYTES, 1,
                        f"{timings:,} timings gathered from {world} ranks")
    before = os.getloadavg()[0]
    per_rank = launch(per_call, world, a.sizes, a.calls, a.validate, a.traffic)
    figures = per_rank[0]
    counted = ", inside dt.traffic()" if a.traffic else ""
    print(f"# dt.all_reduce per call, rank 0, world {world}, float32 sum, auto, validation "
          f"{'on' if a.validate else 'off'}{counted}; medians of {a.calls} calls; load average "
          f"{before:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"# {'size (B)':>10} {'python calls':>12} {'C calls':>8} {'dt files':>8} {'cpu (us)':>9} "
          f"{'wall (us)':>9} {'slowest (us)':>12}")
    for nbytes, f in figures.items():
        print(f"  {nbytes:>10} {f['python']:>12} {f['c']:>8} {f['files']:>8} {f['cpu_us']:>9.1f} "
              f"{f['wall_us']:>9.1f} {slowest_us(per_rank, nbytes):>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
