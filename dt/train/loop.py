"""One rank of `dt train`: build the mesh and the model, train, say where the time went.

Every data-parallel rank draws the same global batch (dt.models.data is a
pure function of the step) and keeps its slice, so the loss curve does not
depend on the mesh. The time split rank 0 reports:

    compute        forward and backward of this rank's layers (and the optimizer)
    communication  the layers' collectives (tensor, context, expert) + the gradient all-reduce
    bubble         waiting on the pipeline neighbours (idle slots, plus the wire)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
import torch.distributed as dist

from dt import transport
from dt.device import clock
from dt.models.gpt import GPTConfig, ParallelGPT
from dt.parallel.mesh import mesh as build_mesh
from dt.parallel.zero import ZeroOptimizer
from dt.train.checkpoint import load_checkpoint, lock_directory, save_checkpoint
from dt.train.dataset import open_data
from dt.train.evaluate import parallel_gpt_loss
from dt.train.hooks import StepHooks
from dt.train.optim import Adam
from dt.train.placement import LAYOUTS, predict
from dt.train.precision import Precision

__all__ = ["make_model", "train_worker"]


def make_model(args: argparse.Namespace, vocab_size: int) -> tuple[ParallelGPT, Any]:
    mesh = build_mesh(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
                      tp_across=LAYOUTS[getattr(args, "layout", "tp-inside")])
    cfg = GPTConfig(vocab_size=vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd, tied=not args.untied, seed=args.seed,
                    dtype=args.dtype, n_experts=args.experts, top_k=args.top_k,
                    capacity_factor=args.capacity_factor, aux_loss_coef=args.aux_loss_coef)
    model = ParallelGPT(cfg, mesh, micro_batches=args.micro_batches, schedule=args.schedule,
                        virtual=args.virtual, cp_attention=args.cp_attention)
    if args.zero:  # Adam's state sharded over the dp group; gradients reduce-scattered in step()
        model.dp_sync = False
        optimizer: Any = ZeroOptimizer(model.stage.parameters(), Adam, stage=1, group=mesh.dp_group,
                                       lr=args.lr)
    else:
        optimizer = Adam(model.stage.parameters(), lr=args.lr)
    return model, optimizer


def train_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Train on this rank; returns the losses, throughput and time split."""
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    lock = None
    try:
        transport.set_validation(args.validate)
        if args.checkpoint:  # before any training: a directory we cannot use is an error now
            lock = lock_directory(args.checkpoint)
        return _train(args)
    finally:
        if lock is not None:
            lock.release()
        torch.set_num_threads(threads)  # a reused worker (tests) gets its setting back


def _placement(args: argparse.Namespace, model: ParallelGPT) -> dict[str, Any] | None:
    """Across hosts: both mesh layouts' predicted tp and dp time per step (dt.train.placement).

    Collective over the world (it connects the world group: its hosts, rank 0's figures).
    """
    import dt
    from dt.collectives import agreed

    if model.mesh.world < 2:
        return None
    # A group of its own, connected here: its hosts are found as this run sees them (the
    # world group may have connected long before, in a reused process, under other hosts).
    group = dist.new_group(list(range(model.mesh.world)))
    dt.barrier(group=group, algorithm="dissemination")  # connects it: its topology, agreed below
    view = transport.resolve_group(group)
    fig = agreed.agree(view)
    if fig is None:  # one host
        return None
    params = list(model.stage.parameters())
    itemsize = params[0].element_size() if params else 4
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    hosts = tuple(transport.topology_of(view).hosts)
    return {"hosts": max(hosts) + 1, "source": fig.source, "note": fig.note,
            "predicted": predict(args, hosts, fig.levels, grad_bytes, itemsize)}


def _train(args: argparse.Namespace) -> dict[str, Any]:
    data = open_data(args)
    model, optimizer = make_model(args, data.vocab_size)
    m = model.mesh
    start, loaded = 0, None
    if args.checkpoint:
        loaded = load_checkpoint(args.checkpoint, model, optimizer)
        if loaded is not None:
            start = loaded.step
            if m.rank == 0:
                for w in loaded.warnings:
                    print(f"dt train: warning: {w}", file=sys.stderr, flush=True)
    saved_with = {"tokenizer": data.tokenizer.to_json()}  # in the manifest: dt sample reads it
    per_rank = args.batch_size // args.dp
    precision = Precision(getattr(args, "precision", "float32"), model.device)
    hooks = StepHooks(args, data, lambda x, y: parallel_gpt_loss(model, x, y), rank=m.rank,
                      dp_rank=m.dp_rank, start=start, desc=f"dp{m.dp} cp{m.cp} ep{m.ep} tp{m.tp} pp{m.pp}")
    losses: list[float] = []
    t_opt = 0.0
    t_start = clock(model.device)
    for step in range(start, args.steps):
        x, y = data.batch(step, args.batch_size, args.block_size)
        sl = slice(m.dp_rank * per_rank, (m.dp_rank + 1) * per_rank)
        optimizer.zero_grad()
        hooks.begin(step, optimizer)
        with precision.autocast():
            loss = model.train_step(x[sl], y[sl])
        t0 = clock(model.device)
        with transport.traffic() as zero_traffic:  # ZeRO's reduce-scatter and all-gather
            optimizer.step()
        model.bytes_sent["data"] += zero_traffic.bytes_sent
        model.times["communication"] += zero_traffic.seconds
        t_opt += clock(model.device) - t0 - zero_traffic.seconds
        losses.append(loss)
        hooks.end(step, loss, {**model.times, "compute": model.times["compute"] + t_opt})
        if args.checkpoint and args.save_every and (step + 1) % args.save_every == 0:
            save_checkpoint(args.checkpoint, model, optimizer, step + 1, args.keep, saved_with)
    wall = clock(model.device) - t_start - hooks.eval_s  # training's time: validation apart
    hooks.close()
    if args.checkpoint and start < args.steps:
        save_checkpoint(args.checkpoint, model, optimizer, args.steps, args.keep, saved_with)
    steps = args.steps - start
    placement = _placement(args, model)  # after the loop: the world group is connected only now
    times = dict(model.times)
    times["compute"] += t_opt
    return {"rank": m.rank, "coords": m.coords(), "losses": losses, "start": start, "wall_s": wall,
            "tokens_per_s": steps * args.batch_size * args.block_size / wall if wall > 0 else 0.0,
            "times": times, "bytes_sent": dict(model.bytes_sent), "steps": steps,
            "val_losses": hooks.val_losses, "metrics": hooks.log.records if m.rank == 0 else [],
            "peak_stash": model.pipe.stats.peak_stash, "moe": model.moe_stats(), "placement": placement,
            "resumed": None if loaded is None else {"path": loaded.path, "step": loaded.step,
                                                    "layout": loaded.layout, "warnings": loaded.warnings}}
