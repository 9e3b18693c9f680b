"""`dt train`: train the small GPT on a dp x cp x ep x tp x pp mesh of local processes.

The command line (see the dt.train package docstring for what it runs):
parse_args checks the mesh, batch and schedule fit together before any
process starts; main launches dp*cp*tp*pp ranks (dt.launcher.launch) on
train_worker (loop.py) and rank 0 prints `report`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from dt import args as args_
from dt import record
from dt.device import DEVICES, backend_for
from dt.launcher import WorkerError, launch, launched_rank
from dt.parallel.checkpoint import CheckpointError, check_directory
from dt.parallel.pipeline import bubble_fraction
from dt.parallel.recompute import RECOMPUTE
from dt.train.dataset import prepare_data
from dt.train.diverged import Diverged
from dt.train.fits import why_it_cannot_fit
from dt.train.layouts import layout_error, world
from dt.train.loop import train_worker
from dt.train.metrics import curve_records, mfu, plot_loss, read_metrics
from dt.train.options import add_trainer_options, settle_trainer_options
from dt.train.peak import format_mfu, job_peak_flops
from dt.train.precision import autocast_dtype
from dt.train.resume import adopt_checkpoint_model
from dt.train.threads import default_threads
from dt.units import fmt_optional, plural

__all__ = ["headline", "main", "make_parser", "parse_args", "report"]

_USAGE = """examples:
    dt train --dp 2 --tp 2 --pp 2 --steps 100
    dt train --pp 4 --micro-batches 8 --schedule gpipe --checkpoint ckpt      # resumes if it holds one
    dt train --steps 200 --checkpoint ckpt      # resumes: the model's options read from the checkpoint
    dt train --data corpus/ --eval-every 50     # every text file in corpus/, validated every 50 steps
    dt train --pp 2 --schedule interleaved --virtual 2                       # 2 chunks per stage
    torchrun --nproc-per-node 8 -m dt.train --dp 2 --tp 2 --pp 2 --threads 1 # same code, torchrun
    dt train --dp 2 --cp 2 --ep 2 --tp 2 --experts 4 --top-k 2          # context + expert parallel
    dt train --cp 4 --long-context --cp-attention ulysses                  # 1024-token sequences
    dt train --tp 2 --sequence-parallel --recompute selective             # Korthikanti et al. 2022
    dt train --dp 2 --zero 3 --no-prefetch                                # FSDP, each gather blocking
