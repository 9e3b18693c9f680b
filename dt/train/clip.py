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

Under ZeRO (clip_sharded_norm) each rank of the dp x cp plane holds only its
shard of the averaged gradient (dt.parallel.zero.ZeroOptimizer.shard_pieces),
so the plane's ranks hold different pieces: each sums the squares of the
pieces of the parameters it counts, the sum is all-reduced over the plane
(one float64), then over pp x tp as above. The scale multiplies the shards,
which are all the gradient there is; the step that follows updates from them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dt.collectives import all_reduce
from dt.collectives.ops import ReduceOp

__all__ = ["counted_parameters", "clip_global_norm", "clip_sharded_norm"]


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
    squares = _squares([p.grad for p in counted if id(p) not in apart], device)
    if split_group is not None:  # every rank of the group calls, holding experts or not
        split_squares = _squares([p.grad for p in counted if id(p) in apart], device)
        all_reduce(split_squares, ReduceOp.SUM, split_group)
        squares += split_squares
    return _scale(squares, [p.grad for p in every], max_norm, group)


@torch.no_grad()
def clip_sharded_norm(pieces: Sequence[tuple[nn.Parameter, torch.Tensor]], counted: Sequence[nn.Parameter],
                      shards: Sequence[torch.Tensor], max_norm: float, plane_group: object, group: object,
                      device: torch.device) -> float:
    """ZeRO's clip: scale the `shards` so the global norm is at most max_norm; the norm before.

    `pieces`: (parameter, its part of this rank's shard gradient) (ZeroOptimizer.shard_pieces);
    those of `counted` parameters are summed, over `plane_group` (dp x cp, whose ranks hold
    different pieces), then over `group` (pp x tp).
    """
    mine = {id(p) for p in counted}
    squares = _squares([g for p, g in pieces if id(p) in mine], device)
    all_reduce(squares, ReduceOp.SUM, plane_group)
    return _scale(squares, shards, max_norm, group)


def _scale(squares: torch.Tensor, grads: Sequence[torch.Tensor | None], max_norm: float,
           group: object) -> float:
    """Sum `squares` over `group`, then scale `grads` by min(1, max_norm / norm); the norm."""
    all_reduce(squares, ReduceOp.SUM, group)
    norm = float(squares.sqrt())
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for g in grads:
            if g is not None:
                g.mul_(scale)
    return norm


def _squares(grads: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """The sum of the squares of `grads`, in float64."""
    squares = torch.zeros(1, dtype=torch.float64, device=device)
    for g in grads:
        if g is not None:
            squares += g.detach().double().pow(2).sum()
    return squares
