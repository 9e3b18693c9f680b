"""`dt plan`: every layout of a model on a cluster, its predicted step and peak memory, ranked.

    dt plan                                         # dt train's default GPT on 2 ranks of this machine
    dt plan --world 4 --explain dp2.tp1.pp2.z0.1f1b.m4
    dt plan --preset llama3-8b --hosts 8 --device h100 --global-batch 512 --seq 4096
    dt plan --preset llama-70b --n-layer 40 --device h100 --hosts 4 --stack megatron
    dt plan --published                               # the planner beside published runs
    dt plan --world 2 --check --steps 10 --trace plan-trace.json
    dt plan --world 2 --explain dp2.tp1.pp1.z0.1f1b.m2 --check   # one layout, run beside its plan
    dt plan --hosts 2 --per-host 2 --check            # each run on a fresh `dt cluster` (root)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from dt import args as args_
from dt import record
from dt.cost.devices import DEVICES
from dt.cost.stack import STACKS
from dt.plan.cluster import Cluster, catalogue_cluster, local_cluster
from dt.plan.layouts import NAME_GRAMMAR, parse_name, train_args
from dt.plan.memory import peak_bytes
from dt.plan.model import PRESETS, ModelShape, llama_shape
from dt.plan.published import SOURCES
from dt.plan.report import as_json, explain_plot, explain_text, scatter_plot, table
from dt.plan.search import HEADROOM, Ranking, model_flops, rank_layouts, row_of
from dt.plan.step_model import predict
from dt.train.layouts import layout_error

__all__ = ["main", "parse_args"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # a catalogue device's
TRAIN_VOCAB = 44  # dt train's corpus (dt.models.data.CharData) has 44 symbols
LAYOUT_HELP = f"""