"""

LONG_CONTEXT = {"block_size": 1024, "batch_size": 4}  # --long-context's defaults
# A worker's error said in one line, and the exit status: 2 for what the input got wrong,
# 1 for a run that diverged (a loss or weights NaN or infinite: dt.train.diverged).
_ONE_LINE_ERRORS = {"CheckpointError": 2, Diverged.__name__: 1}


def make_parser() -> args_.Parser:
    """dt train's options, each with its help and default."""
    p = args_.Parser(prog="dt train", description=__doc__.split("\n\n")[0], epilog=_USAGE,
                     formatter_class=args_.HelpFormatter)
    one = args_.at_least(1)
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    p.add_argument("--dp", type=args_.ranks, default=1, help="data-parallel size")
    p.add_argument("--tp", type=args_.ranks, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=args_.ranks, default=1, help="pipeline stages")
    p.add_argument("--cp", type=args_.ranks, default=1,
                   help="context-parallel size (each sequence split over cp ranks)")
    p.add_argument("--ep", type=args_.ranks, default=1,
                   help="expert-parallel size: experts spread over ep ranks of the dp x cp plane")
    p.add_argument("--layout", choices=["tp-inside", "tp-across"], default="tp-inside",
                   help="across hosts: tp groups inside a host (default) or spread over hosts")
    p.add_argument("--cp-attention", choices=["ring", "ulysses"], default="ring",
                   help="how attention crosses the cp ranks")
    p.add_argument("--experts", type=args_.at_least(0), default=0,
                   help="experts per MoE block (0: dense MLP)")
    p.add_argument("--top-k", type=one, default=1, help="experts per token (1: Switch, 2: GShard)")
    p.add_argument("--capacity-factor", type=args_.positive, default=None,
                   help="expert capacity = factor * top_k * tokens / experts per sequence "
                        "(default: no drops)")
    p.add_argument("--aux-loss-coef", type=args_.finite, default=0.01, help="weight of the balance loss")
    p.add_argument("--long-context", action="store_true",
                   help=f"sequences of {LONG_CONTEXT['block_size']} tokens, global batch "
                        f"{LONG_CONTEXT['batch_size']} (unless given): a setting for --cp")
    p.add_argument("--steps", type=one, default=50, help="the step the run ends at (a resumed run: in all)")
    p.add_argument("--batch-size", type=one, default=None, help="global batch (sequences; default 16)")
    p.add_argument("--block-size", type=one, default=None, help="sequence length (default 32)")
    p.add_argument("--micro-batches", type=one, default=None,
                   help="per pipeline step (default: 2 * pp, capped at the per-rank batch)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b",
                   help="the pipeline's order of micro-batch forwards and backwards (with --pp > 1)")
    p.add_argument("--virtual", type=one, default=1,
                   help="model chunks per pipeline stage (with --schedule interleaved)")
    p.add_argument("--n-layer", type=one, default=4, help="transformer blocks")
    p.add_argument("--n-head", type=one, default=4, help="attention heads per block")
    p.add_argument("--n-embd", type=one, default=64, help="the model's width (a multiple of --n-head)")
    p.add_argument("--untied", action="store_true", help="separate output projection")
    p.add_argument("--model", choices=["gpt", "llama"], default="gpt",
                   help="the plain model to train (dt.models.gpt, dt.models.llama)")
    p.add_argument("--n-kv-head", type=one, default=None,
                   help="Llama's key/value heads (grouped-query attention; default --n-head)")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0,
                   help="gradient sync over the data-parallel group: 0 overlapped DDP, 1 ZeRO (Adam's "
                        "state sharded), 2 ZeRO (gradients too), 3 FSDP (parameters too; one stage)")
    p.add_argument("--recompute", nargs="?", choices=RECOMPUTE, const="full", default="none",
                   help="activations recomputed in backward (the same losses, less memory): full, every "
                        "block's (what --recompute alone means); selective, only the attention core's "
                        "(softmax(q k^T) v, Korthikanti et al. 2022); none (default)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp > 1: the norms and the residual stream on block/tp tokens per rank "
                        "(Megatron's sequence parallelism; not with --experts)")
    p.add_argument("--no-prefetch", action="store_true",
                   help="with --zero 3: gather each FSDP unit only when it runs (default: the next unit's "
                        "all-gather is issued behind the current unit's forward and backward)")
    p.add_argument("--clip", type=args_.positive, default=None,
                   help="clip gradients to this global norm (over every axis; default: no clipping)")
    p.add_argument("--lr", type=args_.positive, default=3e-3,
                   help="Adam's learning rate (the peak, with --warmup and --lr-min)")
    p.add_argument("--seed", type=args_.at_least(0), default=0,
                   help="the model's initial weights and the batches drawn")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="the weights' dtype (and the activations', unless --precision narrows them)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="checkpoint directory: save into it; resume from its newest good checkpoint, "
                        "on any mesh, the model options left out read from it (default: none saved)")
    p.add_argument("--save-every", type=args_.at_least(0), default=0,
                   help="also checkpoint every N steps")
    p.add_argument("--keep", type=args_.at_least(1), default=3,
                   help="checkpoints kept in DIR (the newest; older ones are the fallback if it is corrupt)")
    p.add_argument("--validate", action="store_true",
                   help="keep dt's cross-rank argument check on (off by default: it costs a "
                        "small all-gather per collective)")
    p.add_argument("--threads", type=args_.at_least(0), default=0,
                   help="torch threads per process (default: 1 while the model's products are small, "
                        "else cores // processes: dt/train/threads.py)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines on stderr")
    add_trainer_options(p)
    record.add_option(p)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, every one checked (dt.args) before any process starts: bad input is one
    line and exit status 2."""
    p = make_parser()
    args = p.parse_args(argv)
    args.model_from = adopt_checkpoint_model(p, args, argv)  # --checkpoint holding one: its model
    defaults = LONG_CONTEXT if args.long_context else {"block_size": 32, "batch_size": 16}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if world(args) > args_.MAX_WORLD:
        p.error(f"--dp x --cp x --tp x --pp = {world(args)} processes; at most {args_.MAX_WORLD}")
    try:  # the processes start here, unless torchrun started them already
        if not args_.launched_by_torchrun():
            args_.check_local_world(world(args), "processes (--dp x --cp x --tp x --pp)")
    except args_.InputError as exc:
        p.error(str(exc))
    per_rank = args.batch_size // args.dp
    if args.micro_batches is None:
        args.micro_batches = max(1, min(2 * args.pp, per_rank))
    if args.keep < 1 or args.save_every < 0:
        p.error(f"--keep must be at least 1 (got {args.keep}) and --save-every at least 0 "
                f"(got {args.save_every})")
    if args.aux_loss_coef < 0:
        p.error(f"--aux-loss-coef must be >= 0, got {args.aux_loss_coef}")
    if (error := layout_error(args)) is not None:  # the rule dt plan enumerates by
        p.error(error)
    problem = settle_trainer_options(args)
    if problem:
        p.error(problem)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if args_.launched_by_torchrun() else world(args)
    too_big = why_it_cannot_fit(args, ranks_here, on_gpu=backend_for(args.device) == "nccl")
    if too_big:
        p.error(too_big)
    p.check_memory(f"--steps {args.steps:,}", args.steps * args_.SAMPLE_BYTES, ranks_here,
                   "a loss kept per step")
    args.ranks_per_host = ranks_here
    args.threads = args.threads or default_threads(args, ranks_here, os.cpu_count() or 1)
    return args


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    r0 = results[0]
    if not r0["losses"]:
        return f"nothing to do: the checkpoint is already at step {r0['start']}"
    chunks = f" x {args.virtual} chunks" if args.virtual > 1 else ""
    lines = []
    if r0.get("resumed"):
        lay = r0["resumed"]["layout"]
        saved = " ".join(f"{k}={lay[k]}" for k in ("dp", "cp", "ep", "tp", "pp", "zero") if k in lay)
        lines.append(f"resumed from {r0['resumed']['path']} (step {r0['start']}, saved on {saved})")
    zero = f", ZeRO-{args.zero}" + (" (no prefetch)" if args.zero == 3 and args.no_prefetch else "") \
        if args.zero else ""
    zero += f", recompute {args.recompute}" if args.recompute != "none" else ""
    sp = " (sequence parallel)" if args.sequence_parallel else ""
    cp = f" cp={args.cp} ({args.cp_attention})" if args.cp > 1 else ""
    ep = f" ep={args.ep}" if args.experts else ""
    # A schedule and micro-batches mean something only with a pipeline to run them through.
    pipeline = f"{args.schedule}{chunks}, {args.micro_batches} micro-batches, " if args.pp > 1 else ""
    processes = plural(world(args), "process")
    lines += [f"mesh dp={args.dp}{cp}{ep} tp={args.tp}{sp} pp={args.pp}{zero} ({processes}), "
             f"{pipeline}global batch {args.batch_size} x {args.block_size} tokens",
             f"steps {r0['start']}..{r0['start'] + len(r0['losses'])}: loss "
             f"{r0['losses'][0]:.4f} -> {r0['losses'][-1]:.4f}",
             *[f"validation loss {v:.4f} at step {n}" for n, v in r0.get("val_losses", [])[-1:]],
             *_trainer_lines(args, r0),
             f"throughput {r0['tokens_per_s']:.0f} tokens/s ({r0['wall_s']:.2f} s)" + _mfu(args, r0)
             + _steady(args, r0),
             f"time split, mean over {len(results)} rank(s) (share of the training loop's wall time):"]
    for key in ("compute", "communication", "bubble"):
        mean = sum(r["times"][key] for r in results) / len(results)
        share = sum(r["times"][key] / r["wall_s"] for r in results if r["wall_s"] > 0) / len(results)
        lines.append(f"  {key:<14} {mean:7.2f} s  {100 * share:5.1f}%")
    per_step = {k: sum(r["bytes_sent"][k] for r in results) / len(results) / r0["steps"]
                for k in r0["bytes_sent"]}
    lines.append(f"bytes sent per rank per step (mean over {len(results)} rank(s)): " + ", ".join(
        f"{k} {v / 1e3:.1f} kB" for k, v in per_step.items()))
    if args.experts:
        routed = [r["moe"] for r in results if r["moe"] and r["coords"][1] == 0]  # tp replicas once
        assigned = sum(r["assignments"] for r in routed)
        dropped = sum(r["dropped"] for r in routed)
        capacity = fmt_optional(args.capacity_factor, "none (no drops)")
        lines.append(f"mixture of experts: {args.experts} experts, top-{args.top_k}, capacity factor "
                     f"{capacity}; {dropped} of {assigned} token assignments dropped "
                     f"({100 * dropped / max(assigned, 1):.2f}%, all steps, ranks and layers)")
    if r0.get("placement"):
        lines += placement_lines(args, r0["placement"], results)
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


def _trainer_lines(args: argparse.Namespace, r0: dict[str, Any]) -> list[str]:
    """The clip's last norm and float16's skipped steps, when they apply."""
    out = []
    if getattr(args, "clip", None) and r0.get("grad_norm") is not None:
        out.append(f"gradient norm at the last step {r0['grad_norm']:.4f} (clipped to {args.clip})")
    if r0.get("skipped"):
        out.append(f"{args.precision}: {r0['skipped']} step(s) skipped for an overflow (scale halved)")
    return out


def headline(args: argparse.Namespace, r0: dict[str, Any]) -> str:
    """The run in one line (its record's headline): the mesh, the loss, the throughput."""
    mesh = " ".join(f"{k}={getattr(args, k)}" for k in ("dp", "cp", "ep", "tp", "pp") if getattr(args, k) > 1)
    if not r0["losses"]:
        return f"{mesh or 'one process'}: nothing trained (the checkpoint is at step {r0['start']})"
    fpt, peak = r0.get("flops_per_token"), getattr(args, "peak_total", None)
    at_peak = f", MFU {100 * mfu(fpt, r0['tokens_per_s'], peak):.2f}%" if fpt and peak else ""
    return (f"{mesh or 'one process'} ({world(args)} processes), {args.n_layer} layers x {args.n_embd}: "
            f"loss {r0['losses'][0]:.4f} -> {r0['losses'][-1]:.4f} in {len(r0['losses'])} steps, "
            f"{r0['tokens_per_s']:.0f} tokens/s{at_peak}")


def _mfu(args: argparse.Namespace, r0: dict[str, Any], key: str = "tokens_per_s") -> str:
    """MFU beside the throughput, with what it divides by."""
    fpt, peak = r0.get("flops_per_token"), getattr(args, "peak_total", None)
    if not fpt or not peak:
        return ""
    if key != "tokens_per_s":
        return f", MFU {format_mfu(mfu(fpt, r0[key], peak))}"
    return (f", MFU {format_mfu(mfu(fpt, r0['tokens_per_s'], peak))} ({fpt / 1e6:.2f} MFLOP per token; "
            f"peak: {args.peak_source})")


def _steady(args: argparse.Namespace, r0: dict[str, Any]) -> str:
    """The rate after the first step, on its own line: what a longer run trains at."""
    if not r0.get("steady_tokens_per_s"):
        return ""
    return (f"\nafter the first step (warm-up: allocations, kernels chosen): "
            f"{r0['steady_tokens_per_s']:.0f} tokens/s" + _mfu(args, r0, "steady_tokens_per_s"))


def placement_lines(args: argparse.Namespace, pl: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """The two layouts' predicted tp + dp time per step, next to this run's measured communication."""
    pred = pl["predicted"]
    comm = max(r["times"]["communication"] for r in results) / results[0]["steps"]
    out = [f"across {pl['hosts']} hosts, this run {args.layout}: communication {comm * 1e3:.1f} ms per step "
           f"(slowest rank); two-level model ({pl['source']}) per step:"]
    for name, row in pred.items():
        label = name + (" (this run)" if name == args.layout else "")
        out.append(f"  {label:<22} tp {row['tp'] * 1e3:8.2f} ms"
                   f"  dp {row['dp'] * 1e3:8.2f} ms  total {row['total'] * 1e3:8.2f} ms")
    diff = pred["tp-across"]["total"] - pred["tp-inside"]["total"]
    out.append(f"  tp-across - tp-inside: {diff * 1e3:+.2f} ms per step predicted"
               + (f"\n  note: {pl['note']}" if pl["note"] else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    mesh = "-".join(f"{k}{getattr(args, k)}" for k in ("dp", "cp", "ep", "tp", "pp") if getattr(args, k) > 1)
    if (status := record.rerun("dt train", argv, args.record, "train", mesh or "one-rank")) is not None:
        return status
    on_gpu = backend_for(args.device) == "nccl"
    args.peak_total, args.peak_source = job_peak_flops(  # MFU's denominator, before the ranks load the host
        args.peak_flops, world(args), "cuda" if on_gpu else "cpu",
        torch.bfloat16 if args.precision == "float32" and on_gpu else autocast_dtype(args.precision),
        args.threads, args.ranks_per_host)
    try:  # --data: tokenized once, here, before any process starts (None: generated text)
        args.data_dir = prepare_data(args)
    except (ValueError, OSError) as e:  # unreadable, not UTF-8, too short for a validation split
        print(f"dt train: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.checkpoint:
            check_directory(args.checkpoint)  # before any process starts
        results = launch(train_worker, world(args), args, backend=backend_for(args.device))
    except CheckpointError as e:  # this process's own: the check above, or this rank's under torchrun
        if os.environ.get("RANK", "0") == "0":  # every rank raised the same: rank 0 says it once
            print(f"dt train: error: {e}", file=sys.stderr)
        return 2
    except WorkerError as e:  # a worker's: one line if it was the checkpoint's or a diverged loss
        kind = e.errors[e.rank].kind
        if kind not in _ONE_LINE_ERRORS:
            raise
        if launched_rank() == 0:  # under torchrun every rank gathered the same error
            print(f"dt train: error: {e.errors[e.rank].message}", file=sys.stderr)
        return _ONE_LINE_ERRORS[kind]
    if results and results[0]["rank"] == 0:
        print(report(args, results))
        record.headline(headline(args, results[0]))
        if args.plot:  # the whole run's curve: a resumed run's metrics file holds the earlier steps too
            records = curve_records(read_metrics(args.metrics) if args.metrics else results[0]["metrics"])
            plot_loss(records, args.plot, title=f"dt train: {' '.join(sys.argv[1:])}")  # wrapped to fit
            print(f"loss curve: {args.plot}")
    return 0
