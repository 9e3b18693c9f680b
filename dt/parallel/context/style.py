"""Context parallelism applied to a plain model from outside: three styles and the input split.

    grid = dt.Grid({"dp": 2, "cp": 2, "tp": 2})
    model = GPT(cfg)                                          # dt/models/gpt.py, plain
    dt.parallelize(model, grid, gpt_plan(cfg, tp=2, cp=2))    # or cp_attention="ulysses"
    ids, targets = shard_sequence(ids, grid), shard_sequence(targets, grid)
    logits, loss = model(ids, targets)                        # this rank's tokens only
    loss.backward()                                           # then average dense grads over dp x cp

Who splits the inputs: the step. Every rank of a cp group is handed the
same whole sequences of exactly `seq_len` (the model's block_size) tokens,
as a tp group is, and keeps its zig-zag share of tokens and targets with
shard_sequence (dt.layout.SequenceLayout(seq_len, cp, zigzag=True): rank r
holds chunks r and 2cp-1-r of 2cp, which balances the causal mask's work).
From the embedding to the loss each rank then holds only its share; only
attention crosses ranks.

The styles (axis "cp"; each a swap or hook onto dt's existing layers):

    ContextParallel(seq_len, kind)   the attention core (q, k, v -> softmax(q k^T) v, causal;
                                     dt.models.lm.CausalAttention) -> ring attention or Ulysses
                                     over grid.group("cp") (dt.parallel.context; the core of
                                     ContextParallelSelfAttention, so the projections around it
                                     stay the model's, and tensor-parallel styles split them
                                     as without cp: tp and cp compose)
    SharePositions(seq_len)          a module indexed by positions (GPT's position table, Llama's
                                     rotary tables) reads this rank's positions, not 0..s_r-1
    ShareLoss(seq_len)               the mean loss over this rank's tokens becomes
                                     sum * cp / (b * seq_len), not the share's own mean: the cp
                                     ranks' losses (and gradients) average to the whole
                                     sequences' mean, however unevenly the tokens split

Gradients: every parameter is replicated over cp, each rank's gradient the
part from its tokens, so dense gradients are averaged over the dp x cp plane
(grid.group("dp", "cp")), the same average the step takes over dp.
A mixture of experts under cp needs its router to see whole sequences:
dt.parallel.expert.style's ExpertParallel(seq_len) does that.
A pipeline that cuts the model into layers keeps these hooks (they sit on the
model's own modules): Llama's layers must take their tables from
`model.rotary(torch.arange(s))`, which SharePositions hooks, and the last
stage's loss must be `model.loss`, which ShareLoss hooks.
Cost per rank: dt.cost.ring_attention_traffic or dt.cost.ulysses_traffic per
attention layer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dt.layout import SequenceLayout
from dt.parallel.context.layer import KINDS
from dt.parallel.grid import Grid
from dt.parallel.tensor.styles import Style, Ties
from dt.transport import Group

__all__ = ["AXIS", "ContextParallel", "ContextParallelCore", "SharePositions", "ShareLoss",
           "sequence_layout", "shard_sequence"]

AXIS = "cp"


def sequence_layout(seq_len: int, cp: int) -> SequenceLayout:
    """How a sequence of seq_len tokens is spread over cp ranks: zig-zag."""
    return SequenceLayout(seq_len, cp, zigzag=True)


def _cp(grid: Grid) -> tuple[int, int]:
    """(cp, this rank's cp coordinate); (1, 0) for a grid with no cp axis."""
    return grid.sizes.get(AXIS, 1), grid.coords().get(AXIS, 0)


def shard_sequence(t: torch.Tensor, grid: Grid, dim: int = 1) -> torch.Tensor:
    """This rank's zig-zag share of whole sequences t (tokens or targets) along `dim`."""
    cp, rank = _cp(grid)
    if cp == 1:
        return t
    positions = sequence_layout(t.shape[dim], cp).positions(rank)
    return t.index_select(dim, torch.tensor(positions, device=t.device))


class _CPStyle(Style):
    axis = AXIS

    def __init__(self, seq_len: int, cp: int | None = None):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"{type(self).__name__}: seq_len must be a whole number >= 1, got {seq_len!r}")
        self.seq_len, self.cp = seq_len, cp  # cp: the group size a plan was made for (None: any)

    def group_on(self, grid: Grid, axis: str | None) -> Group:
        group = super().group_on(grid, axis)
        if self.cp is not None and group.size != self.cp:
            raise ValueError(f"a context-parallel plan for cp = {self.cp} on {grid}, whose cp group holds "
                             f"{group.size} rank(s): make the plan with the grid's cp")
        return group

    def layout(self, group: Group) -> SequenceLayout:
        return sequence_layout(self.seq_len, group.size)

    def _check(self, name: str, group: Group, tokens: int) -> None:
        want = self.layout(group).size(group.rank)
        if tokens != want:
            raise ValueError(f"{name}: cp rank {group.rank} of {group.size} holds {want} tokens of a "
                             f"sequence of {self.seq_len}, got {tokens}: give every cp rank whole "
                             "sequences of seq_len tokens and keep its share with shard_sequence")


