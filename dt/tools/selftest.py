"""`dt selftest`: does dt run right on this machine's devices? A smoke test of every layer.

    dt selftest --gpu                 # one process per GPU, NCCL (1-8 GPUs, under 5 minutes)
    torchrun --nproc-per-node 8 -m dt selftest --gpu   # the same, launched by torchrun
    dt selftest --cpu --world 2       # the same checks on gloo (CI runs this)

Each check is compared with torch's own result on the same backend:

1. every collective (barrier, gather and scatter too, list forms and tensor
   forms: dt/tools/selftest_collectives.py) x every dt algorithm x {float32,
   bfloat16, int64, bool} x {0, 1, 7, 1 MiB + 3} elements (smaller sizes with
   --quick), validation on and off, against torch's collective;
2. an asynchronous all-reduce issued on a side stream and read on another
   (the communication thread's stream ordering);
3. dt's DDP against torch's DDP, and ZeRO 1-3 against one process, 3 steps each;
4. a 2-stage pipeline with 16 MiB activations, GPipe and 1F1B, against the
   unpipelined model;
5. ring all-reduce at 4 KiB and 64 MiB against dist.all_reduce, timed with
   CUDA events on a GPU (dt.device.Stopwatch).

Prints one line per check and a summary; exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist

from dt import args as args_
from dt.tools.selftest_collectives import check_collectives, rank_device

SIZES = (0, 1, 7, (1 << 20) + 3)
QUICK_SIZES = (0, 1, 7, 1003)


def check_async_streams() -> list[tuple[str, bool, str]]:
    """Check 2: an async all-reduce issued on one stream, its result read on another."""
    import dt

    r, device = dist.get_rank(), rank_device()
    x_ref = torch.arange(1 << 16, dtype=torch.float32, device=device) * (r + 1)
    want = x_ref.clone()
    dist.all_reduce(want)
    if device.type == "cuda":
        side, reader = torch.cuda.Stream(device), torch.cuda.Stream(device)
        with torch.cuda.stream(side):
            x = x_ref * 1.0  # written on the side stream
            work = dt.all_reduce(x, async_op=True)
        with torch.cuda.stream(reader):
            work.wait()  # orders the reader stream after the collective
            got = x.clone()
        torch.cuda.synchronize(device)
    else:
        x = x_ref.clone()
        dt.all_reduce(x, async_op=True).wait()
        got = x
    ok = torch.equal(got, want)
    return [("async all_reduce across streams", ok, "" if ok else "result differs from torch")]


def check_timing(sizes_bytes: tuple[int, ...] = (4 << 10, 64 << 20),
                 reps: int = 10) -> list[tuple[str, bool, str]]:
    """Check 5: ring all-reduce against dist.all_reduce, both timed on the device (CUDA events)."""
    import dt
    from dt.device import Stopwatch

    device = rank_device()
    out = []
    dt.set_validation(False)
    for nbytes in sizes_bytes:
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        times: dict[str, list[float]] = {"dt ring": [], "torch": []}
        for rep in range(reps + 1):
            for name in (("dt ring", "torch") if rep % 2 else ("torch", "dt ring")):
                dist.barrier()
                sw = Stopwatch(device).start()
                if name == "torch":
                    dist.all_reduce(x)
                else:
                    dt.all_reduce(x, algorithm="ring")
                sw.stop()
                if rep:
                    times[name].append(sw.seconds())
                x.fill_(1.0)
        med = {k: statistics.median(v) for k, v in times.items()}
        out.append((f"ring all_reduce {nbytes:,} B: dt {med['dt ring'] * 1e3:.3f} ms, "
                    f"torch {med['torch'] * 1e3:.3f} ms, ratio {med['dt ring'] / med['torch']:.2f}",
                    True, ""))
    dt.set_validation(True)
    return out


def _model(device: torch.device, width: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                               torch.nn.Linear(width, width)).to(device)


def _batch(device: torch.device, n: int, width: int = 64, seed: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, width, generator=g).to(device), torch.randn(n, width, generator=g).to(device))


def check_training(steps: int = 3) -> list[tuple[str, bool, str]]:
    """Check 3: dt's DDP against torch's DDP; ZeRO 1, 2 and FSDP against one process; `steps` steps."""
    from dt.parallel.data_parallel import DistributedDataParallel
    from dt.parallel.zero import FullyShardedDataParallel, ZeroOptimizer

    p, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    x, y = _batch(device, 4 * p)
    mine = slice(4 * r, 4 * r + 4)

    def train(kind: str) -> list[float]:
        model = _model(device)
        if kind == "one process":  # the whole batch, no communication: the reference
            net, opt = model, torch.optim.Adam(model.parameters(), lr=1e-2)
            xs, ys = x, y
        else:
            xs, ys = x[mine], y[mine]
            if kind == "torch DDP":
                net = torch.nn.parallel.DistributedDataParallel(model)
                opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            elif kind == "dt DDP":
                net = DistributedDataParallel(model)
                opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            elif kind == "dt FSDP":
                net = FullyShardedDataParallel(model)
                opt = torch.optim.Adam(net.parameters(), lr=1e-2)
            else:
                net = model
                opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, stage=int(kind[-1]), lr=1e-2)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(xs), ys).backward()
            opt.step()
        state = net.state_dict() if kind == "dt FSDP" else model.state_dict()
        return [float(v.double().sum()) for v in state.values()]

    ref = train("one process")
    out = []
    for kind in ("torch DDP", "dt DDP", "dt ZeRO-1", "dt ZeRO-2", "dt FSDP"):
        got = train(kind)
        ok = len(got) == len(ref) and all(abs(a - b) <= 1e-4 * (1 + abs(b)) for a, b in zip(got, ref))
        out.append((f"{kind}: {steps} steps vs one process", ok,
                    "" if ok else f"parameter sums {got[:3]}... vs {ref[:3]}..."))
    return out


def check_pipeline(activation_bytes: int = 16 << 20) -> list[tuple[str, bool, str]]:
    """Check 4: a 2-stage pipeline (the first two ranks) with big activations, GPipe and 1F1B,
    against the same layers run whole on one rank."""
    from dt.parallel.pipeline import Pipeline, header_groups, stage_module

    p, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    if p < 2:
        return [("2-stage pipeline", True, "skipped: needs 2 ranks")]
    width = 256
    rows = max(4, activation_bytes // (4 * width))
    group = dist.new_group([0, 1])  # every rank creates the groups; ranks 0 and 1 use them
    headers = header_groups([(0, 1)])
    if r > 1:
        return []
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width).to(device) for _ in range(4)]
    whole = copy.deepcopy(torch.nn.Sequential(*layers))
    x, y = _batch(device, rows, width)
    torch.nn.functional.mse_loss(whole(x), y).backward()
    want = [q.grad for q in whole.parameters()][4 * r:4 * r + 4]
    out = []
    for sched in ("gpipe", "1f1b"):
        stage = stage_module(layers, group)
        stage.zero_grad()
        pipe = Pipeline(stage, group, header_groups=headers)
        pipe.train_step(x if r == 0 else None, y if r == 1 else None, torch.nn.functional.mse_loss,
                        micro_batches=4, schedule_name=sched)
        got = [q.grad for q in stage.parameters()]
        ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want))
        out.append((f"2-stage pipeline, {sched}, {rows * width * 4 >> 20} MiB activations", ok,
                    "" if ok else "gradients differ from the unpipelined model"))
    return out


CHECKS: dict[str, Callable[[argparse.Namespace], list[tuple[str, bool, str]]]] = {
    "collectives": lambda a: check_collectives(QUICK_SIZES if a.quick else SIZES),
    "async": lambda a: check_async_streams(),
    "training": lambda a: check_training(),
    "pipeline": lambda a: check_pipeline(1 << 20 if a.quick else 16 << 20),
    "timing": lambda a: check_timing(reps=3 if a.quick else 10),
}


def _worker(args: argparse.Namespace) -> list[tuple[str, bool, str]]:
    results = []
    for name in args.checks:
        t0 = time.perf_counter()
        try:
            rows = CHECKS[name](args)
        except Exception:  # noqa: BLE001 - one failed check must not hide the others
            rows = [(name, False, traceback.format_exc().strip().splitlines()[-1])]
        results += [(f"{label} ({time.perf_counter() - t0:.1f} s)" if i == len(rows) - 1 else label, ok, why)
                    for i, (label, ok, why) in enumerate(rows)]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt selftest", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true", help="NCCL, one process per GPU")
    where.add_argument("--cpu", action="store_true", help="gloo on the CPU (default without a GPU)")
    parser.add_argument("--world", type=args_.world, default=None,
                        help="processes (default: the GPUs with --gpu, else 2)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument("--checks", type=args_.listed(str), default=",".join(CHECKS),
                        help=f"comma-separated subset of {','.join(CHECKS)}")
    args = parser.parse_args(argv)
    args.checks = list(args.checks)
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        parser.error(f"--checks: unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    from dt.launcher import launch

    backend = "nccl" if args.gpu else "gloo"
    if args.gpu and not torch.cuda.is_available():
        parser.error("--gpu: torch sees no GPU here")
    world = args.world or (torch.cuda.device_count() if args.gpu else 2)
    device = torch.cuda.get_device_name(0) if args.gpu else "cpu"
    print(f"dt selftest on {world} rank(s), backend {backend}, device {device}, torch {torch.__version__}",
          flush=True)
    results = launch(_worker, world, args, backend=backend, timeout=1200)[0]
    failed = 0
    for label, ok, why in results:
        failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {label}" + (f": {why}" if why else ""))
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0
