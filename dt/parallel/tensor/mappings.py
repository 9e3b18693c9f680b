"""The communication at the edges of a tensor-parallel region: Megatron's f and g.

A column-parallel layer followed by a row-parallel one needs no communication
in between (layers.py); what a block does need, Megatron writes as a pair of
conjugate operators, each forward's communication the transpose of its
backward's:

    f = copy_to_region     identity forward, all-reduce backward
    g = reduce_from_region all-reduce forward, identity backward

    x -> f -> ColumnParallelLinear -> GELU -> RowParallelLinear -> g -> y

Sequence parallelism (Korthikanti et al., 2022) notices that an all-reduce
is a reduce-scatter followed by an all-gather, and moves the two halves
apart: g becomes a reduce-scatter along the sequence, so the LayerNorm and
dropout between blocks run on s/p tokens per rank, and f becomes an
all-gather along the sequence. Same bytes on the wire, p times less
activation memory outside the tensor-parallel region.

Every collective here is dt's (dt.all_reduce, dt.all_gather,
dt.reduce_scatter), written from send/recv in dt.collectives. Uneven splits
(33 outputs over 5 ranks: 7, 7, 7, 6, 6) use dt.layout.split_sizes, the
same arithmetic the collectives use, so every rank agrees on every shard.

Tensors are batch first, [batch, sequence, hidden] (SEQUENCE_DIM = 1).

Cost notation in the docstrings: p ranks in the group, n the bytes of the
tensor being communicated (b*s*h*itemsize for an activation). Per rank,
sent bytes (dt.cost):

    all-reduce, ring       2(p-1)/p * n     (cost.ring_all_reduce)
    all-reduce, naive      (p-1)n at the root, n elsewhere (naive_all_reduce)
    all-gather / reduce-scatter, ring   (p-1)/p * n  (n = the full tensor)

dt's algorithm="auto" picks among these by the cost model's predicted time
(dt.collectives.auto); `collective_bytes` below gives the exact figure for
whichever it picks, from dt.cost.traffic_for, the table dt.traffic() is
held to.
"""

from __future__ import annotations

from typing import Any

import torch

from dt import cost
from dt.collectives import all_gather, all_reduce, auto, reduce_scatter
from dt.layout import edges, split_sizes
from dt.transport import Group, resolve_group

__all__ = [
    "SEQUENCE_DIM",
    "all_reduce_bytes",
    "all_reduced",
    "collective_bytes",
    "copy_to_region",
    "gather_from_region",
    "gather_from_sequence_region",
    "gather_shards",
    "reduce_from_region",
    "reduce_scatter_shards",
    "reduce_scatter_to_sequence_region",
    "scatter_to_region",
    "scatter_to_sequence_region",
    "shard_range",
    "shard_sizes",
    "split_shard",
]


SEQUENCE_DIM = 1  # tensors are [batch, sequence, hidden]


# ----------------------------------------------------------------------------
# Shards: who holds what. One function, used by every layer and every collective.
# ----------------------------------------------------------------------------


def shard_range(size: int, group: Any = None) -> tuple[int, int]:
    """[start, stop) of this rank's contiguous shard of `size` items (split_sizes layout)."""
    g = resolve_group(group)
    start, stop = edges(split_sizes(size, g.size))[g.rank:g.rank + 2]
    return start, stop


def shard_sizes(full: int | None, local: int, g: Group, sizes: list[int] | None) -> list[int]:
    """Every rank's shard size, for gathering shards of which this rank holds `local`.

    Given explicitly, or split_sizes(full), or (neither) equal shards of `local`.
    """
    if sizes is None:
        sizes = split_sizes(full, g.size) if full is not None else [local] * g.size
    sizes = list(sizes)
    if len(sizes) != g.size or sizes[g.rank] != local:
        raise ValueError(f"rank {g.rank} holds a shard of {local} but the shard sizes are {sizes} "
                         f"for a group of {g.size}")
    return sizes


