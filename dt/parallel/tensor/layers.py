"""The parallel layers: a linear layer split by output rows or by input columns, and what they make.

A linear layer y = x W^T + b can be split two ways over p ranks:

- column parallel: each rank holds a slice of W's *output* rows. Every rank
  needs the whole input x and produces a slice of y. No communication in
  forward; in backward the input gradients of the p slices are partial sums,
  so they are all-reduced (f, mappings.py).
- row parallel: each rank holds a slice of W's *input* columns and the
  matching slice of x. Every rank produces a partial y of full width; the
  partials are all-reduced in forward (g); backward needs nothing.

Initialisation convention: a layer constructed right after torch.manual_seed(s)
holds exactly the slices of the torch.nn.Linear constructed right after the
same seed: the full weight is made on every rank, then split, as Megatron's
`_initialize_affine_weight_cpu` does. That costs the full weight's memory
once at construction, and buys a sharded model that can be checked against
its unsharded twin (tests/twins.py) to the last bit. `full=` hands a layer
an existing nn.Linear to slice instead (dt.parallelize's module swaps).

Replicated parameters (the row-parallel bias, LayerNorms outside sequence
parallelism) get identical gradients on every rank of the group, so they
need no synchronisation of their own; under sequence parallelism each rank
sees only its tokens, so SequenceParallelLayerNorm all-reduces theirs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.layout import split_sizes
from dt.parallel.tensor.mappings import (
    copy_to_region,
    gather_from_region,
    gather_from_sequence_region,
    gather_shards,
    reduce_from_region,
    reduce_scatter_to_sequence_region,
    scatter_to_region,
    shard_range,
)
from dt.transport import resolve_group

__all__ = ["ColumnParallelLinear", "ParallelMLP", "RowParallelLinear", "SequenceParallelLayerNorm"]


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
                 device: Any = None, full: nn.Linear | None = None):
        super().__init__()
        self.group = resolve_group(group)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel
        self.sizes = split_sizes(out_features, self.group.size)
        start, stop = shard_range(out_features, self.group)
        self.output_size_per_partition = stop - start
        self.shard_dims = {"weight": 0, "bias": 0}  # split along these dims, by self.sizes (checkpoints)
        full = full if full is not None else _full_linear(in_features, out_features, bias, dtype, device)
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
        return gather_shards(self.weight.detach(), 0, self.sizes, self.group)

    def full_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else gather_shards(self.bias.detach(), 0, self.sizes, self.group)

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
                 device: Any = None, full: nn.Linear | None = None):
        super().__init__()
        self.group = resolve_group(group)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.sizes = split_sizes(in_features, self.group.size)
        start, stop = shard_range(in_features, self.group)
        self.input_size_per_partition = stop - start
        self.shard_dims = {"weight": 1}  # the bias is whole on every rank
        full = full if full is not None else _full_linear(in_features, out_features, bias, dtype, device)
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
        return gather_shards(self.weight.detach(), 1, self.sizes, self.group)

    def full_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.detach().clone()

    def extra_repr(self) -> str:
        return (f"in={self.in_features} (this rank {self.input_size_per_partition} of "
                f"{self.sizes}), out={self.out_features}, bias={self.bias is not None}")


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
