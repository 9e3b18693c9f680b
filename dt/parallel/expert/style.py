"""Expert parallelism applied to a plain model from outside: the style, and how gradients are summed.

    grid = dt.Grid({"dp": 4, "tp": 1}, ep=2)           # ep splits the dp x cp plane
    model = GPT(GPTConfig(..., n_experts=4, top_k=2))   # dt/models/moe.py's MoE in every block
    dt.parallelize(model, grid, gpt_plan(model.cfg, tp=1))   # "layers.*.mlp": ExpertParallel(...)
    logits, loss = model(ids, targets)                  # ids: this dp rank's sequences
    loss.backward()
    dense, experts = split_parameters(model)
    # dense: average over grid.group(*DENSE_AXES present in the grid), as without experts
    # experts: SUM over grid.group(EXPERT_GROUP), then divide by grid.plane (dp * cp)

ExpertParallel() swaps a plain mixture of experts (dt.models.moe.MoE: a
`router`, `experts`, a `balance` loss) for ExpertParallelMoE, dt.parallel.expert.ShardedMoE
on grid.group("ep"): each rank keeps experts split_sizes(E, ep)'s share,
routes its own tokens, and two all-to-alls carry them to their experts'
ranks and back. The router's weight, the kept experts and the balance loss
are the plain module's own objects (moved, not copied; nothing is drawn
from the RNG), and the kept experts keep their global names
(`experts.{e}`), so the parallel model's parameter names are a subset of
the plain model's, each with its value.

Under context parallelism (a grid with cp > 1) give ExpertParallel(seq_len):
the router then places and balances each whole sequence across the cp
ranks (dt.parallel.expert.router), so drops and the balance loss are those
of the unsplit sequence.

Why the expert gradients are summed: an expert's gradient already sums the
contributions of every token of its ep group routed to it; the other ep
groups' ranks holding the same expert (grid.group("edp")) saw other tokens,
so their gradients add, and dividing by dp * cp makes it the mean over the
whole batch, as the dense parameters' average over dp x cp is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from dt.layout import SequenceLayout
from dt.parallel.context.style import sequence_layout
from dt.parallel.expert.layer import ShardedMoE
from dt.parallel.grid import EXPERT_PLANE, Grid
from dt.parallel.tensor.styles import Style, Ties
from dt.transport import Group, resolve_group

__all__ = ["DENSE_AXES", "EXPERT_GROUP", "ExpertGroups", "ExpertParallel", "ExpertParallelMoE",
           "HeldExperts", "dense_axes", "split_parameters"]

AXIS = "ep"
EXPERT_GROUP = "edp"  # an expert's gradient: SUM over grid.group(EXPERT_GROUP), then / grid.plane
DENSE_AXES = EXPERT_PLANE  # ("dp", "cp"): every other gradient is averaged over these (those present)


def dense_axes(grid: Grid) -> tuple[str, ...]:
    """The axes of DENSE_AXES that `grid` has: grid.group(*dense_axes(grid)) averages dense gradients."""
    return tuple(a for a in DENSE_AXES if a in grid.sizes)


@dataclass(frozen=True)
class ExpertGroups:
    """What an expert-parallel layer runs on: its ep group, and the cp group its sequences span."""

    ep: Group
    cp: Group | None = None  # None: whole sequences on this rank
    layout: SequenceLayout | None = None


class HeldExperts(nn.Module):
    """This rank's experts, named by their global index (`experts.5` stays `experts.5`).

    Iterates and counts as the ModuleList dt.parallel.expert.ShardedMoE runs them from.
    """

    def __init__(self, experts: dict[int, nn.Module]):
        super().__init__()
        for index, expert in experts.items():
            self.add_module(str(index), expert)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)


class ExpertParallelMoE(ShardedMoE):
    """A ShardedMoE on groups.ep holding the plain `moe`'s weights; forward(x) as the plain's."""

    def __init__(self, moe: nn.Module, groups: ExpertGroups):
        first = moe.experts[0].fc_in
        # Built on the meta device: no weights made and no random numbers drawn; then the
        # plain module's own parameters are moved in.
        super().__init__(first.in_features, first.out_features, moe.num_experts, moe.top_k,
                         moe.router.capacity_factor, groups.ep, dtype=first.weight.dtype, device="meta")
        self.router.weight = moe.router.weight
        self.experts = HeldExperts({self.first + i: moe.experts[self.first + i]
                                    for i in range(len(self.experts))})
        self.balance = moe.balance
        self.sequence_group, self.layout = groups.cp, groups.layout

    def forward(self, x: Any, sequence_group: Any = None, layout: SequenceLayout | None = None) -> Any:
        y = super().forward(x, self.sequence_group, self.layout)
        return self.balance(y, self.routing.aux_per_sequence)


class ExpertParallel(Style):
    """A plain mixture of experts (dt.models.moe.MoE) -> ExpertParallelMoE on grid.group("ep").

    seq_len: the whole sequence's length under context parallelism (the model's
    block_size); needed, and only used, when the grid's cp > 1.
    """

    axis = AXIS

    def __init__(self, seq_len: int | None = None):
        self.seq_len = seq_len

    def group_on(self, grid: Grid, axis: str) -> ExpertGroups:
        ep = resolve_group(grid.group(AXIS))
        cp = grid.sizes.get("cp", 1)
        if cp == 1:
            return ExpertGroups(ep)
        if self.seq_len is None:
            raise ValueError(f"ExpertParallel on a grid with cp = {cp} needs seq_len (the block size): "
                             "its router places whole sequences split over the cp ranks")
        return ExpertGroups(ep, resolve_group(grid.group("cp")), sequence_layout(self.seq_len, cp))

    def apply(self, module: nn.Module, group: ExpertGroups, name: str, ties: Ties) -> nn.Module:
        missing = [a for a in ("router", "experts", "balance", "num_experts", "top_k")
                   if not hasattr(module, a)]
        if missing or isinstance(module, ShardedMoE):
            raise ValueError(f"{name}: ExpertParallel swaps a plain mixture of experts "
                             f"(dt.models.moe.MoE), found {type(module).__name__}")
        return ExpertParallelMoE(module, group)


def split_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(dense, experts): the parameters of every ExpertParallelMoE's experts, and all the others.

    Each parameter once (a tied weight is one), in model.parameters() order.
    """
    experts = {id(p) for m in model.modules() if isinstance(m, ExpertParallelMoE)
               for p in m.experts.parameters()}
    params = list(model.parameters())
    return [p for p in params if id(p) not in experts], [p for p in params if id(p) in experts]