# ----------------------------------------------------------------------------
# The raw moves (no autograd): split, all-gather, reduce-scatter, all-reduce.
# ----------------------------------------------------------------------------


def split_shard(x: torch.Tensor, dim: int, sizes: list[int], g: Group) -> torch.Tensor:
    """This rank's slice of x along dim. No communication."""
    return x.narrow(dim, edges(sizes)[g.rank], sizes[g.rank]).contiguous()


def gather_shards(x: torch.Tensor, dim: int, sizes: list[int], g: Group) -> torch.Tensor:
    """Concatenate every rank's x along dim (shards may differ in length).

    dt.all_gather moves flat buffers, so the split dimension is moved to the
    front first: each rank's shard is then one contiguous block.
    Cost: ring all-gather, (p-1)/p of the gathered tensor sent per rank.
    """
    if g.size == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    parts = [front.new_empty((n, *front.shape[1:])) for n in sizes]
    all_gather(parts, front, group=g)
    return torch.cat(parts, 0).movedim(0, dim).contiguous()


def reduce_scatter_shards(x: torch.Tensor, dim: int, sizes: list[int], g: Group) -> torch.Tensor:
    """Sum x over the group and keep this rank's slice along dim.

    Cost: ring reduce-scatter, (p-1)/p of x sent per rank.
    """
    if g.size == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((sizes[g.rank], *front.shape[1:]))
    reduce_scatter(out, list(front.split(sizes, 0)), group=g)
    return out.movedim(0, dim).contiguous()


def all_reduced(x: torch.Tensor, g: Group) -> torch.Tensor:
    """Sum x over the group into a new tensor (the autograd graph may still need x)."""
    if g.size == 1:
        return x
    out = x.clone(memory_format=torch.contiguous_format)
    all_reduce(out, group=g)
    return out


def collective_bytes(collective: str, numels: int | list[int], itemsize: int, group: Any = None,
                     algorithm: str = "auto") -> int:
    """Bytes this rank sends for one dt collective, from dt.cost.traffic_for.

    `numels`: the tensor's element count for all_reduce; every rank's shard
    for all_gather / reduce_scatter (one int: equal shards). "auto" resolves
    as dt.collectives.auto does for this size and group, so the figure is the
    one dt.traffic() counts.
    """
    g = resolve_group(group)
    if g.size == 1:
        return 0
    if collective == "all_reduce":
        count: int | list[int] = numels if isinstance(numels, int) else sum(numels)
        total = count
    else:
        count = [numels] * g.size if isinstance(numels, int) else list(numels)
        total = sum(count)
    algo = auto.choose(collective, algorithm, total * itemsize, g)
    try:
        return cost.traffic_for(collective, algo, count, itemsize, g.size, g.rank,
                                stage_bytes=auto.stage_bytes(g)).bytes_sent
    except KeyError:
        raise ValueError(f"no per-rank cost model for {collective} {algo!r}") from None


def all_reduce_bytes(numel: int, itemsize: int, group: Any = None, algorithm: str = "auto") -> int:
    """Bytes this rank sends for one dt.all_reduce of `numel` elements (dt.cost)."""
    return collective_bytes("all_reduce", numel, itemsize, group, algorithm)


# ----------------------------------------------------------------------------
# The conjugate operators as autograd functions.
# Each forward's communication is the transpose of its backward's.
# ----------------------------------------------------------------------------


class _CopyToRegion(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group) -> torch.Tensor:
        ctx.g = g
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduced(grad, ctx.g), None


