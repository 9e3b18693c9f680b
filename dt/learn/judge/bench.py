"""`dt judge --bench`: the learner's collective, dt's algorithm and torch's, timed side by side.

At each size, on one world of the judge's processes, the three run the same
float32 SUM case, interleaved call by call (the order rotated every round,
so all three share whatever else the machine is doing), each call preceded
by torch's barrier and its inputs restored first. A call's time is its
slowest rank's; the median over the rounds is reported with busbw
(dt.cost.bus_bandwidth). The learner's runs are still watched: a deadlock
ends the benchmark with the judge's timeout, not a hang. On a shared
machine only the ratios between the columns of one run mean anything.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dt import cost, transport
from dt.learn.judge import instrument
from dt.learn.judge.cases import JudgeCase
from dt.learn.judge.compare import first_difference
from dt.learn.judge.runner import Runner
from dt.learn.judge.specs import SPECS, GroupView
from dt.learn.judge.worker import call_learner, load

__all__ = ["DEFAULT_SIZES", "BenchJob", "bench", "bench_worker"]

DEFAULT_SIZES = (4_000, 256_000, 4_000_000)  # bytes: 4 KB, 256 KB, 4 MB


@dataclass(frozen=True)
class BenchJob:
    spec: str
    path: str
    function: str
    algorithm: str
    sizes: tuple[int, ...]  # bytes
    reps: int
    timeout: float


def _restore(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (list, tuple)):
        for d, s in zip(dst, src):
            _restore(d, s)


def bench_worker(job: BenchJob) -> dict[str, Any]:
    fn, problem = load(job.path, job.function)
    if fn is None:
        raise RuntimeError(problem)
    transport.set_validation(False)  # dt's algorithm without its argument check, as torch runs
    transport.set_transport("torch")  # as instrument.install said: the worker's reset made it auto
    spec = SPECS[job.spec]
    p, r = dist.get_world_size(), dist.get_rank()
    g = GroupView(None, tuple(range(p)), r)
    barrier = instrument.original("barrier")
    out: dict[str, Any] = {"sizes": []}
    for nbytes in job.sizes:
        args, op = spec.make(JudgeCase("bench", max(1, nbytes // 4)), g)
        pristine = copy.deepcopy(args)

        def yours(args: list[Any] = args, op: Any = op) -> None:
            with instrument.watching(learner_file=job.path, what=job.function, timeout=job.timeout,
                                     allow_dt=spec.allow_dt):
                call_learner(fn, args, op, None)

        calls = {"yours": yours,
                 f"dt {job.algorithm}": lambda args=args, op=op: spec.dt_call(args, op, g, job.algorithm),
                 "torch": lambda args=args, op=op: spec.torch_call(args, op, g)}
        reference = copy.deepcopy(args)
        spec.torch_call(reference, op, g)
        yours()
        wrong = first_difference(spec.outputs(args), [t for _, t in spec.outputs(reference)])
        times: dict[str, list[float]] = {who: [] for who in calls}
        order = list(calls)
        for rep in range(-1, job.reps):  # round -1 warms up
            for who in order[rep % 3:] + order[:rep % 3]:
                _restore(args, pristine)
                barrier()
                t0 = time.perf_counter()
                calls[who]()
                if rep >= 0:
                    times[who].append(time.perf_counter() - t0)
        out["sizes"].append({"bytes": spec.payload(args, p), "times": times, "wrong": wrong})
    return out


def bench(runner: Runner, collective: str, path: str, function: str, algorithm: str, world: int,
          sizes: tuple[int, ...] = DEFAULT_SIZES, reps: int = 10) -> dict[str, Any]:
    """Time the three at each size; {"rows": [{"bytes", who: {"seconds", "busbw", "spread"}}], ...}."""
    spec = SPECS[collective]
    job = BenchJob(collective, path, function, algorithm, tuple(sizes), reps, runner.timeout)
    results, failure = runner.run(world, bench_worker, job, limit=600.0)
    head = {"collective": collective, "world": world, "reps": reps}
    if failure is not None:
        runner.restart(world)
        return {**head, "error": str(failure).splitlines()[0]}
    who = list(results[0]["sizes"][0]["times"]) if results[0]["sizes"] else []
    rows = []
    for i, size in enumerate(results[0]["sizes"]):
        wrong = any(res["sizes"][i]["wrong"] for res in results)
        row: dict[str, Any] = {"bytes": size["bytes"], "wrong": wrong}
        for w in who:
            # A call takes as long as its slowest rank.
            calls = [max(res["sizes"][i]["times"][w][k] for res in results) for k in range(reps)]
            median = statistics.median(calls)
            q = statistics.quantiles(calls, n=4) if len(calls) > 1 else [median, median, median]
            busbw = cost.bus_bandwidth(spec.busbw, size["bytes"], median, world)[1]
            row[w] = {"seconds": median, "busbw": busbw, "spread": (q[2] - q[0]) / median if median else 0.0}
        rows.append(row)
    return {**head, "who": who, "rows": rows}
