"""Tensor-parallel styles: how one plain module becomes its tensor-parallel self.

A style takes a plain module (nn.Linear, nn.Embedding, a language-model head)
and returns dt's parallel layer holding this rank's slices of the very same
weights, so a plain model and its parallel twin compute the same function:

    ColwiseParallel()         nn.Linear -> ColumnParallelLinear (output rows split; f before)
    RowwiseParallel()         nn.Linear -> RowParallelLinear (input columns split; g after)
    VocabParallel()           nn.Embedding -> VocabParallelEmbedding (vocabulary rows split)
    VocabParallelHead()       norm + tied projection -> ParallelLMHead (the same rows as the embedding)

Column then row is Megatron's block: one all-reduce forward, one backward
(dt.parallel.tensor). A style never draws random numbers: the weights come
from the module it replaces.

Tied weights: `ties` maps a replaced parameter (by id) to the shard that
replaced it. A head whose weight is the embedding's (tied) takes the
embedding's shard itself, not a copy, so the two stay one parameter: the
embedding's rows and the head's logits are the same vocabulary slice.

Logits: ColwiseParallel(gather_output=True) and VocabParallelHead() by
default all-gather the vocabulary slices, so the model's own loss runs on the
whole logits unchanged (its backward keeps each rank's slice of the gradient).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from dt.layout import split_sizes
from dt.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from dt.parallel.tensor.mappings import copy_to_region, gather_from_region, shard_range
from dt.parallel.tensor.vocab import VocabParallelEmbedding
from dt.transport import Group

__all__ = ["ColwiseParallel", "ParallelLMHead", "RowwiseParallel", "Style", "VocabParallel",
           "VocabParallelHead"]

Ties = dict[int, nn.Parameter]


class Style(ABC):
    """Turns `module` (named `name` in its model) into its tensor-parallel self on `group`."""

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


def _tie(layer: nn.Module, attr: str, old: nn.Parameter, ties: Ties) -> None:
    """Use the shard that replaced `old`, if one did (a tied weight stays one parameter)."""
    if id(old) in ties:
        setattr(layer, attr, ties[id(old)])
    ties[id(old)] = getattr(layer, attr)


class ColwiseParallel(Style):
    def __init__(self, gather_output: bool = False):
        self.gather_output = gather_output

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        _expect(module, nn.Linear, self, name)
        layer = ColumnParallelLinear(module.in_features, module.out_features, module.bias is not None,
                                     self.gather_output, group, full=module)
        _tie(layer, "weight", module.weight, ties)
        return layer


class RowwiseParallel(Style):
    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        _expect(module, nn.Linear, self, name)
        layer = RowParallelLinear(module.in_features, module.out_features, module.bias is not None,
                                  input_is_parallel=True, group=group, full=module)
        _tie(layer, "weight", module.weight, ties)
        return layer


class VocabParallel(Style):
    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        _expect(module, nn.Embedding, self, name)
        if module.padding_idx is not None or module.max_norm is not None:
            raise ValueError(f"{name}: VocabParallel splits a plain nn.Embedding (no padding_idx, max_norm)")
        layer = VocabParallelEmbedding(module.num_embeddings, module.embedding_dim, group, full=module)
        _tie(layer, "weight", module.weight, ties)
        return layer


class ParallelLMHead(nn.Module):
    """norm, then logits from this rank's vocabulary rows of `weight`, all-gathered unless asked not to.

    The norm's name (e.g. ln_f) and the weight's stay those of the module it
    replaced, so the parallel model's parameter names are the plain one's.
    """

    def __init__(self, norm_name: str, norm: nn.Module, weight: nn.Parameter, vocab_size: int,
                 group: Group, gather_output: bool = True):
        super().__init__()
        self.norm_name, self.group, self.gather_output = norm_name, group, gather_output
        setattr(self, norm_name, norm)
        self.weight = weight
        self.sizes = split_sizes(vocab_size, group.size)
        self.shard_dims = {"weight": 0}  # the embedding's vocabulary rows (checkpoints)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # f after the norm, not before: the norm's own gradient must not be summed p times.
        x = copy_to_region(getattr(self, self.norm_name)(x), self.group)
        logits = F.linear(x, self.weight)
        return gather_from_region(logits, self.group, sizes=self.sizes) if self.gather_output else logits


class VocabParallelHead(Style):
    """A head computing F.linear(norm(x), weight) from attributes `norm` and `weight` (a tied head)."""

    def __init__(self, norm: str = "ln_f", weight: str = "weight", gather_output: bool = True):
        self.norm, self.weight, self.gather_output = norm, weight, gather_output

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        norm, weight = getattr(module, self.norm, None), getattr(module, self.weight, None)
        if not isinstance(norm, nn.Module) or not isinstance(weight, nn.Parameter):
            raise ValueError(f"{name}: VocabParallelHead needs a module `{self.norm}` and a parameter "
                             f"`{self.weight}`, found {type(norm).__name__} and {type(weight).__name__}")
        vocab = weight.shape[0]
        if id(weight) in ties:  # tied: the embedding's shard, the same rows
            shard = ties[id(weight)]
        else:
            start, stop = shard_range(vocab, group)
            shard = nn.Parameter(weight.detach()[start:stop].clone())
            ties[id(weight)] = shard
        return ParallelLMHead(self.norm, norm, shard, vocab, group, self.gather_output)
