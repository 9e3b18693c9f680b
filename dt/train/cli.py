"""`dt train`: train the small GPT on a dp x tp x pp mesh of local processes.

The command line (see the dt.train package docstring for what it runs):
parse_args checks the mesh, batch and schedule fit together before any
process starts; main launches dp*tp*pp ranks (dt.launcher.launch) on
train_worker (loop.py) and rank 0 prints `report`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dt.launcher import launch
from dt.parallel.pipeline import bubble_fraction
from dt.train.loop import train_worker

__all__ = ["main", "parse_args", "report"]

_USAGE = """examples:
    dt train --dp 2 --tp 2 --pp 2 --steps 100
    dt train --pp 4 --micro-batches 8 --schedule gpipe --checkpoint ckpt.pt   # resumes if it exists
    dt train --pp 2 --schedule interleaved --virtual 2                       # 2 chunks per stage
    torchrun --nproc-per-node 8 -m dt.train --dp 2 --tp 2 --pp 2 --threads 1 # same code, torchrun
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dt train", description=__doc__.split("\n\n")[0],
                                epilog=_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=int, default=1, help="data-parallel size")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (sequences)")
    p.add_argument("--block-size", type=int, default=32, help="sequence length")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="per pipeline step (default: 2 * pp, capped at the per-rank batch)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b")
    p.add_argument("--virtual", type=int, default=1,
                   help="model chunks per pipeline stage (with --schedule interleaved)")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--untied", action="store_true", help="separate output projection")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--checkpoint", default=None, metavar="PATH", help="save here; resume if it exists")
    p.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--validate", action="store_true",
                   help="keep dt's cross-rank argument check on (off by default: it costs a "
                        "small all-gather per collective)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per process (default: the launcher's cores // processes; "
                        "on a busy machine 1 avoids OpenMP threads spinning against each other)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    per_rank = args.batch_size // args.dp
    if args.batch_size % args.dp or per_rank < 1:
        p.error(f"--batch-size {args.batch_size} must be a positive multiple of --dp {args.dp}")
    if args.micro_batches is None:
        args.micro_batches = min(2 * args.pp, per_rank)
    if not 1 <= args.micro_batches <= per_rank:
        p.error(f"--micro-batches must be between 1 and the per-rank batch {per_rank}")
    if args.virtual > 1 and args.schedule != "interleaved":
        p.error("--virtual > 1 needs --schedule interleaved")
    if args.n_layer + 2 < args.pp * args.virtual:
        p.error(f"{args.n_layer} blocks + embedding + head cannot fill {args.pp} stages "
                f"x {args.virtual} chunks")
    if args.n_head % args.tp:
        p.error(f"--n-head {args.n_head} must be divisible by --tp {args.tp}")
    return args


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    r0 = results[0]
    if not r0["losses"]:
        return f"nothing to do: the checkpoint is already at step {r0['start']}"
    chunks = f" x {args.virtual} chunks" if args.virtual > 1 else ""
    lines = [f"mesh dp={args.dp} tp={args.tp} pp={args.pp} ({args.dp * args.tp * args.pp} processes), "
             f"{args.schedule}{chunks}, {args.micro_batches} micro-batches, global batch "
             f"{args.batch_size} x {args.block_size} tokens",
             f"steps {r0['start']}..{r0['start'] + len(r0['losses'])}: loss "
             f"{r0['losses'][0]:.4f} -> {r0['losses'][-1]:.4f}",
             f"throughput {r0['tokens_per_s']:.0f} tokens/s ({r0['wall_s']:.2f} s)",
             f"time split, mean over {len(results)} rank(s) (share of the training loop's wall time):"]
    for key in ("compute", "communication", "bubble"):
        mean = sum(r["times"][key] for r in results) / len(results)
        lines.append(f"  {key:<14} {mean:7.2f} s  {100 * mean / r0['wall_s']:5.1f}%")
    per_step = {k: sum(r["bytes_sent"][k] for r in results) / len(results) / r0["steps"]
                for k in r0["bytes_sent"]}
    lines.append(f"bytes sent per rank per step (mean over {len(results)} rank(s)): " + ", ".join(
        f"{k} {v / 1e3:.1f} kB" for k, v in per_step.items()))
    if args.pp > 1:
        per_stage = []
        for s in range(args.pp):
            mine = [r["times"]["bubble"] / r["wall_s"] for r in results if r["coords"][2] == s]
            per_stage.append(f"{100 * sum(mine) / len(mine):.0f}%" if mine else "?")
        lines.append(f"pipeline bubble (idle / loop time) by stage: {', '.join(per_stage)}; "
                     f"(p-1)/(v*m+p-1) = "
                     f"{100 * bubble_fraction(args.pp, args.micro_batches, args.virtual):.1f}%; "
                     f"peak stashed (chunk, micro-batch) activations on stage 0: {r0['peak_stash']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    world = args.dp * args.tp * args.pp
    results = launch(train_worker, world, args)
    if results and results[0]["rank"] == 0:
        print(report(args, results))
    return 0
