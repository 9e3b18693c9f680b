"""Tensor parallelism (Megatron-LM): one layer's matrices split across a group.

A linear layer y = x W^T + b can be split two ways over p ranks:

- column parallel: each rank holds a slice of W's *output* rows. Every rank
  needs the whole input x and produces a slice of y. No communication in
  forward; in backward the input gradients of the p slices are partial sums,
  so they are all-reduced.
- row parallel: each rank holds a slice of W's *input* columns and the
  matching slice of x. Every rank produces a partial y of full width; the
  partials are all-reduced in forward; backward needs nothing.

Column followed by row (an MLP, or attention's QKV then output projection)
needs no communication in between: the column layer's output slice is exactly
the row layer's input slice. So a whole block costs one all-reduce forward
and one backward. Megatron writes that as a pair of conjugate operators:

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
(33 outputs over 5 ranks: 7, 7, 7, 6, 6) use dt.cost.split_sizes, the
same arithmetic the collectives use, so every rank agrees on every shard.

Tensors are batch first, [batch, sequence, hidden] (SEQUENCE_DIM = 1).

Initialisation convention: a layer constructed right after torch.manual_seed(s)
holds exactly the slices of the torch.nn.Linear (or nn.Embedding) constructed
right after the same seed: the full weight is made on every rank, then split,
as Megatron's `_initialize_affine_weight_cpu` does. That costs the full
weight's memory once at construction, and buys a sharded model that can be
checked against its unsharded twin (`MLP`, `SelfAttention` below) to the
last bit.

Cost notation in the docstrings: p ranks in the group, n the bytes of the
tensor being communicated (b*s*h*itemsize for an activation). Per rank,
sent bytes (dt.cost):

    all-reduce, ring       2(p-1)/p * n     (cost.ring_all_reduce)
    all-reduce, naive      (p-1)n at the root, n elsewhere (naive_all_reduce)
    all-gather / reduce-scatter, ring   (p-1)/p * n  (n = the full tensor)

dt's algorithm="auto" picks among these by the cost model's predicted time
(dt.collectives.auto); `collective_bytes` below gives the exact figure for
whichever it picks.

Worked example (GPT-2 small, h = 768, 8 sequences of 1024 tokens, float32):
one activation is n = 8*1024*768*4 = 25.2 MB. A transformer layer has two
tensor-parallel blocks (attention, MLP), so it runs 2 all-reduces forward and
2 backward; at p = 4 each sends 2*(3/4)*25.2 = 37.7 MB per rank, 151 MB per
layer per step, whatever the layer's parameter count. That is why tensor
parallelism stays inside a node, where links are fastest.

Replicated parameters (the row-parallel bias, LayerNorms outside sequence
parallelism) get identical gradients on every rank of the group, so they
need no synchronisation of their own.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt import cost
from dt.collectives import all_gather, all_reduce, auto, reduce_scatter
from dt.collectives.ops import ReduceOp
from dt.transport import Group, resolve_group

__all__ = [
    "SEQUENCE_DIM",
    "ColumnParallelLinear",
    "MLP",
    "ParallelMLP",
    "ParallelSelfAttention",
    "RowParallelLinear",
    "SelfAttention",
    "SequenceParallelLayerNorm",
    "VocabParallelEmbedding",
    "all_reduce_bytes",
    "collective_bytes",
    "copy_to_region",
    "gather_from_region",
    "gather_from_sequence_region",
    "parallel_lm_logits",
    "reduce_from_region",
    "reduce_scatter_to_sequence_region",
    "scatter_to_region",
    "scatter_to_sequence_region",
    "shard_range",
    "vocab_parallel_cross_entropy",
]

SEQUENCE_DIM = 1  # tensors are [batch, sequence, hidden]


# ----------------------------------------------------------------------------
# Shards: who holds what. One function, used by every layer and every collective.
# ----------------------------------------------------------------------------


def shard_range(size: int, group: Any = None) -> tuple[int, int]:
    """[start, stop) of this rank's contiguous shard of `size` items (split_sizes layout)."""
    g = resolve_group(group)
    sizes = cost.split_sizes(size, g.size)
    start = sum(sizes[: g.rank])
    return start, start + sizes[g.rank]


