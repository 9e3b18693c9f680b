"""Tensor-parallel styles: how one plain module becomes its tensor-parallel self.

A style takes a plain module (nn.Linear, nn.Embedding, a language-model head)
and returns dt's parallel layer holding this rank's slices of the very same
weights, so a plain model and its parallel twin compute the same function:

    ColwiseParallel()         nn.Linear -> ColumnParallelLinear (output rows split; f before)
    RowwiseParallel()         nn.Linear -> RowParallelLinear (input columns split; g after)
    VocabParallel()           nn.Embedding -> VocabParallelEmbedding (vocabulary rows split)
    VocabParallelHead()       norm + tied projection -> ParallelLMHead (the same rows as the embedding)
    FusedColwiseParallel(3)   a fused q | k | v projection, each rank its slice of each block
    FusedAttentionParallel()  GPT-2's attention: fused QKV and output split, its split width divided

Sequence parallel (Korthikanti et al.; dt.parallel.tensor.mappings): between
blocks each rank keeps s/p tokens. ShardSequence() marks where that starts
(a hook on the embedding's output), SequenceParallelNorm() runs a LayerNorm
there, and Colwise/Rowwise/VocabParallelHead(sequence_parallel=True) all-gather
the tokens going in and reduce-scatter them coming out, in place of f and g.

GPT-2's Conv1D (Hugging Face: y = x W + b with W [in, out]) is taken as the
nn.Linear it is, transposed: its parallel layer holds [out, in] slices.

Column then row is Megatron's block: one all-reduce forward, one backward
(dt.parallel.tensor). A style never draws random numbers: the weights come
from the module it replaces.

Tied weights: `ties` maps a replaced parameter to the shard that replaced
it, for as long as that parameter lives (a weak reference: each replaced
layer's whole weights are freed as soon as it is swapped out, so building
holds the plain model and one layer's copy, not two models). A head whose
weight is the embedding's (tied) takes the embedding's shard itself, not a
copy, so the two stay one parameter: the embedding's rows and the head's
logits are the same vocabulary slice.

Logits: ColwiseParallel(gather_output=True) and VocabParallelHead() by
default all-gather the vocabulary slices, so the model's own loss runs on the
whole logits unchanged (its backward keeps each rank's slice of the gradient).
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.layout import split_sizes
from dt.parallel.grid import SPLITS, Grid
from dt.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, SequenceParallelLayerNorm
from dt.parallel.tensor.mappings import (
    SEQUENCE_DIM,
    copy_to_region,
    gather_from_region,
    gather_from_sequence_region,
    scatter_to_sequence_region,
    shard_range,
)
from dt.parallel.tensor.vocab import VocabParallelEmbedding
from dt.transport import Group, resolve_group

__all__ = ["ColwiseParallel", "FusedAttentionParallel", "FusedColwiseParallel", "ParallelLMHead",
           "RowwiseParallel", "SequenceParallelNorm", "ShardSequence", "Style", "Ties",
           "VocabParallel", "VocabParallelHead"]


class Ties:
    """Which shard replaced each parameter a swap replaced, while the replaced one lives.

    Keyed by identity; the weak reference makes an entry end with its parameter (whose id a new
    tensor may then take), so the swap need not keep every replaced layer alive.
    """

    def __init__(self) -> None:
        self._shards: dict[int, tuple[weakref.ref[nn.Parameter], nn.Parameter]] = {}

    def get(self, old: nn.Parameter) -> nn.Parameter | None:
        entry = self._shards.get(id(old))
        return entry[1] if entry is not None and entry[0]() is old else None

    def record(self, old: nn.Parameter, shard: nn.Parameter) -> None:
        self._shards[id(old)] = (weakref.ref(old), shard)


class Style(ABC):
    """Turns `module` (named `name` in its model) into its parallel self on `group`."""

    replaces = True  # False: the style only hooks the module, so modules inside it may be styled too
    axis: str | None = None  # the grid axis its group runs along; None: dt.parallelize's axis=

    def group_on(self, grid: Grid, axis: str | None) -> Any:
        """What apply's `group` is on `grid` (a dt.Grid): by default the group along self.axis
        (or `axis`). A style needing more than one group (experts under context
        parallelism) returns what it needs; collective over the world, as Grid.group is."""
        name = self.axis or axis
        # An axis the grid does not have is one of size 1: each rank alone (Grid.group() of no axes).
        has = name in grid.sizes or name in SPLITS
        return resolve_group(grid.group(name) if has else grid.group())

    @abstractmethod
    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        """The parallel module to put in `module`'s place; records replaced parameters in `ties`."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _expect(module: nn.Module, kind: type, style: Style, name: str) -> None:
    if type(module) is not kind:  # a subclass may compute something else: refuse, don't guess
        raise ValueError(f"{name}: {type(style).__name__} splits a torch.nn.{kind.__name__}, "
                         f"found {type(module).__name__}")


