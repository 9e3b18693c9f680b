"""Validation loss: the mean loss over --eval-batches held-out batches, forward only, on any mesh.

    val = validation_loss(forward_loss_of(run), data, args, dp_rank)

Every data-parallel rank takes its slice of the same validation batches (as
training does), so the figure is the same on every mesh and the same as one
process's; `forward_loss(tokens, targets)` is the model's loss on this rank's
slice, already averaged over the mesh (every rank returns the global mean).
Batch i of validation is the same at every evaluation: the curve moves because
the model does, not because the sample did.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

import torch

from dt.collectives import all_reduce, broadcast
from dt.collectives.ops import ReduceOp
from dt.parallel.context.style import shard_sequence
from dt.train.dataset import TrainData
from dt.train.step import TrainStep

__all__ = ["ForwardLoss", "forward_loss_of", "train_step_loss", "validation_loss"]

ForwardLoss = Callable[[torch.Tensor, torch.Tensor], float]


def validation_loss(forward_loss: ForwardLoss, data: TrainData, args: argparse.Namespace,
                    dp_rank: int) -> float:
    """The mean over the validation batches of the global batch's loss (every rank: the same)."""
    per_rank = args.batch_size // args.dp
    sl = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
    total = 0.0
    for i in range(args.eval_batches):
        x, y = data.val_batch(i, args.batch_size, args.block_size)
        total += forward_loss(x[sl], y[sl])
    return total / args.eval_batches


def forward_loss_of(run: Any) -> ForwardLoss:
    """The forward-only loss of a built run (dt.train.build.Built): its TrainStep's."""
    return lambda x, y: train_step_loss(run.step, x, y)


@torch.no_grad()
def train_step_loss(step: TrainStep, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    """A TrainStep's loss on this rank's slice, forward only, averaged as the step averages its loss.

    The step's pipeline runs its forward-only schedule (under the step's autocast);
    the last stage applies the step's loss_fn, averaged over the data-parallel axes and
    broadcast from the last stage along the pipeline, as the training loss is.
    """
    autocast = step.precision.autocast if step.precision is not None else contextlib.nullcontext
    # This rank's share of each sequence, as the step takes it (under cp: its zig-zag share).
    x = shard_sequence(tokens.to(step.device), step.grid) if step.first else None
    with autocast():
        logits = step.pipe.forward(x, step.micro_batches)
        loss = torch.zeros(1, dtype=step.params[0].dtype if step.params else torch.float32,
                           device=step.device)
        if step.last:
            y = shard_sequence(targets.to(step.device), step.grid)
            loss += step.loss_fn(logits, y).to(loss.dtype)
    if step.last and step.dp > 1:
        all_reduce(loss, op=ReduceOp.AVG, group=step.dp_group)
    if step.pp_group.size > 1:
        broadcast(loss, src=step.pp_group.global_rank(step.pp_group.size - 1), group=step.pp_group)
    return float(loss.item())