def _sizes(full: int | None, local: int, g: Group, sizes: list[int] | None) -> list[int]:
    """Every rank's shard size, for gathering shards of which this rank holds `local`.

    Given explicitly, or split_sizes(full), or (neither) equal shards of `local`.
    """
    if sizes is None:
        sizes = cost.split_sizes(full, g.size) if full is not None else [local] * g.size
    sizes = list(sizes)
    if len(sizes) != g.size or sizes[g.rank] != local:
        raise ValueError(f"rank {g.rank} holds a shard of {local} but the shard sizes are {sizes} "
                         f"for a group of {g.size}")
    return sizes


# ----------------------------------------------------------------------------
# The raw moves (no autograd): split, all-gather, reduce-scatter, all-reduce.
# ----------------------------------------------------------------------------


def _split(x: torch.Tensor, dim: int, sizes: list[int], g: Group) -> torch.Tensor:
    """This rank's slice of x along dim. No communication."""
    start = sum(sizes[: g.rank])
    return x.narrow(dim, start, sizes[g.rank]).contiguous()


def _gather(x: torch.Tensor, dim: int, sizes: list[int], g: Group) -> torch.Tensor:
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


def _reduce_scatter(x: torch.Tensor, dim: int, sizes: list[int], g: Group) -> torch.Tensor:
    """Sum x over the group and keep this rank's slice along dim.

    Cost: ring reduce-scatter, (p-1)/p of x sent per rank.
    """
    if g.size == 1:
        return x
    front = x.movedim(dim, 0).contiguous()
    out = front.new_empty((sizes[g.rank], *front.shape[1:]))
    reduce_scatter(out, list(front.split(sizes, 0)), group=g)
    return out.movedim(0, dim).contiguous()


def _all_reduce(x: torch.Tensor, g: Group) -> torch.Tensor:
    """Sum x over the group into a new tensor (the autograd graph may still need x)."""
    if g.size == 1:
        return x
    out = x.clone(memory_format=torch.contiguous_format)
    all_reduce(out, group=g)
    return out


_PER_RANK = {  # dt.cost's per-rank arithmetic for the algorithms these layers can run
    ("all_reduce", "ring"): lambda n, item, g: cost.ring_all_reduce(n[0], item, g.size, g.rank),
    ("all_reduce", "naive"): lambda n, item, g: cost.naive_all_reduce(n[0], item, g.size, g.rank),
    ("all_reduce", "recursive_doubling"):
        lambda n, item, g: cost.recursive_doubling_all_reduce(n[0], item, g.size, g.rank),
    ("all_reduce", "rabenseifner"):
        lambda n, item, g: cost.rabenseifner_all_reduce(n[0], item, g.size, g.rank),
    ("all_gather", "ring"): lambda n, item, g: cost.ring_all_gather(n, item, g.rank),
    ("all_gather", "recursive_doubling"):
        lambda n, item, g: cost.recursive_doubling_all_gather(n, item, g.rank),
    ("all_gather", "bruck"):  # equal blocks; uneven ones fall back to the ring
        lambda n, item, g: (cost.bruck_all_gather(n[0], item, g.size) if len(set(n)) == 1
                            else cost.ring_all_gather(n, item, g.rank)),
    ("reduce_scatter", "ring"): lambda n, item, g: cost.ring_reduce_scatter(n, item, g.rank),
}


def collective_bytes(collective: str, numels: int | list[int], itemsize: int, group: Any = None,
                     algorithm: str = "auto") -> int:
    """Bytes this rank sends for one dt collective, from dt.cost.

    `numels`: the tensor's element count for all_reduce; every rank's shard
    for all_gather / reduce_scatter. "auto" resolves as dt.collectives.auto
    does for this size and group, so the figure is the one dt.traffic() counts.
    """
    g = resolve_group(group)
    if g.size == 1:
        return 0
    sizes = [numels] if isinstance(numels, int) else list(numels)
    algo = auto.choose(collective, algorithm, sum(sizes) * itemsize, g.size)
    try:
        model = _PER_RANK[(collective, algo)]
    except KeyError:
        raise ValueError(f"no per-rank cost model here for {collective} {algo!r}") from None
    return model(sizes, itemsize, g).bytes_sent


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
        return _all_reduce(grad, ctx.g), None