A layout's name (the table's rows, --explain's key):
  {NAME_GRAMMAR}
  z: ZeRO stage; m: micro-batches per step (gradient accumulation at pp 1); v: chunks per stage of the
  interleaved schedule; sp: sequence parallel; across: tp's ranks on different hosts; rc: full
  recompute, rcsel: selective (attention's core)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = args_.Parser(prog="dt plan", description=__doc__.split("\n\n")[0],
                     epilog=__doc__.split("\n\n", 1)[1] + LAYOUT_HELP,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    one = args_.at_least(1)
    _add_model_flags(p)
    p.add_argument("--clip", action="store_true", help="every layout clips by the global norm (--clip)")
    p.add_argument("--global-batch", type=one, default=16, help="sequences per step (default 16)")
    p.add_argument("--seq", type=one, default=32, help="tokens per sequence (default 32)")
    _add_cluster_flags(p)
    p.add_argument("--recompute", nargs="?", const="any", choices=("none", "selective", "full", "any"),
                   default=None, help="activation recompute to consider: none, selective, full, or any "
                                      "(the flag alone) (default: any with --device, none here)")
    p.add_argument("--top", type=one, default=15, help="rows of the table (default 15)")
    p.add_argument("--explain", metavar="LAYOUT", default=None,
                   help="this layout's per-rank timeline and every term of its step and memory")
    p.add_argument("--out", default=None, help="the --explain PNG (default plan-LAYOUT.png)")
    p.add_argument("--scatter", metavar="PNG", default=None, help="step time against memory, every layout")
    p.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")
    p.add_argument("--published", nargs="*", metavar="SOURCE", default=None,
                   help="the planner beside published runs (every source, or those named: "
                        f"{', '.join(SOURCES)})")
    p.add_argument("--rank", action="store_true",
                   help="with --published: rank each sweep's fastest published layout among every layout "
                        "of its model and cluster (minutes)")
    p.add_argument("--fit", action="store_true",
                   help="with --published: fit each device's GEMM efficiency, leaving each source out in "
                        "turn")
    p.add_argument("--check", action="store_true",
                   help="run the top layouts and a spread with dt train (with --explain: that layout)")
    p.add_argument("--runs", type=one, default=6, help="layouts --check runs (the top 3 and a spread)")
    p.add_argument("--steps", type=one, default=8,
                   help="dt train steps per --check run (the first is warm-up) (default 8)")
    p.add_argument("--trace", metavar="JSON", default=None, help="--check: Chrome trace of the first run")
    p.add_argument("--link", type=args_.link, default=args_.link("1Gbit"),
                   help="--check across hosts: each simulated host's link, as `dt cluster up --link` "
                        "(default 1Gbit, the rate the cluster's dt tune figures are taken at)")
    record.add_option(p)
    a = p.parse_args(argv)
    _check_options(p, a)
    if a.published is not None:
        unknown = [s for s in a.published if s not in SOURCES]
        if unknown:
            p.error(f"--published {' '.join(unknown)}: no such source; one of {', '.join(SOURCES)}")
    elif a.rank or a.fit:
        p.error("--rank and --fit go with --published")
    return a


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    one = args_.at_least(1)
    shape = parser.add_argument_group(
        "the model (a preset, or dt train's GPT; a flag given overrides the preset's)")
    shape.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a public model's shape")
    shape.add_argument("--model", choices=["gpt", "llama"], default=None,
                       help="the family without a preset: dt train's --model (default gpt)")
    shape.add_argument("--n-layer", type=one, default=None, help="blocks (default 4)")
    shape.add_argument("--n-head", type=one, default=None, help="attention heads (default 4)")
    shape.add_argument("--n-kv-head", type=one, default=None,
                       help="llama's key/value heads: grouped-query attention (default: --n-head)")
    shape.add_argument("--n-embd", type=one, default=None, help="hidden size (default 64)")
    shape.add_argument("--ffn", type=one, default=None,
                       help="the MLP's hidden width (default: 4 x --n-embd; llama: 8/3 x rounded up to 32)")
    shape.add_argument("--vocab", type=one, default=None,
                       help=f"vocabulary (default {TRAIN_VOCAB}: dt train's text)")
    shape.add_argument("--experts", type=args_.at_least(0), default=None,
                       help="MoE experts per block (default 0)")
    shape.add_argument("--top-k", type=one, default=None, help="experts per token (default 1)")
    shape.add_argument("--untied", action="store_true", help="a head of its own (a preset says its own)")


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    one = args_.at_least(1)
    parser.add_argument("--precision", type=args_.precision, default=None,
                        help="this machine: float32 (default) or float64; a catalogue device: bf16 "
                             "(default), fp16, tf32, fp32 (each also as torch names it: bfloat16, float16, "
                             "float32)")
    parser.add_argument("--world", type=args_.ranks, default=2, help="ranks on this machine (default 2)")
    parser.add_argument("--hosts", type=one, default=1,
                        help="hosts (with --device: catalogue; without: dt cluster) (default 1)")
    parser.add_argument("--per-host", type=one, default=None,
                        help="ranks per host (default: --world; GPUs: 8)")
    parser.add_argument("--device", choices=sorted(DEVICES), default=None,
                        help="a catalogue GPU (dt.cost.devices): each kernel priced")
    parser.add_argument("--stack", choices=sorted(STACKS), default="dt",
                        help="with --device: the software running the step (dt.cost.stack: its kernels, "
                             "bytes per parameter and overlaps) (default dt)")
    parser.add_argument("--host-network", type=args_.positive, default=None, metavar="GBIT",
                        help="with --device: each host's network, all its NICs together, Gbit/s one way "
                             "(default: one catalogue NIC per GPU, 8 x 200 on the A100's hosts, 8 x 400 "
                             "on the H100's and H200's)")
    parser.add_argument("--efficiency", type=args_.positive, default=None,
                        help="a large GEMM's sustained fraction of peak (default: the catalogue's)")
    parser.add_argument("--headroom", type=args_.positive, default=HEADROOM,
                        help=f"with --device: the fraction of each GPU's memory a layout must leave free "
                             f"(default {HEADROOM:g})")
    parser.add_argument("--timed", action="store_true",
                        help="with --device: time dt train's layers and Adam on this host's GPU (its "
                             "autocast) instead of pricing their kernels; the links stay the catalogue's")


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.efficiency is not None and not 0 < args.efficiency <= 1:
        parser.error(f"--efficiency must be in (0, 1], got {args.efficiency}")
    if not 0 <= args.headroom < 1:
        parser.error(f"--headroom must be in [0, 1), got {args.headroom}")
    if args.precision is not None:
        args.precision = _precision(parser, args.precision, args.device)
    if args.check and args.device and args.hosts > 1:
        parser.error("--check --device runs dt train on this host's GPUs: drop --hosts")
    if args.check and args.device:
        _check_on_gpus(parser, args)
    args.timed_gpu = _timed_gpu(parser, args) if args.timed else ""
    try:
        args.shape = _model(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.per_host is None:
        args.per_host = args.world if args.device is None and args.hosts == 1 else 8
    if args.device is None and args.hosts * args.per_host > args_.MAX_WORLD:
        parser.error(f"--hosts x --per-host = {args.hosts * args.per_host} ranks; this machine runs at "
                     f"most {args_.MAX_WORLD}")
    if args.check and args.hosts > 1:
        _can_simulate(parser, args.hosts * args.per_host)
    if args.recompute is None:
        args.recompute = "any" if args.device else "none"


def _precision(parser: argparse.ArgumentParser, name: str, device: str | None) -> str:
    """--precision (dt.args.precision's torch name) as the cluster prices it: this machine's
    float32 or float64, or a catalogue device's datasheet name (bf16, ...)."""
    if device is None:
        if name not in ("float32", "float64"):
            parser.error(f"--precision {name} needs --device: this machine trains in float32 or float64")
        return name
    if args_.short_precision(name) not in PRECISIONS:
        parser.error(f"--precision {name} is this machine's; a catalogue device takes "
                     f"{', '.join(PRECISIONS)}")
    return args_.short_precision(name)


def _check_on_gpus(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--check --device D` runs dt train on this host's GPUs: there must be --per-host of them.

    The catalogue's figures are the prediction and this host's GPUs the measurement, so a
    check of --device h100 on an H200 says how far the two differ, not how wrong the model is:
    the device's name is printed beside the table (not refused)."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.per_host is None:
        args.per_host = have or 1
    if args.per_host > have:
        parser.error(f"--check --device {args.device} runs dt train on this host's GPUs (one per rank): "
                     f"--per-host {args.per_host}, torch sees {have} GPU(s)")
    if args.preset and PRESETS[args.preset].vocab != TRAIN_VOCAB:
        parser.error(f"--check trains on dt train's generated text ({TRAIN_VOCAB} symbols), not "
                     f"--preset {args.preset}'s vocabulary: give its shape as --n-layer, --n-head, --n-embd")


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()


def _timed_gpu(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """--timed: the name of this host's GPU the layers are timed on (refused without one)."""
    import torch

    if not args.device:
        parser.error("--timed times the layers on this host's GPU for a catalogue --device: name one")
    if not _gpu_here():
        parser.error("--timed times the layers on this host's GPU, and torch sees none here")
    return torch.cuda.get_device_name(0)


def _can_simulate(parser: argparse.ArgumentParser, world: int) -> None:
    """--check across hosts runs `dt cluster`s here: its ranks on this machine's cores and memory,
    and root, ip, tc and unshare; else one line now, not a failure after the planning."""
    from dt.launcher.cluster import ClusterError, check_tools

    try:
        args_.check_local_world(world, "ranks (--hosts x --per-host) of --check's simulated cluster")
        check_tools()
    except (args_.InputError, ClusterError) as exc:
        parser.error(f"--check with --hosts runs under dt cluster: {exc}")


DEFAULT_SHAPE = {"n_layer": 4, "n_head": 4, "n_embd": 64, "vocab": TRAIN_VOCAB}


def _model(args: argparse.Namespace) -> ModelShape:
    """The preset (or dt train's small GPT), every flag given overriding it; ValueError naming a clash."""
    if args.preset and args.model:
        raise ValueError(f"--model names a family; --preset {args.preset} has its own "
                         f"({PRESETS[args.preset].family})")
    given = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_embd", "vocab", "ffn", "experts", "top_k",
                                            "n_kv_head") if getattr(args, k) is not None}
    if args.preset:
        base = PRESETS[args.preset]
    elif args.model == "llama":
        flags = {**DEFAULT_SHAPE, **given}
        base = llama_shape(flags["n_layer"], flags["n_head"], flags["n_embd"], flags["vocab"],
                           tied=not args.untied)
    else:
        base = ModelShape(**DEFAULT_SHAPE, tied=not args.untied)
    if "n_kv_head" in given and base.family != "llama":
        raise ValueError("--n-kv-head (grouped-query attention) is the llama family's: dt's GPT has none "
                         "(--model llama, or a llama preset)")
    if base.family == "llama" and "n_embd" in given and "ffn" not in given and not args.preset:
        given["ffn"] = base.ffn
    shape = replace(base, **given, tied=base.tied and not args.untied)
    if given and args.preset:
        shape = replace(shape, name=f"{args.preset} ({', '.join(f'{k}={v}' for k, v in given.items())})")
    return shape


def _cluster(args: argparse.Namespace) -> Cluster:
    if args.device:
        return catalogue_cluster(args.device, args.hosts, args.per_host, args.precision or "bf16",
                                 efficiency=args.efficiency, timed_gpu=args.timed_gpu, stack_name=args.stack,
                                 host_network_gbit=args.host_network)
    world = args.hosts * args.per_host if args.hosts > 1 else args.world
    return local_cluster(world, args.precision or "float32", args.hosts)


RECOMPUTES = {"none": ("none",), "selective": ("selective",), "full": ("full",),
              "any": ("none", "selective", "full")}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    entity = "published" if a.published is not None else "check" if a.check else "rank"
    catalogue = "catalogue" if a.published is not None else None  # the same figures on any machine
    if (recorded := record.rerun("dt plan", argv, a.record, "plan", entity, catalogue)) is not None:
        return recorded
    if a.published is not None:
        from dt.plan.fit import fit_table, report
        from dt.plan.suite import main as published_main

        fitted = report(a.published) if a.fit else None
        status = published_main(a.published, a.json, a.rank, fitted)
        if fitted is not None and not a.json:
            print("\n" + fit_table(fitted))
        return status
    model, cluster = a.shape, _cluster(a)
    if a.explain is not None:
        return _explain(a, cluster, model)
    cpu0 = time.process_time()
    ranking = rank_layouts(cluster, model, a.global_batch, a.seq, RECOMPUTES[a.recompute], a.clip,
                           top=max(a.top, a.runs if a.check else 0), headroom=a.headroom)
    rows, took, cpu = ranking.rows, ranking.seconds, time.process_time() - cpu0
    title = (f"{model.name} ({model.params(a.seq) / 1e9:.2f}B parameters), global batch {a.global_batch} x "
             f"{a.seq} tokens, on {cluster.name}")
    meta = {"model": model.__dict__, "global_batch": a.global_batch, "seq": a.seq, "cluster": cluster.name,
            "source": cluster.source, "grid": ranking.grid, "accepted": ranking.accepted,
            "skipped": ranking.skipped, "dropped": ranking.dropped, "seconds": took, "cpu_seconds": cpu,
            "headroom": a.headroom, "tie_noise": ranking.noise, "untimed": _untimed(cluster)}
    measured = None
    if a.check:
        from dt.plan.check import check

        measured, text = check(rows, a.runs, a.steps, a.trace, a.global_batch, a.seq, model, cluster, a.link)
    record.headline(_headline(model, cluster, rows, measured))
    if a.json:
        print(as_json(meta, rows, measured))
        return 0
    print(title)
    print(f"cluster: {cluster.source}")
    if a.device and not a.timed and _gpu_here():
        print("note: this host has a GPU: --timed times dt train's own layers on it instead of pricing "
              "their kernels from the catalogue")
    print(_counts(ranking, a))
    if meta["untimed"]:
        print(meta["untimed"])
    if not rows:
        print("nothing fits: raise --per-host or --hosts, lower --global-batch or --seq, or add --recompute")
        return 1
    print(table(rows, a.top, cluster.memory if cluster.device is not None else 0, ranking.noise))
    if a.scatter:
        scatter_plot(rows, a.scatter, title)
        print(f"scatter: {a.scatter}")
    if measured is not None:
        print(text)
    return 0


def _headline(model: ModelShape, cluster: Cluster, rows: list, measured: dict | None) -> str:
    """The plan in one line (its record's headline): the first ranked layout, and with --check the
    measured fastest beside it."""
    if not rows:
        return f"{model.name} on {cluster.name}: no layout fits"
    first, predicted = rows[0].layout.name(), rows[0].prediction.step
    said = f"{model.name} on {cluster.name}: first ranked {first} {predicted * 1e3:.2f} ms predicted"
    if measured and first in measured:
        ms = {name: m["step_s"] * 1e3 for name, m in measured.items()}
        fastest = min(ms, key=ms.__getitem__)
        said += f", {ms[first]:.2f} ms measured; measured fastest {fastest} {ms[fastest]:.2f} ms"
    return said


def _untimed(cluster: Cluster) -> str | None:
    """What this machine priced without timing it, past the timing budget (dt.plan.timed)."""
    if cluster.timed != "cpu":
        return None
    from dt.plan import timed

    return timed.BUDGET.note()


def _counts(ranking: Ranking, args: argparse.Namespace) -> str:
    gone = "; ".join(f"{n} dropped: {why}" for why, n in ranking.dropped.items())
    skipped = (f"; {ranking.skipped} more bounded slower than the rows shown (their busiest stage's compute "
               "alone), not priced") if ranking.skipped else ""
    headroom = f"; {args.headroom:.0%} of each GPU's memory kept free (--headroom)" if args.device else ""
    return (f"{ranking.grid} layouts in the grid, {ranking.accepted} dt train accepts, {len(ranking.rows)} "
            f"fit{'; ' + gone if gone else ''}{skipped}{headroom} ({ranking.seconds:.2f} s to plan)")


def _explain(args: argparse.Namespace, cluster: Cluster, model: ModelShape) -> int:
    """Any layout by name: its step's and memory's every term, whether dt train runs it, whether it fits."""
    try:
        layout = parse_name(args.explain)
    except ValueError as exc:
        print(f"dt plan: error: --explain: {exc}", file=sys.stderr)
        return 2
    if layout.world != cluster.world:
        print(f"dt plan: error: --explain {args.explain} has {layout.world} ranks; the cluster has "
              f"{cluster.world}", file=sys.stderr)
        return 2
    why = layout_error(train_args(layout, model, args.global_batch, args.seq))
    if why is not None:
        print(f"dt plan: error: --explain {args.explain}: dt train does not run it: {why}", file=sys.stderr)
        return 2
    prediction = predict(cluster, model, layout, args.global_batch, args.seq, timelines=True)
    memory = peak_bytes(cluster, model, layout, args.global_batch, args.seq)
    out = args.out or f"plan-{args.explain}.png"
    explain_plot(prediction, out, f"{args.explain} ({model.name} on {cluster.name})")
    print(explain_text(prediction, memory, cluster, args.headroom))
    if _untimed(cluster):
        print(_untimed(cluster))
    print(f"timeline: {out}")
    if args.check:  # this layout run with dt train beside its prediction, fitting or not
        from dt.plan.check import check

        row = row_of(cluster, layout, prediction, memory, args.global_batch, args.seq,
                     model_flops(model, args.global_batch, args.seq))
        _, text = check([row], 1, args.steps, args.trace, args.global_batch, args.seq, model, cluster,
                        args.link)
        print(text)
    return 0
