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
from dt.collectives import barrier
from dt.device import clock
from dt.train.build import Built, build, plain_model
from dt.train.checkpoint import load_checkpoint, lock_directory, save_checkpoint
from dt.train.dataset import open_data
from dt.train.diverged import Diverged, check_loss, check_weights
from dt.train.evaluate import forward_loss_of
from dt.train.hooks import StepHooks
from dt.train.metrics import model_flops_per_token
from dt.train.options import data_source
from dt.train.placement import predict
from dt.train.precision import float32_matmuls

__all__ = ["make_model", "start_line", "train_worker"]


def make_model(args: argparse.Namespace, vocab_size: int) -> Built:
    """The model, its grid, step and optimizer for `args` (dt.train.build)."""
    return build(args, vocab_size)


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
        with float32_matmuls(getattr(args, "precision", "float32")):
            return _train(args)
    finally:
        if lock is not None:
            lock.release()
        torch.set_num_threads(threads)  # a reused worker (tests) gets its setting back


def _placement(args: argparse.Namespace, run: Built) -> dict[str, Any] | None:
    """Across hosts: both mesh layouts' predicted tp and dp time per step (dt.train.placement).

    Collective over the world (it connects the world group: its hosts, rank 0's figures).
    """
    import dt
    from dt.collectives import agreed

    if run.world < 2:
        return None
    # A group of its own, connected here: its hosts are found as this run sees them (the
    # world group may have connected long before, in a reused process, under other hosts).
    group = dist.new_group(list(range(run.world)))
    dt.barrier(group=group, algorithm="dissemination")  # connects it: its topology, agreed below
    view = transport.resolve_group(group)
    fig = agreed.agree(view)
    if fig is None:  # one host
        return None
    params = run.parameters
    itemsize = params[0].element_size() if params else 4
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    hosts = tuple(transport.topology_of(view).hosts)
    return {"hosts": max(hosts) + 1, "source": fig.source, "note": fig.note,
            "predicted": predict(args, hosts, fig.levels, grad_bytes, itemsize)}


def start_line(args: argparse.Namespace, vocab_size: int) -> str:
    """What the run trains, said before its first step: the model's size, a step's tokens, the data."""
    with torch.device("meta"):  # the plain model's shapes only: no memory, no initialisation
        model, _ = plain_model(args, vocab_size)
    tokens = args.batch_size * args.block_size
    given = getattr(args, "model_from", None)
    return (f"dt train: {type(model).__name__} of {model.num_params():,} parameters"
            f"{f' ({given})' if given else ''}; {tokens:,} tokens per step (global batch "
            f"{args.batch_size} x {args.block_size}); data: {data_source(args)}")


def _save(args: argparse.Namespace, run: Built, step: int, loss: float, saved_with: dict[str, Any]) -> None:
    """Collective: checkpoint after `step`, once every rank's weights are finite (dt.train.diverged)."""
    check_weights(step, loss, run.parameters, run.world, run.device)
    save_checkpoint(args.checkpoint, run.parallel_model, run.optimizer, step, run.cfg, args.keep, saved_with)


def _train(args: argparse.Namespace) -> dict[str, Any]:
    data = open_data(args)
    run = make_model(args, data.vocab_size)
    step_fn, optimizer = run.step, run.optimizer
    start, loaded = 0, None
    if args.checkpoint:
        loaded = load_checkpoint(args.checkpoint, run.parallel_model, optimizer, run.cfg)
        if loaded is not None:
            start = loaded.step
            if run.rank == 0:
                for w in loaded.warnings:
                    print(f"dt train: warning: {w}", file=sys.stderr, flush=True)
    if run.rank == 0:  # once the checkpoint loaded: a refused one is its error line alone
        print(start_line(args, data.vocab_size), file=sys.stderr, flush=True)  # beside the progress
    saved_with = {"tokenizer": data.tokenizer.to_json()}  # in the manifest: dt sample reads it
    per_rank = args.batch_size // args.dp
    dp_rank = run.coords[0]
    hooks = StepHooks(args, data, forward_loss_of(run), rank=run.rank, dp_rank=dp_rank, start=start,
                      desc=f"dp{args.dp} cp{args.cp} ep{args.ep} tp{args.tp} pp{args.pp}",
                      flops_per_token=model_flops_per_token(run.cfg),
                      peak_flops=getattr(args, "peak_total", None))
    losses: list[float] = []
    if run.world > 1:  # the clocks start together: a peer's later start-up is no step's wait
        barrier(algorithm="dissemination")
    t_start = clock(run.device)
    t_warm = eval_warm = None  # after the run's first step: its allocations and kernel choices done
    for step in range(start, args.steps):
        x, y = data.batch(step, args.batch_size, args.block_size)
        sl = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
        hooks.begin(step, optimizer)  # this step's learning rate
        loss = step_fn(x[sl], y[sl])  # forward, backward, sync, optimizer step
        try:
            check_loss(step + 1, loss)  # the same global loss on every rank: all raise together
        except Diverged:
            hooks.close()  # the metrics file holds every finite step
            raise
        losses.append(loss)
        hooks.end(step, loss, step_fn.times, step_fn.stats.get("grad_norm"))  # validation, metrics
        if step == start:
            t_warm, eval_warm = clock(run.device), hooks.eval_s
        if args.checkpoint and args.save_every and (step + 1) % args.save_every == 0:
            _save(args, run, step + 1, loss, saved_with)
    t_end = clock(run.device)
    wall = t_end - t_start - hooks.eval_s  # training's time: validation apart
    steady = t_end - t_warm - (hooks.eval_s - eval_warm) if t_warm is not None else 0.0
    hooks.close()
    if args.checkpoint and start < args.steps:
        _save(args, run, args.steps, losses[-1], saved_with)
    steps = args.steps - start
    placement = _placement(args, run)  # after the loop: the world group is connected only now
    return {"rank": run.rank, "coords": run.coords, "losses": losses, "start": start, "wall_s": wall,
            "tokens_per_s": steps * args.batch_size * args.block_size / wall if wall > 0 else 0.0,
            # the steady rate: without the first step (a GPU's first step alone can take a second)
            "steady_tokens_per_s": ((steps - 1) * args.batch_size * args.block_size / steady
                                    if steps > 1 and steady > 0 else None),
            "times": dict(step_fn.times), "bytes_sent": dict(step_fn.bytes_sent), "steps": steps,
            "peak_stash": step_fn.stats["peak_stash"], "moe": step_fn.stats.get("moe", {}),
            "grad_norm": step_fn.stats.get("grad_norm"), "skipped": step_fn.stats.get("skipped", 0),
            "val_losses": hooks.val_losses, "metrics": hooks.log.records if run.rank == 0 else [],
            "flops_per_token": hooks.flops_per_token,
            "placement": placement,
            "resumed": None if loaded is None else {"path": loaded.path, "step": loaded.step,
                                                    "layout": loaded.layout, "warnings": loaded.warnings}}
