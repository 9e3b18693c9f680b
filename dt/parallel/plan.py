"""dt.parallelize: parallelism applied to a plain model from outside, by a plan, in one fixed order.

    model = GPT(GPTConfig(...))                            # dt/models/gpt.py: no parallelism inside
    grid = dt.Grid({"dp": 2, "tp": 2})
    dt.parallelize(model, grid, gpt_plan(model.cfg, grid.size("tp")))
    logits, loss = model(ids, targets)                     # the same function, tp ranks sharing the work

    grid = dt.Grid({"pp": 2, "dp": 2, "cp": 1, "tp": 2})   # every axis: one ParallelPlan, one call
    par = dt.parallelize(model, grid, ParallelPlan(tensor=gpt_plan(cfg, 2), blocks=gpt_blocks, virtual=1))
    step = dt.train.TrainStep(par, optimizer, micro_batches=4)   # dt/train/step.py

A plan maps module-name patterns (fnmatch: `*` matches any run of
characters, dots included) to styles (dt.parallel.tensor.styles). Each
matched module is swapped, in the model's own module order, for the
parallel layer its style makes from it; the model keeps its parameter names,
and a weight tied between two modules stays one parameter. This is
torchtitan's parallelize_module with dt's layers, and picotron's module
swap: the model file never mentions a group.

A ParallelPlan applies every kind of parallelism, always in ORDER (torchtitan's, for its reasons):

    tensor     swap modules for their tensor/sequence-parallel selves (grid "tp")
    context    swap attention's core for ring attention / Ulysses (grid "cp")
    experts    swap MoE MLPs for expert-parallel ones over the grid's "ep" split
    recompute  wrap each block (or attention core) so its activations are recomputed in backward
    pipeline   cut the model's block list (`blocks`) into this rank's stage(s) (grid "pp")
    data       DDP (overlapped), ZeRO 1-2 or FSDP (ZeRO 3, per chunk) over the grid's dp x cp plane

Why this order: the swaps come first because everything after them holds on
to parameters and modules, and must hold the final ones (a pipeline cut made
before a swap would keep the old layer; DDP's buckets and ZeRO's flat buffer
are views of the parameters they were given). Tensor before context and
experts: those replace the core of a module tensor parallelism has already
split by heads, so they see the split shapes. Recompute wraps whole blocks
(or only their attention cores: ring attention, when context parallelism
swapped it in), after every swap inside them (a wrapped block hides its parts'
names from the plan) and before the cut, which takes the wrapped blocks from
the model; a recompute region is at most one block, so it never spans a stage
boundary either way.
Data parallel last, as in torchtitan: it is per stage (each synchronises its
own gradients), its buckets follow the final parameters' order and sizes, and
its hooks must be the last ones registered.

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
from dt.parallel.context.style import ContextParallel, ShareLoss, SharePositions
from dt.parallel.data_parallel import DistributedDataParallel
from dt.parallel.expert.style import EXPERT_GROUP, ExpertParallel, ExpertParallelMoE, split_parameters
from dt.parallel.grid import GRADIENT_SYNC, Grid
from dt.parallel.pipeline.cut import StageCut, cut, drop_other_stages
from dt.parallel.recompute import recompute_plan
from dt.parallel.tensor.loss import SequenceParallelRMSNorm, VocabParallelLoss, sequence_shards
from dt.parallel.tensor.styles import (
    ColwiseParallel,
    FusedAttentionParallel,
    RowwiseParallel,
    SequenceParallelNorm,
    ShardSequence,
    Style,
    Ties,
    VocabParallel,
    VocabParallelHead,
)
from dt.parallel.zero import FullyShardedDataParallel
from dt.transport import default_device, resolve_group

__all__ = ["DATA_PARALLEL", "ORDER", "Parallel", "ParallelPlan", "Plan", "gpt_blocks", "gpt_context",
           "gpt_experts", "gpt_plan", "gpt_recompute", "hf_gpt2_plan", "hf_llama_plan", "llama_blocks",
           "llama_context", "llama_plan", "llama_recompute", "parallelize"]

ORDER = ("tensor", "context", "experts", "recompute", "pipeline", "data")
SWAP_AXES = {"tensor": "tp", "context": "cp", "experts": "ep", "recompute": None}  # the group each swaps on
DATA_PARALLEL = ("ddp", "zero1", "zero2", "zero3")  # how the dp x cp plane synchronises (dt.train.step)
DP_AXES = ("dp", "cp")  # dense gradients are averaged over this plane


@dataclass
class ParallelPlan:
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
    prefetch: bool = True  # zero3: each FSDP unit's all-gather issued behind the one before it


Plan = ParallelPlan  # the older public name, kept importable (README's examples use it)


@dataclass
class Parallel:
    """A model parallelized on this rank: its stage's chunks, as the pipeline runs them."""

    model: nn.Module  # the model (tensor-parallel); under pp > 1 only this stage's layers (cut.Elsewhere)
    grid: Grid
    stage: StageCut
    chunks: list[nn.Module]  # stage.chunks, each wrapped in DDP when data_parallel is "ddp"
    data_parallel: str
    dp_axes: tuple[str, ...]
    device: torch.device
    with_experts: bool = False  # the whole model has experts (this stage may hold none): every rank alike

    @property
    def ddp(self) -> list[DistributedDataParallel]:
        return [c for c in self.chunks if isinstance(c, DistributedDataParallel)]

    @property
    def fsdp(self) -> list[FullyShardedDataParallel]:
        return [c for c in self.chunks if isinstance(c, FullyShardedDataParallel)]

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once (what its optimizer steps; under FSDP its shards)."""
        seen: dict[int, nn.Parameter] = {}
        for c in self.chunks:
            for p in c.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    # -- sharded checkpoints (dt.parallel.checkpoint) ------------------------
    def checkpoint_layout(self) -> dict[str, Any]:
        sizes = self.grid.sizes
        extra = {k: sizes[k] for k in ("cp",) if sizes.get(k, 1) > 1}
        extra |= {"ep": self.grid.ep} if self.grid.ep > 1 else {}  # a checkpoint says what it did
        return {"dp": sizes.get("dp", 1), **extra, "tp": sizes.get("tp", 1), "pp": sizes.get("pp", 1),
                "virtual": len(self.stage.ranges), "zero": 3 if self.fsdp else 0}  # ZeRO 1-2: the optimizer's

    def checkpoint_places(self) -> list[tuple[torch.Tensor, list[Any]]]:
        """This stage's tensors under their names in the plain model, whatever the grid.

        A tensor-parallel layer holds its slice; dp x cp replicas split the writing; a
        weight two stages share is written by the first (the others load it). The names
        are the plain model's state_dict keys, so any grid reads any other's checkpoint:
        an expert keeps its global index (experts.{e}) and is replicated only over the
        ranks holding the same experts (grid.group("edp")), which split its writing.
        """
        held = {id(t) for c in self.stage.chunks for t in (*c.parameters(), *c.buffers())}
        keys = set(self.model.state_dict())
        experts = {id(p) for p in split_parameters(self.model)[1]}
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
            if id(t) in experts:
                pieces = [(replace(p, replica=c["edp"], replicas=self.grid.plane // self.grid.ep), at)
                          for p, at in pieces]
            out.append((t, pieces))
        for f in self.fsdp:  # its shards, each a piece of the parameters it covers (place_of)
            out += [(t, pieces) for t, pieces in f.checkpoint_places() if isinstance(t, nn.Parameter)]
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


def parallelize(model: nn.Module, grid: Grid, plan: Mapping[str, Style] | ParallelPlan,
                axis: str = "tp") -> Any:
    """Apply `plan` to `model` on `grid`: a mapping swaps modules on grid.group(axis) and returns the
    model; a ParallelPlan applies every parallelism in ORDER and returns this rank's Parallel.

    Collective over the world the first time the grid makes a group
    (Grid.group). Inputs must be the same on every rank of a tensor-parallel
    group (it shares its tokens).
    """
    if isinstance(plan, ParallelPlan):
        return _apply(model, grid, plan)
    return _swap(model, grid, plan, axis)


def _apply(model: nn.Module, grid: Grid, plan: ParallelPlan) -> Parallel:
    if plan.data_parallel not in DATA_PARALLEL:
        raise ValueError(f"ParallelPlan.data_parallel {plan.data_parallel!r}: "
                         f"one of {', '.join(DATA_PARALLEL)}")
    for kind in ORDER[:4]:  # the swaps, each on its axis (a style may name its own: Style.axis)
        entries = getattr(plan, kind)
        if entries:
            _swap(model, grid, entries, SWAP_AXES[kind])
    dp_axes = tuple(a for a in DP_AXES if a in grid.names)
    device = default_device(resolve_group(grid.group(*dp_axes)))  # the rank's GPU under NCCL
    model.to(device)
    if plan.blocks is None and grid.sizes.get("pp", 1) > 1:
        raise ValueError("a pipeline (pp > 1) cuts the model's block list: give the plan its `blocks`")
    layers = plan.blocks(model) if plan.blocks is not None else [model]
    stage = cut(layers, grid, plan.virtual, plan.stage_sizes) if "pp" in grid.names else \
        StageCut([nn.Sequential(*layers)], [range(len(layers))], 0, 1)
    chunks: list[nn.Module] = list(stage.chunks)
    # Experts differ across the plane's ranks, so DDP (which averages, and first broadcasts,
    # everything it wraps) would be wrong: with experts dt.train.step syncs after backward.
    with_experts = any(isinstance(m, ExpertParallelMoE) for m in model.modules())  # every rank alike
    if stage.stages > 1:  # the other stages' layers freed here: a pipeline splits the model's memory
        drop_other_stages(model, layers, stage)
    if plan.data_parallel == "ddp" and grid.size(*dp_axes) > 1 and not with_experts:  # overlapped
        chunks = [DistributedDataParallel(c, grid.group(*dp_axes, purpose=GRADIENT_SYNC)) for c in chunks]
    if plan.data_parallel == "zero3":
        chunks = _fully_sharded(model, grid, dp_axes, stage, with_experts, plan.prefetch)
    return Parallel(model, grid, stage, chunks, plan.data_parallel, dp_axes, device, with_experts)


def _fully_sharded(model: nn.Module, grid: Grid, dp_axes: tuple[str, ...], stage: StageCut,
                   with_experts: bool, prefetch: bool) -> list[FullyShardedDataParallel]:
    """Each of this stage's chunks under FSDP over the dp x cp plane (per stage, as torchtitan
    composes FSDP with a pipeline); each shard's pieces named as the plain model names its
    parameters (tensor-parallel slices included; a shared weight saved by its first stage), for
    checkpoints. A weight two stages share is a unit of its own, cut alike on both (the step sums
    its shard gradients over them)."""
    held = [{id(p) for p in c.parameters()} for c in stage.chunks]
    if sum(len(h) for h in held) != len(set().union(*held)):
        raise ValueError("FSDP (zero3) shards each chunk apart, but two chunks of this rank hold the same "
                         "weight (a tied embedding and head on one stage): use virtual 1, or untie them")
    # Experts differ across the plane: each is sharded over its replicas (edp), summed there, / dp x cp.
    edp = grid.group(EXPERT_GROUP) if with_experts else None  # every rank makes it (collective)
    experts = split_parameters(model)[1] if with_experts else []
    places = {id(t): pieces[0][0] if stage.saves(t) else replace(pieces[0][0], saved=False)
              for t, pieces in tensor_parallel_places(model)}
    return [FullyShardedDataParallel(c, grid.group(*dp_axes), place_of=lambda p: places[id(p)],
                                     separate=stage.shared, experts=experts, expert_group=edp,
                                     expert_divisor=grid.size(*dp_axes), prefetch=prefetch)
            for c in stage.chunks]


def _swap(model: nn.Module, grid: Grid, plan: Mapping[str, Style], axis: str | None) -> nn.Module:
    """Swap `model`'s modules in place for their parallel selves on grid.group(axis)."""
    matches = _matches(model, plan)  # a bad plan is refused before any group is made
    # Each style's group: grid.group(axis) unless it runs on its own axis (Style.axis: "ep", "cp").
    groups = {id(style): style.group_on(grid, axis) for _, style in matches}  # every rank, same order
    ties = Ties()  # weak: each replaced layer is freed once swapped out (one layer's copy at a time)
    for name, style in matches:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, style.apply(getattr(parent, child), groups[id(style)], name, ties))
    return model