class _ReduceFromRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group) -> torch.Tensor:
        return all_reduced(x, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    """All-gather forward, split backward (along `dim`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes = g, dim, sizes
        return gather_shards(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return split_shard(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


class _ScatterToRegion(torch.autograd.Function):
    """Split forward, all-gather backward (along `dim`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes = g, dim, sizes
        return split_shard(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return gather_shards(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


class _GatherFromSequenceRegion(torch.autograd.Function):
    """All-gather forward, reduce-scatter backward (along `dim`).

    The backward reduce-scatters because what follows is tensor parallel: each
    rank's gradient of the gathered tensor is a partial sum (with
    `tensor_parallel_output_grad=False` the consumer is replicated and the
    backward is a plain split).
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int],
                tensor_parallel_output_grad: bool) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes, ctx.reduce = g, dim, sizes, tensor_parallel_output_grad
        return gather_shards(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.reduce:
            return reduce_scatter_shards(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None, None
        return split_shard(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward (along `dim`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes = g, dim, sizes
        return reduce_scatter_shards(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return gather_shards(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


def copy_to_region(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Megatron's f: identity forward; backward all-reduces the gradient.

    Cost: forward nothing; backward one all-reduce of x's size.
    """
    return _CopyToRegion.apply(x, resolve_group(group))


def reduce_from_region(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Megatron's g: all-reduce forward; identity backward.

    Cost: forward one all-reduce of x's size; backward nothing.
    """
    return _ReduceFromRegion.apply(x, resolve_group(group))


def gather_from_region(x: torch.Tensor, group: Any = None, *, dim: int = -1,
                       sizes: list[int] | None = None, full_size: int | None = None) -> torch.Tensor:
    """All-gather the shards of the last (or `dim`) dimension; backward keeps this rank's slice.

    Every rank's shard size is needed to receive it: pass `full_size` (shards
    laid out by split_sizes) or `sizes`; with neither, shards are taken as equal.
    Cost: forward one all-gather, (p-1)/p of the gathered tensor sent per rank
    (ring); backward nothing.
    """
    g = resolve_group(group)
    return _GatherFromRegion.apply(x, g, dim, shard_sizes(full_size, x.shape[dim], g, sizes))


def scatter_to_region(x: torch.Tensor, group: Any = None, *, dim: int = -1,
                      sizes: list[int] | None = None) -> torch.Tensor:
    """Keep this rank's slice of the last (or `dim`) dimension; backward all-gathers.

    Cost: forward nothing; backward one all-gather of x's gradient.
    """
    g = resolve_group(group)
    full = x.shape[dim]
    if sizes is None:
        sizes = split_sizes(full, g.size)
    elif len(sizes) != g.size or sum(sizes) != full:
        raise ValueError(f"shard sizes {list(sizes)} must be {g.size} numbers summing to {full}")
    return _ScatterToRegion.apply(x, g, dim, list(sizes))


def scatter_to_sequence_region(x: torch.Tensor, group: Any = None, *,
                               dim: int = SEQUENCE_DIM) -> torch.Tensor:
    """Enter a sequence-parallel region: keep this rank's tokens; backward all-gathers them."""
    return scatter_to_region(x, group, dim=dim)


def gather_from_sequence_region(x: torch.Tensor, group: Any = None, *, dim: int = SEQUENCE_DIM,
                                seq_len: int | None = None,
                                tensor_parallel_output_grad: bool = True) -> torch.Tensor:
    """All-gather the sequence shards; backward reduce-scatters (or splits) the gradient.

    This is the first half of f under sequence parallelism (before a column
    parallel layer). Pass `seq_len` when the sequence does not split evenly.
    Cost: forward one all-gather, backward one reduce-scatter: (p-1)/p of the
    full [b, s, h] tensor each, together the bytes of one ring all-reduce.
    """
    g = resolve_group(group)
    return _GatherFromSequenceRegion.apply(x, g, dim, shard_sizes(seq_len, x.shape[dim], g, None),
                                           tensor_parallel_output_grad)


def reduce_scatter_to_sequence_region(x: torch.Tensor, group: Any = None, *,
                                      dim: int = SEQUENCE_DIM) -> torch.Tensor:
    """Sum partial outputs and keep this rank's tokens; backward all-gathers the gradient.

    This is g under sequence parallelism (after a row parallel layer).
    Cost: forward one reduce-scatter, backward one all-gather, (p-1)/p of the
    full tensor each.
    """
    g = resolve_group(group)
    return _ReduceScatterToSequenceRegion.apply(x, g, dim,
                                                split_sizes(x.shape[dim], g.size))