class _ReduceFromRegion(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group) -> torch.Tensor:
        return _all_reduce(x, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromRegion(torch.autograd.Function):
    """All-gather forward, split backward (along `dim`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes = g, dim, sizes
        return _gather(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _split(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


class _ScatterToRegion(torch.autograd.Function):
    """Split forward, all-gather backward (along `dim`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes = g, dim, sizes
        return _split(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _gather(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


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
        return _gather(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.reduce:
            return _reduce_scatter(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None, None
        return _split(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None, None


class _ReduceScatterToSequenceRegion(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward (along `dim`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, dim: int, sizes: list[int]) -> torch.Tensor:
        ctx.g, ctx.dim, ctx.sizes = g, dim, sizes
        return _reduce_scatter(x, dim, sizes, g)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _gather(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


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
    return _GatherFromRegion.apply(x, g, dim, _sizes(full_size, x.shape[dim], g, sizes))


def scatter_to_region(x: torch.Tensor, group: Any = None, *, dim: int = -1,
                      sizes: list[int] | None = None) -> torch.Tensor:
    """Keep this rank's slice of the last (or `dim`) dimension; backward all-gathers.

    Cost: forward nothing; backward one all-gather of x's gradient.
    """
    g = resolve_group(group)
    full = x.shape[dim]
    if sizes is None:
        sizes = cost.split_sizes(full, g.size)
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
    return _GatherFromSequenceRegion.apply(x, g, dim, _sizes(seq_len, x.shape[dim], g, None),
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
                                                cost.split_sizes(x.shape[dim], g.size))


# ----------------------------------------------------------------------------
# Linear layers.
# ----------------------------------------------------------------------------


def _full_linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype | None,
                 device: Any) -> nn.Linear:
    """The unsharded layer every rank builds from the same RNG state, then slices."""
    return nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's output rows split across the group.

    Rank r holds rows shard_range(out_features) of W and b, and computes that
    slice of y from the full x. The input goes through f (copy_to_region), so
    backward all-reduces the input gradient: each rank's grad_x = grad_y_r W_r
    is only its slice's contribution.

    gather_output=True all-gathers y (uneven slices included); the default
    leaves it split, ready for a RowParallelLinear.
    sequence_parallel=True: the input is this rank's sequence shard
    [b, s/p, in]; it is all-gathered along the sequence before the matmul and
    the gradient reduce-scattered back, in place of f's all-reduce.

    Cost per rank (n = bytes of x, full sequence): forward nothing (plus an
    all-gather of y when gather_output); backward one all-reduce of n
    (2(p-1)/p n with the ring). Sequence parallel: forward all-gather and
    backward reduce-scatter, (p-1)/p n each.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, group: Any = None, *,
                 sequence_parallel: bool = False, dtype: torch.dtype | None = None,
                 device: Any = None):
        super().__init__()
        self.group = resolve_group(group)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel
        self.sizes = cost.split_sizes(out_features, self.group.size)
        start, stop = shard_range(out_features, self.group)
        self.output_size_per_partition = stop - start
        full = _full_linear(in_features, out_features, bias, dtype, device)
        self.weight = nn.Parameter(full.weight.detach()[start:stop].clone())
        self.bias = nn.Parameter(full.bias.detach()[start:stop].clone()) if bias else None

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        if self.sequence_parallel:
            x = gather_from_sequence_region(x, self.group, seq_len=seq_len)
        else:
            x = copy_to_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = gather_from_region(y, self.group, sizes=self.sizes)
        return y

    def full_weight(self) -> torch.Tensor:
        """The unsharded [out, in] weight, gathered (a copy, outside autograd)."""
        return _gather(self.weight.detach(), 0, self.sizes, self.group)

    def full_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else _gather(self.bias.detach(), 0, self.sizes, self.group)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features} "
                f"(this rank {self.output_size_per_partition} of {self.sizes}), "
                f"bias={self.bias is not None}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's input columns split across the group.

    Rank r holds columns shard_range(in_features) of W and the matching slice
    of x, and computes a partial y of full width; g (reduce_from_region) sums
    the partials. The bias is replicated and added once, after the sum: added
    before it, it would be counted p times.

    input_is_parallel=False splits a full x first (backward all-gathers).
    sequence_parallel=True reduce-scatters y along the sequence instead of
    all-reducing it: each rank keeps [b, s/p, out]. The bias is then added to
    this rank's tokens only, so its gradient is partial: it goes through
    copy_to_region, whose backward all-reduces it.

    Cost per rank (n = bytes of y): forward one all-reduce of n (2(p-1)/p n
    with the ring); backward nothing. Sequence parallel: forward reduce-scatter,
    backward all-gather, (p-1)/p n each (plus the bias-gradient all-reduce).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, group: Any = None, *,
                 sequence_parallel: bool = False, dtype: torch.dtype | None = None,
                 device: Any = None):
        super().__init__()
        self.group = resolve_group(group)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.sizes = cost.split_sizes(in_features, self.group.size)
        start, stop = shard_range(in_features, self.group)
        self.input_size_per_partition = stop - start
        full = _full_linear(in_features, out_features, bias, dtype, device)
        self.weight = nn.Parameter(full.weight.detach()[:, start:stop].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_region(x, self.group, sizes=self.sizes)
        partial = F.linear(x, self.weight)  # no bias here: it would be summed p times
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_region(partial, self.group)
            bias = copy_to_region(self.bias, self.group) if self.bias is not None else None
        else:
            y = reduce_from_region(partial, self.group)
            bias = self.bias
        return y + bias if bias is not None else y

    def full_weight(self) -> torch.Tensor:
        """The unsharded [out, in] weight, gathered (a copy, outside autograd)."""
        return _gather(self.weight.detach(), 1, self.sizes, self.group)

    def full_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.detach().clone()

    def extra_repr(self) -> str:
        return (f"in={self.in_features} (this rank {self.input_size_per_partition} of "
                f"{self.sizes}), out={self.out_features}, bias={self.bias is not None}")


# ----------------------------------------------------------------------------
# MLP and self-attention, each with its unsharded twin.
# ----------------------------------------------------------------------------


class MLP(nn.Module):
    """The unsharded reference: Linear(h, ffn), GELU, Linear(ffn, h)."""

    def __init__(self, hidden: int, ffn_hidden: int | None = None, bias: bool = True, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        self.dense_h_to_4h = nn.Linear(hidden, ffn_hidden, bias=bias, dtype=dtype, device=device)
        self.dense_4h_to_h = nn.Linear(ffn_hidden, hidden, bias=bias, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class ParallelMLP(nn.Module):
    """Column parallel, GELU, row parallel: MLP split over the group.

    GELU is elementwise, so it runs on each rank's slice of the ffn_hidden
    activations with no communication: the point of splitting the first
    matrix by columns.

    Cost per rank, n = b*s*h*itemsize: forward one all-reduce of n (g),
    backward one all-reduce of n (f); 2(p-1)/p n sent each with the ring.
    With sequence_parallel the input and output are [b, s/p, h] shards and the
    two all-reduces become all-gather + reduce-scatter, (p-1)/p n each, in
    each direction (plus the small all-reduce of the output bias gradient).
    """

    def __init__(self, hidden: int, ffn_hidden: int | None = None, group: Any = None, *,
                 bias: bool = True, sequence_parallel: bool = False,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        self.dense_h_to_4h = ColumnParallelLinear(hidden, ffn_hidden, bias, gather_output=False,
                                                  group=group, sequence_parallel=sequence_parallel,
                                                  dtype=dtype, device=device)
        self.dense_4h_to_h = RowParallelLinear(ffn_hidden, hidden, bias, input_is_parallel=True,
                                               group=group, sequence_parallel=sequence_parallel,
                                               dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x, seq_len)))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over [b, heads, s, d], with a causal mask if asked."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[-2]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return scores.softmax(-1) @ v


def _split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[b, s, heads*3*d] laid out per head (q, k, v of head 0, then head 1, ...) -> three [b, heads, s, d]."""
    b, s, width = qkv.shape
    qkv = qkv.view(b, s, heads, width // heads).transpose(1, 2)
    return qkv.chunk(3, dim=-1)


class SelfAttention(nn.Module):
    """The unsharded reference: fused QKV projection, softmax attention, output projection.

    The QKV weight's rows are laid out per head, [q_0 k_0 v_0 q_1 k_1 v_1 ...]
    (Megatron's layout), so a contiguous slice of rows is a set of whole heads.
    """

    def __init__(self, hidden: int, num_heads: int, causal: bool = True, bias: bool = True, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        if hidden % num_heads:
            raise ValueError(f"hidden size {hidden} is not divisible by num_heads {num_heads}")
        self.num_heads, self.causal = num_heads, causal
        self.query_key_value = nn.Linear(hidden, 3 * hidden, bias=bias, dtype=dtype, device=device)
        self.dense = nn.Linear(hidden, hidden, bias=bias, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = _split_heads(self.query_key_value(x), self.num_heads)
        context = _attention(q, k, v, self.causal)  # [b, heads, s, d]
        b, _, s, _ = context.shape
        return self.dense(context.transpose(1, 2).reshape(b, s, -1))


class ParallelSelfAttention(nn.Module):
    """Self-attention with its heads split across the group.

    Heads are independent, so rank r computes heads
    [r*H/p, (r+1)*H/p) end to end: its slice of the fused QKV projection
    (column parallel: whole heads, thanks to the per-head layout), attention
    over those heads, and the matching input columns of the output projection
    (row parallel). num_heads must be divisible by the group size.

    Cost per rank, n = b*s*h*itemsize: forward one all-reduce of n (after the
    output projection), backward one all-reduce of n (the input gradient),
    as for the MLP. Sequence parallel: all-gather + reduce-scatter instead.
    """

    def __init__(self, hidden: int, num_heads: int, group: Any = None, causal: bool = True, *,
                 bias: bool = True, sequence_parallel: bool = False,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        g = resolve_group(group)
        if hidden % num_heads:
            raise ValueError(f"hidden size {hidden} is not divisible by num_heads {num_heads}")
        if num_heads % g.size:
            raise ValueError(f"num_heads {num_heads} is not divisible by the tensor-parallel group "
                             f"size {g.size}: attention heads are split whole across ranks")
        self.group, self.causal = g, causal
        self.num_heads = num_heads
        self.num_heads_per_partition = num_heads // g.size
        self.query_key_value = ColumnParallelLinear(hidden, 3 * hidden, bias, gather_output=False,
                                                    group=g, sequence_parallel=sequence_parallel,
                                                    dtype=dtype, device=device)
        self.dense = RowParallelLinear(hidden, hidden, bias, input_is_parallel=True, group=g,
                                       sequence_parallel=sequence_parallel, dtype=dtype,
                                       device=device)

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        q, k, v = _split_heads(self.query_key_value(x, seq_len), self.num_heads_per_partition)
        context = _attention(q, k, v, self.causal)  # [b, local heads, s, d]
        b, _, s, _ = context.shape
        return self.dense(context.transpose(1, 2).reshape(b, s, -1))


class SequenceParallelLayerNorm(nn.LayerNorm):
    """LayerNorm on this rank's sequence shard [b, s/p, h].

    The weight and bias are replicated, but each rank only sees its own
    tokens, so its gradient for them is partial; routing them through
    copy_to_region all-reduces the gradient in backward (Megatron instead
    all-reduces the grads of parameters marked sequence_parallel after
    backward, coalesced: fewer, larger messages, same bytes).
    Cost: backward two all-reduces of h elements (weight and bias).
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-5, group: Any = None, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__(normalized_shape, eps=eps, dtype=dtype, device=device)
        self.group = resolve_group(group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = copy_to_region(self.weight, self.group)
        bias = copy_to_region(self.bias, self.group)
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


# ----------------------------------------------------------------------------
# Vocabulary parallel embedding and cross-entropy.
# ----------------------------------------------------------------------------


class VocabParallelEmbedding(nn.Module):
    """An embedding table split by vocabulary rows.

    Rank r holds rows shard_range(vocab). Each rank looks up the tokens it
    owns and writes zeros for the others; g (reduce_from_region) sums the
    results, so every token gets exactly its one row.
    Cost per rank, n = b*s*dim*itemsize: forward one all-reduce of n;
    backward nothing (each rank's rows get their gradient locally).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group: Any = None, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        self.group = resolve_group(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start, self.vocab_end = shard_range(num_embeddings, self.group)
        full = nn.Embedding(num_embeddings, embedding_dim, dtype=dtype, device=device)
        self.weight = nn.Parameter(full.weight.detach()[self.vocab_start:self.vocab_end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local_ids = (ids - self.vocab_start).masked_fill(outside, 0)
        weight = self.weight
        if weight.shape[0] == 0:  # vocab smaller than the group: give index 0 a zero row
            weight = torch.cat([weight, weight.new_zeros(1, self.embedding_dim)])
        out = F.embedding(local_ids, weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_region(out, self.group)

    def full_weight(self) -> torch.Tensor:
        sizes = cost.split_sizes(self.num_embeddings, self.group.size)
        return _gather(self.weight.detach(), 0, sizes, self.group)


def parallel_lm_logits(x: torch.Tensor, weight: torch.Tensor, group: Any = None, *,
                       sequence_parallel: bool = False, seq_len: int | None = None) -> torch.Tensor:
    """This rank's slice of the vocabulary logits, x @ weight_r^T, for a tied head.

    `weight` is a VocabParallelEmbedding's shard [V_r, h]: the same rows a
    ColumnParallelLinear(h, V) would hold, so the embedding and the output
    head share one split table. Feed the result to vocab_parallel_cross_entropy.
    Cost: as ColumnParallelLinear's input: backward one all-reduce of x
    (sequence parallel: forward all-gather, backward reduce-scatter).
    """
    if sequence_parallel:
        x = gather_from_sequence_region(x, group, seq_len=seq_len)
    else:
        x = copy_to_region(x, group)
    return F.linear(x, weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary, never gathering them.

    loss = log(sum_j exp(z_j - m)) - (z_target - m), m = max_j z_j, where each
    sum, max and the target logit are assembled from per-rank pieces with
    three all-reduces of b*s numbers (not b*s*V).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, g: Group,
                vocab_start: int) -> torch.Tensor:
        vocab_end = vocab_start + logits.shape[-1]
        # 1. the global max, for a numerically safe exp
        if logits.shape[-1]:
            logits_max = logits.amax(dim=-1)
        else:  # this rank holds no vocabulary entries
            logits_max = logits.new_full(logits.shape[:-1], float("-inf"))
        if g.size > 1:
            all_reduce(logits_max, op=ReduceOp.MAX, group=g)
        shifted = logits - logits_max.unsqueeze(-1)

        # 2. the target's logit: only the rank that owns the target id has it
        outside = (target < vocab_start) | (target >= vocab_end)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        if logits.shape[-1]:
            target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
            target_logit = target_logit.masked_fill(outside, 0.0)
        else:
            target_logit = shifted.new_zeros(shifted.shape[:-1])
        if g.size > 1:
            all_reduce(target_logit, group=g)

        # 3. the softmax denominator
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        if g.size > 1:
            all_reduce(sum_exp, group=g)

        loss = sum_exp.log() - target_logit
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        # d loss / d z_j = softmax_j - [j == target]: local to each rank's slice.
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax.clone()
        if grad.shape[-1]:
            owned = (~outside).to(grad.dtype)
            grad.scatter_add_(-1, local_target.unsqueeze(-1), -owned.unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor,
                                 group: Any = None, *, vocab_size: int | None = None
                                 ) -> torch.Tensor:
    """Per-token cross-entropy from logits split by vocabulary ([..., V_r] on rank r).

    `target` holds global token ids ([...]); returns the per-token loss [...]
    (take .mean() for F.cross_entropy's default). The shards are laid out by
    split_sizes(vocab_size): pass `vocab_size` when they are uneven (with
    none, equal shards are assumed). Backward is local: softmax minus one-hot.

    Cost per rank, n = b*s*itemsize: forward three all-reduces of n (max,
    target logit, sum of exponentials) instead of gathering b*s*V logits;
    backward nothing.
    """
    g = resolve_group(group)
    local = local_logits.shape[-1]
    sizes = _sizes(vocab_size, local, g, None)
    if sizes[g.rank] != local:
        raise ValueError(f"rank {g.rank} holds {local} logits but split_sizes({vocab_size}, "
                         f"{g.size}) gives it {sizes[g.rank]}")
    return _VocabParallelCrossEntropy.apply(local_logits, target, g, sum(sizes[: g.rank]))
