"""The ranks' side of `dt bench collectives`: one size at a time, measured, gathered, printed.

Every rank builds the buffers of a size (dt/bench/harness.py), times the
calls interleaved, then checks each timed call as nccl-tests does: the inputs
put back, one more call, its result against the value the inputs imply
(#wrong, per mode), and sends its figures to rank 0 (dt.gather_object). Rank 0
turns them into that size's rows (a call's time is its slowest rank's) and
prints them at once, as nccl-tests does: a run stopped after three sizes of
four has printed three. With several reduction ops (-o all) the sweep runs
once per op, in nccl-tests' order.
"""

from __future__ import annotations

import contextlib
import glob
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import dt
from dt import cost, transport
from dt.bench.collectives_table import print_size_rows
from dt.bench.harness import ROOTED, TORCH, BenchCase, group_wires, registry_name, time_calls, wire_group
from dt.collectives import auto
from dt.collectives.registry import needs_shared_memory

__all__ = ["DTYPES", "REDUCING", "REDUCTIONS", "collective_worker", "reductions", "row_names", "size_rows",
           "sweep_sizes", "wire_algorithms"]

DTYPES = {"float": torch.float32, "float32": torch.float32, "double": torch.float64,
          "float64": torch.float64, "half": torch.float16, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32,
          "int": torch.int32, "int64": torch.int64}
REDUCING = ("all_reduce", "reduce", "reduce_scatter")  # the rows that name a redop
REDUCTIONS = ("sum", "prod", "max", "min", "avg")  # nccl-tests' -o names, in its order for -o all


def reductions(op: str, collective: str, dtype: str) -> list[str]:
    """The ReduceOp names a sweep runs: -o's one, or every one for `all` (avg only on a floating
    dtype, as torch allows it); a collective that reduces nothing runs once."""
    names = [op] if op != "all" else [o for o in REDUCTIONS if o != "avg" or DTYPES[dtype].is_floating_point]
    if collective not in REDUCING:
        names = names[:1]
    return ["PRODUCT" if o == "prod" else o.upper() for o in names]


def sweep_sizes(lo: int, hi: int, factor: float) -> list[int]:
    """nccl-tests' sweep lo, lo*f, lo*f^2, ... up to hi, and hi itself: -e is always measured.

    With consistent units the steps land on hi (1K * 4^7 = 16M); with mixed ones
    (1KB = 1000 B, 16MB = 16,000,000 B) the last step falls short, and hi follows it.
    """
    if lo <= 0 and hi > 0:
        raise ValueError(f"the sweep starts at {lo} B and multiplies it by {factor:g}: start at 1 B or more")
    out, s = [], float(lo)
    while int(s) <= hi:
        out.append(int(s))
        if factor <= 1 or lo == hi:
            break
        s *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def _redop(op: str) -> str:
    """A ReduceOp's name as nccl-tests prints it: sum, prod, max, min, avg."""
    return "prod" if op == "PRODUCT" else op.lower()


