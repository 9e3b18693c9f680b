"""The all-to-all and the all-reduce as autograd functions, for the layers built on them.

An all-to-all is a permutation of blocks between ranks: rank r's block j
becomes rank j's block r. Its adjoint is the inverse permutation, which is
the all-to-all again with the roles of sent and received blocks swapped.
So the backward of an all-to-all is an all-to-all of the gradients, the
same bytes the other way (expert parallel's dispatch and combine, Ulysses'
sequence <-> heads transpose all rely on it).

An all-reduce whose result every rank goes on to use (y = sum_r x_r on every
rank) has the all-reduce of the gradients as its adjoint:
d/dx_r sum_q L_q(y) = sum_q dL_q/dy. (Megatron's f and g in
dt.parallel.tensor are the two halves of this for replicated regions.)

Every move is dt's own collective (dt.all_to_all_single, dt.all_reduce).
`label` charges the traffic, forward and backward, to the layer that caused
it in dt.traffic()'s by_collective ("moe", "ulysses"), so a trainer can say
how many bytes each parallelism moved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from dt.collectives import all_reduce, all_to_all_single
from dt.transport import Group, charged_to, resolve_group

__all__ = ["all_reduce_sum", "all_to_all"]


def _exchange(flat: torch.Tensor, send: list[int], recv: list[int], g: Group, label: str) -> torch.Tensor:
    out = flat.new_empty(sum(recv))
    with charged_to(label, "all_to_all"):
        all_to_all_single(out, flat.contiguous(), recv, send, group=g)
    return out


class _AllToAll(torch.autograd.Function):
    """Flat buffers: send[j] numbers to rank j, recv[j] from it; backward swaps the two."""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, send: list[int], recv: list[int], g: Group,
                label: str) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.g, ctx.label = send, recv, g, label
        return _exchange(flat, send, recv, g, label)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _exchange(grad, ctx.recv, ctx.send, ctx.g, ctx.label), None, None, None, None


def all_to_all(blocks: Sequence[torch.Tensor], shapes: Sequence[Sequence[int]],
               group: Any = None, label: str = "all_to_all") -> list[torch.Tensor]:
    """Send blocks[j] to rank j; return the block of every rank j, shaped shapes[j].

    Blocks may differ in size (the receiver must know each size: the MoE layer
    exchanges its counts first, Ulysses knows them from the sequence layout).
    Differentiable: backward sends each block's gradient back to its sender.
    Cost: one dt.all_to_all (pairwise: p-1 steps, every block but one's own sent).
    """
    g = resolve_group(group)
    if len(blocks) != g.size or len(shapes) != g.size:
        raise ValueError(f"rank {g.ranks[g.rank]}: all_to_all needs one block and one shape per rank "
                         f"of the group ({g.size}), got {len(blocks)} and {len(shapes)}")
    recv = [math.prod(s) for s in shapes]
    if g.size == 1:
        return [blocks[0].reshape(tuple(shapes[0]))]
    flat = torch.cat([b.reshape(-1) for b in blocks])
    out = _AllToAll.apply(flat, [b.numel() for b in blocks], recv, g, label)
    return [piece.view(tuple(s)) for piece, s in zip(out.split(recv), shapes)]


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, label: str) -> torch.Tensor:
        ctx.g, ctx.label = g, label
        out = x.clone(memory_format=torch.contiguous_format)
        with charged_to(label, "all_reduce"):
            all_reduce(out, group=g)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        out = grad.clone(memory_format=torch.contiguous_format)
        with charged_to(ctx.label, "all_reduce"):
            all_reduce(out, group=ctx.g)
        return out, None, None


def all_reduce_sum(x: torch.Tensor, group: Any = None, label: str = "all_reduce") -> torch.Tensor:
    """sum over the group of x, on every rank; backward all-reduces the gradients.

    Cost: one all-reduce of x forward and one of its gradient backward.
    """
    g = resolve_group(group)
    return x if g.size == 1 else _AllReduceSum.apply(x, g, label)