class ContextParallelCore(nn.Module):
    """Attention's core over a sequence split across `group`: ring attention or Ulysses."""

    def __init__(self, kind: str, group: Group, layout: SequenceLayout, name: str):
        super().__init__()
        self.kind, self.group, self.layout, self.name = kind, group, layout, name

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[-2] != self.layout.size(self.group.rank):
            raise ValueError(f"{self.name}: cp rank {self.group.rank} holds "
                             f"{self.layout.size(self.group.rank)} tokens, got {q.shape[-2]}")
        return KINDS[self.kind](q, k, v, self.group, self.layout, True)

    def extra_repr(self) -> str:
        return f"{self.kind} over {self.group.size} ranks, {self.layout}"


class ContextParallel(_CPStyle):
    """A causal attention core (no weights: q, k, v in, softmax(q k^T / sqrt(d)) v out) ->
    ContextParallelCore of `kind` ("ring" or "ulysses")."""

    def __init__(self, seq_len: int, kind: str = "ring", cp: int | None = None):
        super().__init__(seq_len, cp)
        if kind not in KINDS:
            raise ValueError(f"context-parallel attention is one of {sorted(KINDS)}, got {kind!r}")
        self.kind = kind

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        if any(True for _ in module.parameters()):
            raise ValueError(f"{name}: ContextParallel swaps an attention core (q, k, v in, no weights, "
                             f"e.g. dt.models.lm.CausalAttention), found {type(module).__name__} with "
                             "weights")
        return ContextParallelCore(self.kind, group, self.layout(group), name)


class SharePositions(_CPStyle):
    """A module whose first argument is position indices 0..s_r-1 reads this rank's positions.

    A hook, not a swap: GPT's nn.Embedding position table (`layers.0.wpe`) or
    Llama's rotary tables keep their names and weights.
    """

    replaces = False

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        mine = torch.tensor(self.layout(group).positions(group.rank))  # host: moved to the input's device

        def positions(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            index, *rest = args
            self._check(name, group, index.shape[-1])
            return (mine.to(index.device)[index], *rest)

        module.register_forward_pre_hook(positions)
        return module


class ShareLoss(_CPStyle):
    """A loss module (logits, targets [b, s_r]) -> mean over the tokens, rescaled to this rank's share:
    sum / (b * seq_len / cp), so the cp ranks' values average to the whole sequences' mean."""

    replaces = False

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        def share(_: nn.Module, args: tuple[Any, ...], mean: torch.Tensor) -> torch.Tensor:
            targets = args[1]
            self._check(name, group, targets.shape[-1])
            return mean * (targets.numel() * group.size / (targets.shape[0] * self.seq_len))

        module.register_forward_hook(share)
        return module