def wire_algorithms(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """(algorithm, wire) pairs timed: load/store algorithms only on the shm wire."""
    coll = registry_name(cfg["collective"])
    return [(a, w) for w in cfg["transports"] for a in cfg["algorithms"]
            if w == "shm" or a == "auto" or not needs_shared_memory(coll, a)]


def row_names(cfg: dict[str, Any]) -> list[str]:
    """The rows of a sweep: each dt algorithm (per wire when both), torch's, DeepSpeed's."""
    both = len(cfg["transports"]) > 1
    names = [f"{a}@{w}" if both else a for a, w in wire_algorithms(cfg)]
    return names + [TORCH] + (["deepspeed"] if cfg.get("deepspeed") else [])


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
    for path in glob.glob(f"/dev/shm/deepspeed_*_127.0.0.1_{token}_*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def _deepspeed_call(op: Any, case: BenchCase, inplace: bool) -> Any:
    x, y = case.input, case.output

    def run() -> None:
        if not inplace:
            y.copy_(x)
        op(y)
    return run


def _measure(cfg: dict[str, Any], nbytes: int, wires: dict[str, Any], ds: Any) -> dict[str, Any]:
    """This rank's figures for one size: samples and #wrong per (row, mode), auto's picks."""
    p, r = dist.get_world_size(), dist.get_rank()
    dtype = DTYPES[cfg["dtype"]]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    shared = wires.get("shm") if cfg.get("shared") else None
    case = BenchCase(cfg["collective"], max(1, nbytes // itemsize), dtype, cfg["op"], p, r, shared=shared,
                root=cfg.get("root", 0))
    mine: dict[str, Any] = {"times": {}, "wrong": {}, "picked": {}, "count": case.count}
    calls = {}
    for a, w in wire_algorithms(cfg) + [(TORCH, None)] + ([("deepspeed", None)] if ds else []):
        name = a if len(cfg["transports"]) == 1 or w is None else f"{a}@{w}"
        if a == "auto":
            mine["picked"][name] = auto.choose(registry_name(cfg["collective"]), "auto", case.nbytes,
                                               transport.resolve_group(wires[w]))
        for inplace in (False, True) if not cfg.get("in_place_only") else (True,):
            fn = (_deepspeed_call(ds, case, inplace) if a == "deepspeed"
                  else case.call(a, inplace, group=wires.get(w)))
            if fn is None:
                continue
            calls[(name, inplace)] = fn
    case.reset()
    mine["times"] = time_calls(calls, cfg["iters"], cfg["warmup"], reset=case.reset if ds else None)
    if cfg["check"]:  # each timed call once more on fresh inputs, its result against the expected
        for (name, inplace), fn in calls.items():
            case.prepare_check(inplace)
            fn()
            mine["wrong"][(name, inplace)] = case.wrong(inplace)
    mine["memcpy"] = memcpy_seconds(case.nbytes)
    return mine


def _stats(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    med = statistics.median(samples)
    return {"median": med, "p25": q[0], "p75": q[2], "min": min(samples), "max": max(samples),
            "spread": (q[2] - q[0]) / med if med else 0.0}


def size_rows(cfg: dict[str, Any], per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One size's rows from every rank's figures: a call ends when its slowest rank does."""
    coll, p = cfg["collective"], len(per_rank)
    count = per_rank[0]["count"]
    size = count * torch.empty(0, dtype=DTYPES[cfg["dtype"]]).element_size()
    memcpy = max(rk["memcpy"] for rk in per_rank)
    rows = []
    for name in row_names(cfg):
        row: dict[str, Any] = {"size": size, "count": count, "type": cfg["dtype"],
                               "redop": _redop(cfg["op"]) if coll in REDUCING else "none",
                               "root": cfg.get("root", 0) if coll in ROOTED else -1, "algorithm": name,
                               "wrong": 0 if cfg["check"] else None}
        if size:
            row["memcpy_gbps"] = size / memcpy / 1e9
        if name in per_rank[0]["picked"]:
            row["picked"] = per_rank[0]["picked"][name]
        for inplace in (False, True):
            key = (name, inplace)
            if key not in per_rank[0]["times"]:
                continue
            slowest = [max(samples) for samples in zip(*(rk["times"][key] for rk in per_rank))]
            algbw, busbw = cost.bus_bandwidth(coll, size, statistics.median(slowest), p)
            wrong = sum(rk["wrong"][key] for rk in per_rank) if cfg["check"] else None
            row["in" if inplace else "out"] = {**_stats(slowest), "samples": slowest, "wrong": wrong,
                                               "algbw": algbw / 1e9, "busbw": busbw / 1e9}
            if wrong is not None:
                row["wrong"] += wrong
        rows.append(row)
    ref = next(x for x in rows if x["algorithm"] == TORCH)
    for row in rows:
        mode = "in" if "in" in row else "out"
        # Median of per-call ratios: call i of each algorithm ran next to torch's
        # call i, under the same load, which a shared machine needs.
        row["vs_torch"] = statistics.median(a / b if b else float("nan") for a, b in
                                            zip(row[mode]["samples"], ref[mode]["samples"]))
        row["vs_torch_of_medians"] = row[mode]["median"] / ref[mode]["median"]
    return rows


def collective_worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every size of the sweep on this rank; rank 0 prints each size's rows as it is done.

    Returns {"rows": every size's rows (rank 0; none on the others), "wires":
    per --transport group, the wires this rank's peers were connected over}.
    """
    p, r = dist.get_world_size(), dist.get_rank()
    transport.set_validation(False)
    wires = {w: wire_group(w) for w in cfg["transports"]}
    ds = deepspeed_all_reduce(p, r, cfg["token"]) if cfg.get("deepspeed") else None
    sizes, rows = cfg["sizes"], []
    ops = cfg.get("ops", [cfg["op"]])
    runs = [(op, nbytes) for op in ops for nbytes in sizes]
    for i, (op, nbytes) in enumerate(runs):
        if r == 0 and cfg["progress"]:
            print(f"[{i + 1}/{len(runs)}] {nbytes:,} B{f' {op.lower()}' if len(ops) > 1 else ''} ...",
                  file=sys.stderr, flush=True)
        this = {**cfg, "op": op}
        mine = _measure(this, nbytes, wires, ds)
        gathered: list[Any] | None = [None] * p if r == 0 else None
        dt.gather_object(mine, gathered, dst=0)
        if gathered is not None:
            here = size_rows(this, gathered)
            rows += here
            if cfg.get("stream", True):
                print_size_rows(here, sys.stdout, first=i == 0)
    return {"rows": rows, "wires": {name: group_wires(g) for name, g in wires.items()}}