def _as_linear(module: nn.Module, style: Style, name: str) -> nn.Linear:
    """`module` as an nn.Linear: itself, or GPT-2's Conv1D (y = x W + b, W [in, out]) transposed."""
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None \
            and tuple(module.weight.shape) == (module.nx, module.nf):
        linear = nn.Linear(module.nx, module.nf, bias=module.bias is not None, device="meta")
        linear.weight = nn.Parameter(module.weight.detach().t().contiguous())
        linear.bias = None if module.bias is None else nn.Parameter(module.bias.detach())
        return linear
    _expect(module, nn.Linear, style, name)
    return module


def _tie(layer: nn.Module, attr: str, old: nn.Parameter, ties: Ties) -> None:
    """Use the shard that replaced `old`, if one did (a tied weight stays one parameter)."""
    shard = ties.get(old)
    if shard is not None:
        if shard.shape != getattr(layer, attr).shape:  # e.g. tied to both a row and a column split
            raise ValueError(f"a tied weight is split two ways: {tuple(shard.shape)} on one side, "
                             f"{tuple(getattr(layer, attr).shape)} on the other")
        setattr(layer, attr, shard)
    ties.record(old, getattr(layer, attr))


class ColwiseParallel(Style):
    """nn.Linear (or Conv1D) -> ColumnParallelLinear: output rows split; gather_output all-gathers y."""

    def __init__(self, gather_output: bool = False, sequence_parallel: bool = False):
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        full = _as_linear(module, self, name)
        layer = ColumnParallelLinear(full.in_features, full.out_features, full.bias is not None,
                                     self.gather_output, group, sequence_parallel=self.sequence_parallel,
                                     full=full)
        _tie(layer, "weight", module.weight, ties)
        return layer


class FusedColwiseParallel(Style):
    """A projection whose output is `parts` blocks side by side (GPT-2's q | k | v), split by columns.

    A plain column split would give rank 0 all of q; each rank must hold its
    slice of every block instead, [q_r | k_r | v_r]. So the rows are reordered
    rank by rank first; each rank's contiguous shard is then exactly that.
    """

    def __init__(self, parts: int = 3):
        self.parts = parts

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        full = _as_linear(module, self, name)
        if full.out_features % (self.parts * group.size):
            raise ValueError(f"{name}: {full.out_features} outputs do not split into {self.parts} blocks "
                             f"of whole slices over {group.size} ranks")
        block, p = full.out_features // self.parts, group.size
        width = block // p  # rank r's rows of block b: b * block + r * width + [0, width)
        rows = [b * block + r * width + i for r in range(p) for b in range(self.parts) for i in range(width)]
        reordered = nn.Linear(full.in_features, full.out_features, full.bias is not None, device="meta")
        reordered.weight = nn.Parameter(full.weight.detach()[rows])
        reordered.bias = None if full.bias is None else nn.Parameter(full.bias.detach()[rows])
        return ColumnParallelLinear(full.in_features, full.out_features, full.bias is not None,
                                    False, group, full=reordered)


class RowwiseParallel(Style):
    """nn.Linear (or Conv1D) -> RowParallelLinear: input columns split, the partial outputs summed."""

    def __init__(self, sequence_parallel: bool = False):
        self.sequence_parallel = sequence_parallel

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        full = _as_linear(module, self, name)
        layer = RowParallelLinear(full.in_features, full.out_features, full.bias is not None,
                                  input_is_parallel=True, group=group,
                                  sequence_parallel=self.sequence_parallel, full=full)
        _tie(layer, "weight", module.weight, ties)
        return layer


