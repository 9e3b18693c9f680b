"""`dt plan`: every layout of a model on a cluster, its predicted step and peak memory, ranked.

    dt plan                                         # dt train's default GPT on 2 ranks of this machine
    dt plan --world 4 --explain dp2.tp1.pp2.z0.1f1b.m4
    dt plan --preset llama-7b --hosts 8 --per-host 8 --device h100 --global-batch 512 --seq 4096
    dt plan --world 2 --check --steps 10 --trace plan-trace.json
    dt plan --hosts 2 --per-host 2 --check            # each run on a fresh `dt cluster` (root)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from dt import args as args_
from dt.cost.devices import DEVICES
from dt.plan.cluster import Cluster, catalogue_cluster, local_cluster
from dt.plan.model import PRESETS, ModelShape, llama_shape
from dt.plan.report import as_json, explain_plot, scatter_plot, table
from dt.plan.search import rank_layouts
from dt.plan.step_model import predict
from dt.units import fmt_bytes

__all__ = ["main", "parse_args"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # a catalogue device's
TRAIN_VOCAB = 44  # dt train's corpus (dt.models.data.CharData) has 44 symbols


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = args_.Parser(prog="dt plan", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    one = args_.at_least(1)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a public model shape")
    p.add_argument("--n-layer", type=one, default=4)
    p.add_argument("--n-head", type=one, default=4)
    p.add_argument("--n-embd", type=one, default=64)
    p.add_argument("--vocab", type=one, default=TRAIN_VOCAB)
    p.add_argument("--experts", type=args_.at_least(0), default=0)
    p.add_argument("--top-k", type=one, default=1)
    p.add_argument("--untied", action="store_true")
    p.add_argument("--model", choices=["gpt", "llama"], default="gpt", help="dt train's --model")
    p.add_argument("--n-kv-head", type=one, default=None, help="--model llama's key/value heads")
    p.add_argument("--clip", action="store_true", help="every layout clips by the global norm (--clip)")
    p.add_argument("--global-batch", type=one, default=16, help="sequences per step")
    p.add_argument("--seq", type=one, default=32, help="tokens per sequence")
    p.add_argument("--precision", type=args_.precision, default=None,
                   help="this machine: float32 (default) or float64; a catalogue device: bf16 (default), "
                        "fp16, tf32, fp32 (each also as torch names it: bfloat16, float16, float32)")
    p.add_argument("--world", type=args_.ranks, default=2, help="ranks on this machine")
    p.add_argument("--hosts", type=one, default=1,
                   help="hosts (with --device: catalogue; without: dt cluster)")
    p.add_argument("--per-host", type=one, default=None, help="ranks per host")
    p.add_argument("--device", choices=sorted(DEVICES), default=None,
                   help="a catalogue GPU (dt.cost.devices)")
    p.add_argument("--efficiency", type=args_.positive, default=None,
                   help="sustained fraction of the device's peak (default: the catalogue's stated one)")
    p.add_argument("--timed", action="store_true",
                   help="with --device: time dt train's layers and Adam on this host's GPU (its autocast) "
                        "instead of pricing their FLOPs and bytes; the links stay the catalogue's")
    p.add_argument("--recompute", action="store_true", help="also consider full activation recompute "
                   "(dt train --recompute)")
    p.add_argument("--top", type=one, default=15, help="rows of the table")
    p.add_argument("--explain", metavar="LAYOUT", default=None, help="draw this layout's per-rank timeline")
    p.add_argument("--out", default=None, help="the --explain PNG (default plan-LAYOUT.png)")
    p.add_argument("--scatter", metavar="PNG", default=None, help="step time against memory, every layout")
    p.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")
    p.add_argument("--check", action="store_true", help="run the top layouts and a spread with dt train")
    p.add_argument("--runs", type=one, default=6, help="layouts --check runs (the top 3 and a spread)")
    p.add_argument("--steps", type=one, default=8,
                   help="dt train steps per --check run (the first is warm-up)")
    p.add_argument("--trace", metavar="JSON", default=None, help="--check: Chrome trace of the first run")
    p.add_argument("--link", type=args_.link, default=args_.link("1Gbit"),
                   help="--check across hosts: each simulated host's link, as `dt cluster up --link` "
                        "(default 1Gbit, the rate the README's cluster figures were tuned at)")
    a = p.parse_args(argv)
    if a.efficiency is not None and not 0 < a.efficiency <= 1:
        p.error(f"--efficiency must be in (0, 1], got {a.efficiency}")
    if a.precision is not None:
        a.precision = _precision(p, a.precision, a.device)
    if a.check and a.device and a.hosts > 1:
        p.error("--check --device runs dt train on this host's GPUs: drop --hosts")
    if a.check and a.device:
        _check_on_gpus(p, a)
    a.timed_gpu = _timed_gpu(p, a) if a.timed else ""
    if a.n_kv_head and a.model != "llama":
        p.error("--n-kv-head is --model llama's")
    if a.per_host is None:
        a.per_host = a.world if a.device is None and a.hosts == 1 else 8
    if a.device is None and a.hosts * a.per_host > args_.MAX_WORLD:
        p.error(f"--hosts x --per-host = {a.hosts * a.per_host} ranks; this machine runs at most "
                f"{args_.MAX_WORLD}")
    if a.check and a.hosts > 1:
        _can_simulate(p, a.hosts * a.per_host)
    return a


def _precision(p: argparse.ArgumentParser, name: str, device: str | None) -> str:
    """--precision (dt.args.precision's torch name) as the cluster prices it: this machine's
    float32 or float64, or a catalogue device's datasheet name (bf16, ...)."""
    if device is None:
        if name not in ("float32", "float64"):
            p.error(f"--precision {name} needs --device: this machine trains in float32 or float64")
        return name
    if args_.short_precision(name) not in PRECISIONS:
        p.error(f"--precision {name} is this machine's; a catalogue device takes {', '.join(PRECISIONS)}")
    return args_.short_precision(name)


def _check_on_gpus(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """`--check --device D` runs dt train on this host's GPUs: there must be --per-host of them.

    The catalogue's figures are the prediction and this host's GPUs the measurement, so a
    check of --device h100 on an H200 says how far the two differ, not how wrong the model is:
    the device's name is printed beside the table (not refused)."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if a.per_host is None:
        a.per_host = have or 1
    if a.per_host > have:
        p.error(f"--check --device {a.device} runs dt train on this host's GPUs (one per rank): "
                f"--per-host {a.per_host}, torch sees {have} GPU(s)")
    if a.preset and PRESETS[a.preset].vocab != TRAIN_VOCAB:
        p.error(f"--check trains on dt train's generated text ({TRAIN_VOCAB} symbols), not "
                f"--preset {a.preset}'s vocabulary: give its shape as --n-layer, --n-head, --n-embd")


def _gpu_here() -> bool:
    import torch

    return torch.cuda.is_available()


def _timed_gpu(p: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    """--timed: the name of this host's GPU the layers are timed on (refused without one)."""
    import torch

    if not a.device:
        p.error("--timed times the layers on this host's GPU for a catalogue --device: name one")
    if not _gpu_here():
        p.error("--timed times the layers on this host's GPU, and torch sees none here")
    return torch.cuda.get_device_name(0)


def _can_simulate(p: argparse.ArgumentParser, world: int) -> None:
    """--check across hosts runs `dt cluster`s here: its ranks on this machine's cores and memory,
    and root, ip, tc and unshare; else one line now, not a failure after the planning."""
    from dt.launcher.cluster import ClusterError, check_tools

    try:
        args_.check_local_world(world, "ranks (--hosts x --per-host) of --check's simulated cluster")
        check_tools()
    except (args_.InputError, ClusterError) as exc:
        p.error(f"--check with --hosts runs under dt cluster: {exc}")


def _model(a: argparse.Namespace) -> ModelShape:
    if a.preset:
        return PRESETS[a.preset]
    if a.model == "llama":
        return llama_shape(a.n_layer, a.n_head, a.n_embd, a.vocab, a.n_kv_head or 0, tied=not a.untied)
    return ModelShape(a.n_layer, a.n_head, a.n_embd, a.vocab, tied=not a.untied, experts=a.experts,
                      top_k=a.top_k)


def _cluster(a: argparse.Namespace) -> Cluster:
    if a.device:
        return catalogue_cluster(a.device, a.hosts, a.per_host, a.precision or "bf16", a.efficiency,
                                 a.timed_gpu)
    world = a.hosts * a.per_host if a.hosts > 1 else a.world
    return local_cluster(world, a.precision or "float32", a.hosts)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(list(sys.argv[1:] if argv is None else argv))
    model, cluster = _model(a), _cluster(a)
    t0, cpu0 = time.perf_counter(), time.process_time()
    rows, enumerated, dropped = rank_layouts(cluster, model, a.global_batch, a.seq,
                                             (False, True) if a.recompute else (False,), a.clip)
    took, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    title = (f"{model.name} ({model.params(a.seq) / 1e6:.1f}M parameters), global batch {a.global_batch} x "
             f"{a.seq} tokens, on {cluster.name}")
    meta = {"model": model.__dict__, "global_batch": a.global_batch, "seq": a.seq, "cluster": cluster.name,
            "source": cluster.source, "enumerated": enumerated, "dropped": dropped, "seconds": took,
            "cpu_seconds": cpu}
    if a.explain is not None:
        return _explain(a, rows, cluster, model, title)
    measured = None
    if a.check:
        from dt.plan.check import check

        measured, text = check(rows, a.runs, a.steps, a.trace, a.global_batch, a.seq, model, cluster, a.link)
    if a.json:
        print(as_json(meta, rows, measured))
        return 0
    print(title)
    print(f"cluster: {cluster.source}")
    if a.device and not a.timed and _gpu_here():
        print("note: this host has a GPU: --timed times dt train's own layers on it instead of pricing "
              "FLOPs (on an H200, FLOPs at 70% of peak put GPT-2 small's step 75% short: README, GPUs)")
    gone = "; ".join(f"{n} dropped: {why}" for why, n in dropped.items())
    print(f"{enumerated} layouts dt train accepts, {len(rows)} fit{'; ' + gone if gone else ''} "
          f"({took:.2f} s to plan, {cpu:.2f} s of CPU)")
    if not rows:
        print("nothing fits: raise --per-host or --hosts, lower --global-batch or --seq, or add --recompute")
        return 1
    print(table(rows, a.top))
    if a.scatter:
        scatter_plot(rows, a.scatter, title)
        print(f"scatter: {a.scatter}")
    if measured is not None:
        print(text)
    return 0


def _explain(a: argparse.Namespace, rows: list, cluster: Cluster, model: ModelShape, title: str) -> int:
    names = {r.layout.name(): r for r in rows}
    if a.explain not in names:
        near = ", ".join(r.layout.name() for r in rows[:3])
        print(f"dt plan: error: --explain {a.explain} is not one of the {len(rows)} fitting layouts "
              f"(the first ranked: {near})", file=sys.stderr)
        return 2
    row = names[a.explain]
    p = predict(cluster, model, replace(row.layout), a.global_batch, a.seq, timelines=True)
    out = a.out or f"plan-{a.explain}.png"
    explain_plot(p, out, f"{a.explain} ({title})")
    parts = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in p.parts.items() if v > 0)
    print(f"{a.explain}: predicted step {p.step * 1e3:.2f} ms = {parts}; peak {fmt_bytes(row.peak)} per rank")
    print(f"timeline: {out}")
    return 0
