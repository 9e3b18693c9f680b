"""Gradient clipping by the global norm: the norm of the whole model's gradient, over every axis.

Each rank holds some of the model's gradient: a tensor-parallel shard of a
split matrix, a whole copy of a replicated one (a layer norm, a row-parallel
bias), its pipeline stage's layers only, and the same as its data-parallel
peers once they have synchronised. The whole gradient's squared norm is

    sum over pp stages and tp ranks of: shards' squares + (tp rank 0 only) replicas' squares

with a weight two stages share (a tied embedding and head) counted on its
first stage only. So each rank sums what it counts and the sum is all-reduced
over its pp x tp group; its dp x cp peers hold the same gradients and the same
answer, so nothing crosses that plane. Experts are the exception: the ranks
of an ep group hold different experts (replicated over tp, so counted on tp
rank 0), so their squares are first summed over the ep group, then join the
dense ones' sum over pp x tp. Then every gradient is scaled by
min(1, max_norm / norm), torch.nn.utils.clip_grad_norm_'s rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dt.collectives import all_reduce
from dt.collectives.ops import ReduceOp

__all__ = ["counted_parameters", "clip_global_norm"]


def counted_parameters(modules: Sequence[nn.Module], tp_rank: int, saves: object) -> list[nn.Parameter]:
    """The parameters this rank adds to the global norm: each once over tp, pp (and dp, by the group).

    `saves(p)`: whether this pipeline stage is the one that counts `p` (dt.parallel.pipeline.StageCut).
    """
    out: dict[int, nn.Parameter] = {}
    for module in modules:
        for mod in module.modules():
            split = getattr(mod, "shard_dims", {})  # dt's tensor-parallel layers name their split tensors
            for name, p in mod.named_parameters(recurse=False):
                if p.requires_grad and (name in split or tp_rank == 0) and saves(p):
                    out.setdefault(id(p), p)
    return list(out.values())


@torch.no_grad()
def clip_global_norm(counted: Sequence[nn.Parameter], every: Sequence[nn.Parameter], max_norm: float,
                     group: object, device: torch.device, split: Sequence[nn.Parameter] = (),
                     split_group: object = None) -> float:
    """Scale `every` gradient so the global norm is at most max_norm; returns the norm before.

    `counted` are this rank's share (counted_parameters), `group` its pp x tp group;
    those of them in `split` (experts) differ over `split_group` (ep): summed there first.
    """
    apart = {id(p) for p in split}
    squares = _squares([p for p in counted if id(p) not in apart], device)
    if split_group is not None:  # every rank of the group calls, holding experts or not
        split_squares = _squares([p for p in counted if id(p) in apart], device)
        all_reduce(split_squares, ReduceOp.SUM, split_group)
        squares += split_squares
    all_reduce(squares, ReduceOp.SUM, group)
    norm = float(squares.sqrt())
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for p in every:
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm


def _squares(params: Sequence[nn.Parameter], device: torch.device) -> torch.Tensor:
    """The sum of the squares of `params`' gradients, in float64."""
    squares = torch.zeros(1, dtype=torch.float64, device=device)
    for p in params:
        if p.grad is not None:
            squares += p.grad.detach().double().pow(2).sum()
    return squares