class FusedAttentionParallel(Style):
    """An attention module with a fused q|k|v projection `qkv`, an output `out`, and `split` (the
    width its forward splits the fused output by, GPT-2's split_size): heads split whole."""

    def __init__(self, qkv: str = "c_attn", out: str = "c_proj", split: str = "split_size",
                 heads: str = "num_heads"):
        self.qkv, self.out, self.split, self.heads = qkv, out, split, heads

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        heads = getattr(module, self.heads, None)
        if not isinstance(heads, int) or heads % group.size:
            raise ValueError(f"{name}: {self.heads} = {heads} is not divisible by the tensor-parallel "
                             f"size {group.size}: attention heads are split whole")
        setattr(module, self.qkv, FusedColwiseParallel(3).apply(getattr(module, self.qkv), group,
                                                                f"{name}.{self.qkv}", ties))
        setattr(module, self.out, RowwiseParallel().apply(getattr(module, self.out), group,
                                                          f"{name}.{self.out}", ties))
        setattr(module, self.split, getattr(module, self.split) // group.size)
        setattr(module, self.heads, heads // group.size)
        return module


class VocabParallel(Style):
    """nn.Embedding -> VocabParallelEmbedding: vocabulary rows split, the looked-up rows summed.

    sequence_parallel: the embedding's output is where the sequence-parallel region
    begins (ShardSequence's hook on it: each rank keeps its tokens), as Llama's
    embed_tokens is, with no module around it to hook.
    """

    def __init__(self, sequence_parallel: bool = False):
        self.sequence_parallel = sequence_parallel

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        _expect(module, nn.Embedding, self, name)
        if module.padding_idx is not None or module.max_norm is not None:
            raise ValueError(f"{name}: VocabParallel splits a plain nn.Embedding (no padding_idx, max_norm)")
        layer = VocabParallelEmbedding(module.num_embeddings, module.embedding_dim, group, full=module)
        _tie(layer, "weight", module.weight, ties)
        return ShardSequence().apply(layer, group, name, ties) if self.sequence_parallel else layer


class SequenceParallelNorm(Style):
    """nn.LayerNorm -> SequenceParallelLayerNorm: the same weights, run on this rank's tokens,
    their gradients summed over the group (each rank saw only its share of the tokens)."""

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        _expect(module, nn.LayerNorm, self, name)
        if not module.elementwise_affine or module.bias is None or len(module.normalized_shape) != 1:
            raise ValueError(f"{name}: SequenceParallelNorm takes a LayerNorm over one dimension with a "
                             "weight and a bias")
        norm = SequenceParallelLayerNorm(module.normalized_shape[0], module.eps, group,
                                         dtype=module.weight.dtype, device=module.weight.device)
        with torch.no_grad():
            norm.weight.copy_(module.weight)
            norm.bias.copy_(module.bias)
        return norm


class ShardSequence(Style):
    """Keep only this rank's tokens of the module's output: where a sequence-parallel region begins.

    A hook, not a swap (the module and what is inside it stay). Forward splits
    the sequence, backward all-gathers the gradient: (p-1)/p of [b, s, h].
    """

    replaces = False

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        def shard(_: nn.Module, __: object, out: torch.Tensor) -> torch.Tensor:
            if out.shape[SEQUENCE_DIM] % group.size:
                raise ValueError(f"{name}: sequence parallelism splits the sequence evenly: "
                                 f"{out.shape[SEQUENCE_DIM]} tokens over {group.size} ranks")
            return scatter_to_sequence_region(out, group)

        module.register_forward_hook(shard)
        return module


class ParallelLMHead(nn.Module):
    """norm, then logits from this rank's vocabulary rows of `weight`, all-gathered unless asked not to.

    The norm's name (e.g. ln_f) and the weight's stay those of the module it
    replaced, so the parallel model's parameter names are the plain one's.
    """

    def __init__(self, norm_name: str, norm: nn.Module, weight: nn.Parameter, vocab_size: int,
                 group: Group, gather_output: bool = True, sequence_parallel: bool = False):
        super().__init__()
        self.norm_name, self.group, self.gather_output = norm_name, group, gather_output
        self.sequence_parallel = sequence_parallel
        setattr(self, norm_name, norm)
        self.weight = weight
        self.sizes = split_sizes(vocab_size, group.size)
        self.shard_dims = {"weight": 0}  # the embedding's vocabulary rows (checkpoints)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # f after the norm, not before: the norm's own gradient must not be summed p times.
        # Sequence parallel: the norm ran on this rank's tokens; all-gather them instead.
        x = getattr(self, self.norm_name)(x)
        x = gather_from_sequence_region(x, self.group) if self.sequence_parallel else \
            copy_to_region(x, self.group)
        logits = F.linear(x, self.weight)
        return gather_from_region(logits, self.group, sizes=self.sizes) if self.gather_output else logits


class VocabParallelHead(Style):
    """A head computing F.linear(norm(x), weight) from attributes `norm` and `weight` (a tied head)."""

    def __init__(self, norm: str = "ln_f", weight: str = "weight", gather_output: bool = True,
                 sequence_parallel: bool = False):
        self.norm, self.weight, self.gather_output = norm, weight, gather_output
        self.sequence_parallel = sequence_parallel

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        norm, weight = getattr(module, self.norm, None), getattr(module, self.weight, None)
        if not isinstance(norm, nn.Module) or not isinstance(weight, nn.Parameter):
            raise ValueError(f"{name}: VocabParallelHead needs a module `{self.norm}` and a parameter "
                             f"`{self.weight}`, found {type(norm).__name__} and {type(weight).__name__}")
        vocab = weight.shape[0]
        shard = ties.get(weight)  # tied: the embedding's shard, the same rows
        if shard is None:
            start, stop = shard_range(vocab, group)
            shard = nn.Parameter(weight.detach()[start:stop].clone())
            ties.record(weight, shard)
        if self.sequence_parallel:
            norm = SequenceParallelNorm().apply(norm, group, f"{name}.{self.norm}", ties)
        return ParallelLMHead(self.norm, norm, shard, vocab, group, self.gather_output,
                              self.sequence_parallel)
