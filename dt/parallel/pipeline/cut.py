"""A model given as a list of layers, cut into this rank's stage(s); the weights two stages share.

    stage = cut(layers, grid, virtual=2)        # chunks c * pp + pp_rank of pp * virtual parts
    stage.chunks, stage.ranges                  # nn.Sequential per chunk, its layer indices
    stage.shared, stage.shared_group            # a tied embedding/head: summed over that group

Every rank builds the whole (plain, tensor-parallel) model from the same
seed and keeps its parts, so a tied weight (the token embedding, used again
by the head) is one parameter in the model but two copies once the first and
the last stage run on different ranks. Their gradients are summed over the
group of the stages that hold it, so both copies take the same step; the
first of them is the one a checkpoint saves (`saves`).

Once cut, a rank keeps only its own stage (drop_other_stages): every module of
the other stages' layers is replaced in the model by an Elsewhere, so their
weights are freed (pipeline parallelism exists to split the model's memory;
torchtitan's split deletes them likewise). A module that holds a tensor this
stage uses (the tied word table, in the other end's embedding or head) stays,
so every tensor this rank holds keeps all of its names in the plain model:
checkpoints name it as the plain model does, on any mesh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from dt.parallel.grid import Grid
from dt.parallel.pipeline.schedules import partition, stage_layers
from dt.transport import resolve_group, shared_group

__all__ = ["Elsewhere", "StageCut", "cut", "drop_other_stages"]


@dataclass
class StageCut:
    """This rank's chunks of the layer list, and the parameters it shares with other stages."""

    chunks: list[nn.Sequential]
    ranges: list[range]
    stage: int
    stages: int
    shared: list[nn.Parameter] = field(default_factory=list)  # held by another stage too
    shared_group: Any = None  # the holders' ranks of this pipeline: their gradients summed
    first_holder: dict[int, int] = field(default_factory=dict)  # id(param) -> first stage holding it

    def saves(self, p: Any) -> bool:
        """Whether this stage writes `p` in a checkpoint (a shared one: only its first holder)."""
        return self.first_holder.get(id(p), self.stage) == self.stage


def _holders(layers: Sequence[nn.Module], stages: int, virtual: int,
             sizes: Sequence[int] | None) -> dict[int, set[int]]:
    """id(param) -> the stages whose layers use it (part k runs on stage k % stages)."""
    out: dict[int, set[int]] = {}
    for k, part in enumerate(partition(len(layers), stages * virtual, sizes)):
        for i in part:
            for p in layers[i].parameters():
                out.setdefault(id(p), set()).add(k % stages)
    return out


def cut(layers: Sequence[nn.Module], grid: Grid, virtual: int = 1,
        sizes: Sequence[int] | None = None, axis: str = "pp") -> StageCut:
    """This rank's chunks of `layers` along the grid's `axis`; collective (makes the tied groups)."""
    stages, stage = grid.size(axis), grid.coords()[axis]
    if len(layers) < stages * virtual:
        raise ValueError(f"a pipeline of {stages} stages x {virtual} virtual cuts the model into "
                         f"{stages * virtual} parts, but it has only {len(layers)} layers")
    ranges = stage_layers(len(layers), stages, stage, sizes, virtual)
    chunks = [nn.Sequential(*[layers[i] for i in r]) for r in ranges]
    holders = _holders(layers, stages, virtual, sizes)
    out = StageCut(chunks, ranges, stage, stages)
    sets = sorted({tuple(sorted(h)) for h in holders.values() if len(h) > 1})
    if len(sets) > 1:
        raise ValueError(f"weights shared by different sets of pipeline stages {sets}: one set is "
                         "supported (a tied embedding and head)")
    if not sets:
        return out
    mine = {id(p): p for c in chunks for p in c.parameters()}
    out.shared = [mine[i] for i, h in holders.items() if len(h) > 1 and i in mine]
    out.first_holder = {i: min(h) for i, h in holders.items() if len(h) > 1}
    for pipeline in grid.groups(axis):  # every rank makes every group, in the same order
        ranks = tuple(sorted(pipeline[s] for s in sets[0]))
        pg = shared_group(ranks, "mesh")  # the mesh's embed group, shared
        if grid.rank in ranks:
            out.shared_group = resolve_group(pg)
    return out


class Elsewhere(nn.Module):
    """Where a module of another pipeline stage was: its weights live on that stage's ranks only."""

    def __init__(self, name: str, stage: int):
        super().__init__()
        self.where, self.stage = name, stage

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.where} belongs to another pipeline stage: this rank (stage {self.stage}) "
                           "holds only its own layers; run it through the pipeline (dt.train.TrainStep), "
                           "or load a checkpoint into a plain model (dt sample)")

    def extra_repr(self) -> str:
        return f"{self.where!r}, not on stage {self.stage}"


def drop_other_stages(model: nn.Module, layers: Sequence[nn.Module], stage: StageCut) -> None:
    """Replace in `model` each outermost module of the other stages' `layers` that holds none of this
    stage's tensors by an Elsewhere: once nothing else refers to them, their weights are freed.

    Modules outside every layer (a loss, Llama's rotary tables, which each layer looks up) stay.
    """
    mine = {id(t) for c in stage.chunks for t in (*c.parameters(), *c.buffers())}
    own = {id(m) for c in stage.chunks for m in c.modules()}
    held = {i for r in stage.ranges for i in r}
    others = {id(m) for i, layer in enumerate(layers) if i not in held for m in layer.modules()} - own

    def walk(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            tensors = [*child.parameters(), *child.buffers()]
            if id(child) in others and not any(id(t) in mine for t in tensors):
                setattr(parent, name, Elsewhere(prefix + name, stage.stage))
            elif any(id(m) in others for m in child.modules()):
                walk(child, f"{prefix}{name}.")

    walk(model, "")