def _divides(what: str, count: int, tp: int) -> None:
    if count % tp:
        raise ValueError(f"tensor parallelism splits attention by whole heads: {what} {count} is not "
                         f"divisible by tp {tp}")


def _context(cfg: Any, tp: int, cp: int, kind: str, attend: str, positions: str) -> dict[str, Style]:
    """Context parallel over cp ranks: attention's core across them, `positions` and the loss per share."""
    if cp < 1:
        raise ValueError(f"cp must be a whole number >= 1, got {cp}")
    if cp == 1:
        return {}
    if kind == "ulysses" and (cfg.n_head // tp) % cp:
        raise ValueError(f"Ulysses splits each tensor-parallel rank's {cfg.n_head // tp} heads over cp {cp}: "
                         "n_head must divide by tp * cp; use cp_attention='ring'")
    return {attend: ContextParallel(cfg.block_size, kind, cp), positions: SharePositions(cfg.block_size, cp),
            "loss": ShareLoss(cfg.block_size, cp)}


def _loss_parallel(cfg: Any, on: bool) -> dict[str, Style]:
    """The loss on this rank's vocabulary slice of the logits (the head then gathers nothing)."""
    return {"loss.per_token": VocabParallelLoss(cfg.vocab_size)} if on else {}


def gpt_context(cfg: Any, tp: int, cp: int, cp_attention: str = "ring") -> dict[str, Style]:
    """dt.models.gpt.GPT's context-parallel entries (styles on "cp"; empty at cp 1)."""
    return _context(cfg, tp, cp, cp_attention, "layers.*.attn.attend", "layers.0.wpe")


def gpt_experts(cfg: Any) -> dict[str, Style]:
    """dt.models.gpt.GPT's expert-parallel entry (on "ep"; empty without experts)."""
    return {"layers.*.mlp": ExpertParallel(cfg.block_size)} if getattr(cfg, "n_experts", 0) else {}


def gpt_recompute(cfg: Any, kind: bool | str = "full") -> dict[str, Style]:
    """dt.models.gpt.GPT's recompute: every block ("full", True) or every attention core ("selective")."""
    return recompute_plan(kind, [f"layers.{i}" for i in range(1, cfg.n_layer + 1)], "layers.*.attn.attend")


def llama_context(cfg: Any, tp: int, cp: int, cp_attention: str = "ring") -> dict[str, Style]:
    """dt.models.llama.Llama's context-parallel entries (styles on "cp"; empty at cp 1)."""
    return _context(cfg, tp, cp, cp_attention, "layers.*.self_attn.attend", "rotary")


def llama_recompute(cfg: Any, kind: bool | str = "full") -> dict[str, Style]:
    """dt.models.llama.Llama's recompute: every layer ("full", True) or attention core ("selective")."""
    return recompute_plan(kind, [f"layers.{i}" for i in range(cfg.n_layer)], "layers.*.self_attn.attend")


def gpt_plan(cfg: Any, tp: int, sequence_parallel: bool = False, *, cp: int = 1,
             cp_attention: str = "ring", recompute: bool | str = False, loss_parallel: bool = False,
             experts: bool = True) -> dict[str, Style]:
    """The plan of dt.models.gpt.GPT: Megatron's split; the logits gathered for the loss.

    sequence_parallel: between blocks (the layer norms, the residual stream) each
    rank holds block/tp tokens; sequences must split evenly over tp.
    Mixture-of-experts blocks (cfg.n_experts > 0) are expert parallel over the
    grid's "ep" group (replicated over tp: their tokens are). cp > 1: context
    parallel over "cp" (cp_attention "ring" or "ulysses"; inputs split by
    dt.parallel.context.style.shard_sequence). recompute: "full" (or True) every
    block's activations recomputed in backward, "selective" the attention cores'
    (dt.parallel.recompute). loss_parallel: the loss reads
    vocabulary-sharded logits (the model returns this rank's vocabulary slice).
    Each mode is one line below, from a function of its own (gpt_context,
    gpt_experts, gpt_recompute), so a caller applying the modes one at a time
    (experts=False, cp=1, recompute=False here) takes those parts alone.

    A training step around the parallelized model: under cp, every rank of a
    cp group takes the same whole sequences and keeps shard_sequence(ids, grid)
    and shard_sequence(targets, grid); its loss function is `model.loss` (cp's
    rescaling and loss_parallel live there, so a pipeline's last stage must call
    it, not lm_loss); micro-batches: dt.models.moe.set_batch_sequences(model, B);
    gradients: dt.parallel.expert.style.split_parameters(model) -> dense (average
    over dp x cp, dense_axes(grid)) and experts (SUM over EXPERT_GROUP "edp",
    then / grid.plane).
    """
    _divides("n_head", cfg.n_head, tp)
    sp = sequence_parallel
    if getattr(cfg, "n_experts", 0) and sp:
        raise ValueError("sequence parallelism splits a sequence's tokens over tp, but a mixture of "
                         "experts routes whole sequences: use sequence_parallel=False with n_experts")
    head = f"layers.{cfg.n_layer + 1}"
    plan: dict[str, Style] = {
        "layers.0.wte": VocabParallel(),
        "layers.*.attn.query_key_value": ColwiseParallel(sequence_parallel=sp),  # whole heads per rank
        "layers.*.attn.dense": RowwiseParallel(sequence_parallel=sp),
    }
    if not getattr(cfg, "n_experts", 0):
        plan["layers.*.mlp.dense_h_to_4h"] = ColwiseParallel(sequence_parallel=sp)
        plan["layers.*.mlp.dense_4h_to_h"] = RowwiseParallel(sequence_parallel=sp)
    if cfg.tied:
        plan[head] = VocabParallelHead(gather_output=not loss_parallel, sequence_parallel=sp)
    else:
        plan[f"{head}.lm_head"] = ColwiseParallel(gather_output=not loss_parallel, sequence_parallel=sp)
    if sp:
        # The embedding sums token and position rows for the whole sequence, then keeps this rank's.
        plan["layers.0"] = ShardSequence()
        plan["layers.*.ln_[12]"] = SequenceParallelNorm()
        if not cfg.tied:
            plan[f"{head}.ln_f"] = SequenceParallelNorm()
    plan |= gpt_experts(cfg) if experts else {}
    plan |= gpt_context(cfg, tp, cp, cp_attention)
    plan |= _loss_parallel(cfg, loss_parallel)
    plan |= gpt_recompute(cfg, recompute)
    return plan


def _llama(n_head: int, n_kv_head: int, tp: int, body: str, sp: bool = False,
           gather: bool = True) -> dict[str, Style]:
    """Llama's split, its decoder under `body` (HF nests it in `model.`): heads whole, SwiGLU by columns."""
    _divides("n_head", n_head, tp)
    _divides("n_kv_head", n_kv_head, tp)
    return {
        f"{body}embed_tokens": VocabParallel(sequence_parallel=sp),
        f"{body}layers.*.self_attn.[qkv]_proj": ColwiseParallel(sequence_parallel=sp),
        f"{body}layers.*.self_attn.o_proj": RowwiseParallel(sequence_parallel=sp),
        f"{body}layers.*.mlp.gate_proj": ColwiseParallel(sequence_parallel=sp),
        f"{body}layers.*.mlp.up_proj": ColwiseParallel(sequence_parallel=sp),
        f"{body}layers.*.mlp.down_proj": RowwiseParallel(sequence_parallel=sp),
        # tied or not: the embedding's rows
        "lm_head": ColwiseParallel(gather_output=gather, sequence_parallel=sp),
    }


def llama_plan(cfg: Any, tp: int, sequence_parallel: bool = False, *, cp: int = 1,
               cp_attention: str = "ring", recompute: bool | str = False,
               loss_parallel: bool = False) -> dict[str, Style]:
    """The plan of dt.models.llama.Llama; the options are gpt_plan's.

    sequence_parallel: the RMSNorms and the residual stream on block/tp tokens
    per rank (each of q, k, v all-gathers its input: three gathers where a
    fused projection would need one).
    """
    sp = sequence_parallel
    plan = _llama(cfg.n_head, cfg.n_kv_head, tp, "", sp, gather=not loss_parallel)
    if sp:
        plan["layers.*_layernorm"] = SequenceParallelRMSNorm()  # input_ and post_attention_layernorm
        plan["norm"] = SequenceParallelRMSNorm()
    plan |= llama_context(cfg, tp, cp, cp_attention)
    plan |= _loss_parallel(cfg, loss_parallel)
    plan |= llama_recompute(cfg, recompute)
    return plan


def gpt_blocks(model: nn.Module) -> list[nn.Module]:
    """dt.models.gpt.GPT's block list: its layers already are [Embedding, Block x n, Head]."""
    return list(model.layers)


class _Rotated(nn.Module):
    """A Llama decoder layer as a pipeline layer x -> x: the model's rotary module held beside it.

    The tables are looked up through the module (as Llama.forward does), so a context-parallel
    plan's SharePositions hands every layer this rank's zig-zag positions, on any stage. Under
    sequence parallelism x holds this rank's share of the tokens, but attention's projections
    gather the whole sequence: the tables are the whole sequence's.
    """

    def __init__(self, layer: nn.Module, rotary: nn.Module):
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "rotary", rotary)  # the model's, not this layer's: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.shape[1] * sequence_shards(self.layer.input_layernorm)
        cos, sin = self.rotary(torch.arange(tokens, device=x.device))
        return self.layer(x, cos, sin)


def llama_blocks(model: nn.Module) -> list[nn.Module]:
    """dt.models.llama.Llama as [embed_tokens, decoder layer x n, (norm, lm_head)]: its forward, cut."""
    layers = [_Rotated(layer, model.rotary) for layer in model.layers]
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
