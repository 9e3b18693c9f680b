"""dt.parallelize: parallelism applied to a plain model from outside, by a plan, in one fixed order.

    model = GPT(GPTConfig(...))                            # dt/models/nanogpt.py: no parallelism inside
    grid = dt.Grid({"dp": 2, "tp": 2})
    dt.parallelize(model, grid, gpt_plan(model.cfg, grid.size("tp")))
    logits, loss = model(ids, targets)                     # the same function, tp ranks sharing the work

    grid = dt.Grid({"pp": 2, "dp": 2, "cp": 1, "tp": 2})   # every axis: one Plan, one call
    par = dt.parallelize(model, grid, Plan(tensor=gpt_plan(cfg, 2), blocks=gpt_blocks, virtual=1))
    step = dt.train.TrainStep(par, optimizer, micro_batches=4)   # dt/train/step.py

A plan maps module-name patterns (fnmatch: `*` matches any run of
characters, dots included) to styles (dt.parallel.tensor.styles). Each
matched module is swapped, in the model's own module order, for the
parallel layer its style makes from it; the model keeps its parameter names,
and a weight tied between two modules stays one parameter. This is
torchtitan's parallelize_module with dt's layers, and picotron's module
swap: the model file never mentions a group.

A Plan applies every kind of parallelism, always in ORDER (torchtitan's, for its reasons):

    tensor     swap modules for their tensor/sequence-parallel selves (grid "tp")
    context    swap attention for its context-parallel self (grid "cp")
    experts    swap MLPs for mixtures of experts over the grid's "ep" split
    pipeline   cut the model's block list (`blocks`) into this rank's stage(s) (grid "pp")
    recompute  wrap blocks so their activations are recomputed in backward
    data       DDP (overlapped) or ZeRO 1-2 over the grid's dp x cp plane

Why this order: the swaps come first because everything after them holds on
to parameters and modules, and must hold the final ones (a pipeline cut made
before a swap would keep the old layer; DDP's buckets and ZeRO's flat buffer
are views of the parameters they were given). Tensor before context and
experts: those replace the core of a module tensor parallelism has already
split by heads, so they see the split shapes. The pipeline cut before
recompute and data parallel: both are per stage (a recompute region never
spans a stage boundary; each stage synchronises only its own gradients).
Data parallel last, as in torchtitan: its buckets follow the final
parameters' order and sizes, and its hooks must be the last ones registered.

A plan is checked before anything is swapped: a pattern matching nothing
(a typo would otherwise leave a layer unsplit, silently correct and slow), a
module matched twice, one matched inside another, or a weight the plan splits
that a module outside it shares, are each one clear error.

gpt_plan and llama_plan are the plans of dt's plain models (gpt_blocks and
llama_blocks their block lists), hf_gpt2_plan and
hf_llama_plan those of Hugging Face transformers' GPT2LMHeadModel and
LlamaForCausalLM, built from their configs (this module never imports
transformers). All are Megatron's split: QKV and the MLP's first matrices by
columns, the output projections by rows, the vocabulary by rows of the
embedding and the head.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from dt.parallel.checkpoint.state import tensor_parallel_places
from dt.parallel.data_parallel import DistributedDataParallel
from dt.parallel.grid import Grid
from dt.parallel.pipeline.cut import StageCut, cut
from dt.parallel.tensor.styles import (
    ColwiseParallel,
    FusedAttentionParallel,
    RowwiseParallel,
    SequenceParallelNorm,
    ShardSequence,
    Style,
    VocabParallel,
    VocabParallelHead,
)
from dt.transport import default_device, resolve_group

__all__ = ["DATA_PARALLEL", "ORDER", "Parallel", "Plan", "gpt_blocks", "gpt_plan", "hf_gpt2_plan",
           "hf_llama_plan", "llama_blocks", "llama_plan", "parallelize"]

ORDER = ("tensor", "context", "experts", "pipeline", "recompute", "data")
SWAP_AXES = {"tensor": "tp", "context": "cp", "experts": "ep", "recompute": None}  # the group each swaps on
DATA_PARALLEL = ("ddp", "zero1", "zero2")  # how the dp x cp plane synchronises (dt.train.step)
DP_AXES = ("dp", "cp")  # dense gradients are averaged over this plane


@dataclass
class Plan:
    """Every parallelism of one model, each a mapping of module patterns to styles, applied in ORDER.

    blocks: the model as the list of layers a pipeline may cut (x -> x each);
    None: the model is one stage (the grid's pp must be 1).
    """

    tensor: Mapping[str, Style] = field(default_factory=dict)
    context: Mapping[str, Style] = field(default_factory=dict)
    experts: Mapping[str, Style] = field(default_factory=dict)
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    virtual: int = 1  # chunks per pipeline rank (interleaved schedules)
    stage_sizes: Sequence[int] | None = None  # layers per part; None: as even as the layers allow
    recompute: Mapping[str, Style] = field(default_factory=dict)
    data_parallel: str = "ddp"


@dataclass
class Parallel:
    """A model parallelized on this rank: its stage's chunks, as the pipeline runs them."""

    model: nn.Module  # the whole model (tensor-parallel); only the stage's layers are used here
    grid: Grid
    stage: StageCut
    chunks: list[nn.Module]  # stage.chunks, each wrapped in DDP when data_parallel is "ddp"
    data_parallel: str
    dp_axes: tuple[str, ...]
    device: torch.device

    @property
    def ddp(self) -> list[DistributedDataParallel]:
        return [c for c in self.chunks if isinstance(c, DistributedDataParallel)]

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once (what its optimizer steps)."""
        seen: dict[int, nn.Parameter] = {}
        for c in self.stage.chunks:
            for p in c.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    # -- sharded checkpoints (dt.parallel.checkpoint) ------------------------
    def checkpoint_layout(self) -> dict[str, Any]:
        sizes = self.grid.sizes
        extra = {k: sizes[k] for k in ("cp",) if sizes.get(k, 1) > 1}
        return {"dp": sizes.get("dp", 1), **extra, "tp": sizes.get("tp", 1), "pp": sizes.get("pp", 1),
                "virtual": len(self.stage.ranges), "zero": 0}

    def checkpoint_places(self) -> list[tuple[torch.Tensor, list[Any]]]:
        """This stage's tensors under their names in the plain model, whatever the grid.

        A tensor-parallel layer holds its slice; dp x cp replicas split the writing; a
        weight two stages share is written by the first (the others load it). The names
        are the plain model's state_dict keys, so any grid reads any other's checkpoint.
        """
        held = {id(t) for c in self.stage.chunks for t in (*c.parameters(), *c.buffers())}
        keys = set(self.model.state_dict())
        c = self.grid.coords()
        plane = 0
        for a in self.dp_axes:  # this rank's place in the dp x cp plane, dp major
            plane = plane * self.grid.sizes[a] + c[a]
        out = []
        for t, pieces in tensor_parallel_places(self.model, "", plane, self.grid.size(*self.dp_axes)):
            if id(t) not in held or pieces[0][0].name not in keys:
                continue  # another stage's, or not state (rotary tables)
            if not self.stage.saves(t):
                pieces = [(replace(p, saved=False), at) for p, at in pieces]
            out.append((t, pieces))
        return out


def _matches(model: nn.Module, plan: Mapping[str, Style]) -> list[tuple[str, Style]]:
    """(module name, style) for every module the plan names, in module order; bad plans refused."""
    names = [n for n, _ in model.named_modules() if n]
    found: dict[str, str] = {}
    for pattern in plan:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(f"plan entry {pattern!r} matches no module of {type(model).__name__}")
        for n in hits:
            if n in found:
                raise ValueError(f"module {n} is matched by two plan entries, {found[n]!r} and {pattern!r}")
            found[n] = pattern
    swaps = [n for n in found if plan[found[n]].replaces]  # a hook-only style may hold styled parts
    for n in found:
        outer = next((o for o in swaps if n.startswith(o + ".")), None)
        if outer is not None:
            raise ValueError(f"plan entries {found[outer]!r} and {found[n]!r} match {outer} and {n} inside "
                             "it: a module is swapped whole or its parts are, not both")
    # A weight shared with a module outside the plan (a tied head left out) would stay whole there.
    swapped = {id(p) for n in swaps for p in model.get_submodule(n).parameters()}
    for n, module in model.named_modules():
        if n in swaps or any(n.startswith(o + ".") for o in swaps):
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in swapped:
                where = f"{n}.{pname}" if n else pname
                raise ValueError(f"{where} shares a weight the plan splits but is not in the plan: add "
                                 "its module (a tied head: VocabParallelHead)")
    return [(n, plan[found[n]]) for n in names if n in found]


def parallelize(model: nn.Module, grid: Grid, plan: Mapping[str, Style] | Plan,
                axis: str = "tp") -> Any:
    """Apply `plan` to `model` on `grid`: a mapping swaps modules on grid.group(axis) and returns the
    model; a Plan applies every parallelism in ORDER and returns this rank's Parallel.

    Collective over the world the first time the grid makes a group
    (Grid.group). Inputs must be the same on every rank of a tensor-parallel
    group (it shares its tokens).
    """
    if isinstance(plan, Plan):
        return _apply(model, grid, plan)
    return _swap(model, grid, plan, axis)


def _apply(model: nn.Module, grid: Grid, plan: Plan) -> Parallel:
    if plan.data_parallel not in DATA_PARALLEL:
        raise ValueError(f"Plan.data_parallel {plan.data_parallel!r}: one of {', '.join(DATA_PARALLEL)}")
    for kind in ORDER[:3]:  # the swaps, each on its axis
        entries = getattr(plan, kind)
        if entries:
            _swap(model, grid, entries, SWAP_AXES[kind])
    dp_axes = tuple(a for a in DP_AXES if a in grid.names)
    device = default_device(resolve_group(grid.group(*dp_axes)))  # the rank's GPU under NCCL
    model.to(device)
    if plan.blocks is None and grid.sizes.get("pp", 1) > 1:
        raise ValueError("a pipeline (pp > 1) cuts the model's block list: give the Plan its `blocks`")
    layers = plan.blocks(model) if plan.blocks is not None else [model]
    stage = cut(layers, grid, plan.virtual, plan.stage_sizes) if "pp" in grid.names else \
        StageCut([nn.Sequential(*layers)], [range(len(layers))], 0, 1)
    if plan.recompute:
        for chunk in stage.chunks:
            _swap(chunk, grid, plan.recompute, None)
    chunks: list[nn.Module] = list(stage.chunks)
    if plan.data_parallel == "ddp" and grid.size(*dp_axes) > 1:  # each chunk's gradients, overlapped
        chunks = [DistributedDataParallel(c, grid.group(*dp_axes)) for c in chunks]
    return Parallel(model, grid, stage, chunks, plan.data_parallel, dp_axes, device)


def _swap(model: nn.Module, grid: Grid, plan: Mapping[str, Style], axis: str | None) -> nn.Module:
    """Swap `model`'s modules in place for their parallel selves on grid.group(axis)."""
    matches = _matches(model, plan)  # a bad plan is refused before any group is made
    group = resolve_group(grid.group(axis)) if axis is not None else None
    ties: dict[int, nn.Parameter] = {}
    replaced: list[nn.Module] = []  # kept alive so the ids in `ties` stay theirs
    for name, style in matches:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        setattr(parent, child, style.apply(old, group, name, ties))
        replaced.append(old)
    return model


def _divides(what: str, count: int, tp: int) -> None:
    if count % tp:
        raise ValueError(f"tensor parallelism splits attention by whole heads: {what} {count} is not "
                         f"divisible by tp {tp}")


def gpt_plan(cfg: Any, tp: int, sequence_parallel: bool = False) -> dict[str, Style]:
    """The plan of dt.models.nanogpt.GPT: Megatron's split; the logits gathered for the loss.

    sequence_parallel: between blocks (the layer norms, the residual stream) each
    rank holds block/tp tokens; sequences must split evenly over tp.
    """
    _divides("n_head", cfg.n_head, tp)
    sp = sequence_parallel
    head = f"layers.{cfg.n_layer + 1}"
    plan: dict[str, Style] = {
        "layers.0.wte": VocabParallel(),
        "layers.*.attn.query_key_value": ColwiseParallel(sequence_parallel=sp),  # whole heads per rank
        "layers.*.attn.dense": RowwiseParallel(sequence_parallel=sp),
        "layers.*.mlp.dense_h_to_4h": ColwiseParallel(sequence_parallel=sp),
        "layers.*.mlp.dense_4h_to_h": RowwiseParallel(sequence_parallel=sp),
    }
    if cfg.tied:
        plan[head] = VocabParallelHead(sequence_parallel=sp)
    else:
        plan[f"{head}.lm_head"] = ColwiseParallel(gather_output=True, sequence_parallel=sp)
    if sp:
        # The embedding sums token and position rows for the whole sequence, then keeps this rank's.
        plan["layers.0"] = ShardSequence()
        plan["layers.*.ln_[12]"] = SequenceParallelNorm()
        if not cfg.tied:
            plan[f"{head}.ln_f"] = SequenceParallelNorm()
    return plan


def _llama(n_head: int, n_kv_head: int, tp: int, body: str) -> dict[str, Style]:
    """Llama's split, its decoder under `body` (HF nests it in `model.`): heads whole, SwiGLU by columns."""
    _divides("n_head", n_head, tp)
    _divides("n_kv_head", n_kv_head, tp)
    return {
        f"{body}embed_tokens": VocabParallel(),
        f"{body}layers.*.self_attn.[qkv]_proj": ColwiseParallel(),
        f"{body}layers.*.self_attn.o_proj": RowwiseParallel(),
        f"{body}layers.*.mlp.gate_proj": ColwiseParallel(),
        f"{body}layers.*.mlp.up_proj": ColwiseParallel(),
        f"{body}layers.*.mlp.down_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(gather_output=True),  # tied or not: the embedding's rows
    }


def llama_plan(cfg: Any, tp: int) -> dict[str, Style]:
    """The plan of dt.models.llama.Llama."""
    return _llama(cfg.n_head, cfg.n_kv_head, tp, "")


def gpt_blocks(model: nn.Module) -> list[nn.Module]:
    """dt.models.nanogpt.GPT's block list: its layers already are [Embedding, Block x n, Head]."""
    return list(model.layers)


class _Rotated(nn.Module):
    """A Llama decoder layer as a pipeline layer x -> x: the model's rotary tables held beside it."""

    def __init__(self, layer: nn.Module, cos: torch.Tensor, sin: torch.Tensor):
        super().__init__()
        self.layer, self.cos, self.sin = layer, cos, sin  # the model's own buffers (already on device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        return self.layer(x, self.cos[:s], self.sin[:s])


def llama_blocks(model: nn.Module) -> list[nn.Module]:
    """dt.models.llama.Llama as [embed_tokens, decoder layer x n, (norm, lm_head)]: its forward, cut."""
    layers = [_Rotated(layer, model.rope_cos, model.rope_sin) for layer in model.layers]
    return [model.embed_tokens, *layers, nn.Sequential(model.norm, model.lm_head)]


def hf_llama_plan(config: Any, tp: int) -> dict[str, Style]:
    """The plan of Hugging Face's LlamaForCausalLM, from its LlamaConfig (no weights needed)."""
    return _llama(config.num_attention_heads, config.num_key_value_heads, tp, "model.")


def hf_gpt2_plan(config: Any, tp: int) -> dict[str, Style]:
    """The plan of Hugging Face's GPT2LMHeadModel, from its GPT2Config: Conv1D layers, fused q|k|v."""
    _divides("n_head", config.n_head, tp)
    return {
        "transformer.wte": VocabParallel(),
        "transformer.h.*.attn": FusedAttentionParallel(),
        "transformer.h.*.mlp.c_fc": ColwiseParallel(),
        "transformer.h.*.mlp.c_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(gather_output=True),  # tied to wte: the same rows
    }
