"""dt.parallelize: tensor (and sequence) parallelism applied to a plain model from outside, by a plan.

    model = GPT(GPTConfig(...))                            # dt/models/nanogpt.py: no parallelism inside
    grid = dt.Grid({"dp": 2, "tp": 2})
    dt.parallelize(model, grid, gpt_plan(model.cfg, grid.size("tp")))
    logits, loss = model(ids, targets)                     # the same function, tp ranks sharing the work

A plan maps module-name patterns (fnmatch: `*` matches any run of
characters, dots included) to styles (dt.parallel.tensor.styles). Each
matched module is swapped, in the model's own module order, for the
parallel layer its style makes from it; the model keeps its parameter names,
and a weight tied between two modules stays one parameter. This is
torchtitan's parallelize_module with dt's layers, and picotron's module
swap: the model file never mentions a group.

A plan is checked before anything is swapped: a pattern matching nothing
(a typo would otherwise leave a layer unsplit, silently correct and slow), a
module matched twice, one matched inside another, or a weight the plan splits
that a module outside it shares, are each one clear error.

gpt_plan and llama_plan are the plans of dt's plain models, hf_gpt2_plan and
hf_llama_plan those of Hugging Face transformers' GPT2LMHeadModel and
LlamaForCausalLM, built from their configs (this module never imports
transformers). All are Megatron's split: QKV and the MLP's first matrices by
columns, the output projections by rows, the vocabulary by rows of the
embedding and the head.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from torch import nn

from dt.parallel.context.style import ContextParallel, ShareLoss, SharePositions
from dt.parallel.expert.style import ExpertParallel
from dt.parallel.grid import Grid
from dt.parallel.recompute import Recompute
from dt.parallel.tensor.loss import SequenceParallelRMSNorm, VocabParallelLoss
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

__all__ = ["gpt_context", "gpt_experts", "gpt_plan", "gpt_recompute", "hf_gpt2_plan", "hf_llama_plan",
           "llama_context", "llama_plan", "llama_recompute", "parallelize"]


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


def parallelize(model: nn.Module, grid: Grid, plan: Mapping[str, Style], axis: str = "tp") -> nn.Module:
    """Swap `model`'s modules in place for their tensor-parallel selves on grid.group(axis).

    Collective over the world the first time the grid makes that group
    (Grid.group). Returns the model. Inputs must be the same on every rank of
    the group (a tensor-parallel group shares its tokens).
    """
    matches = _matches(model, plan)  # a bad plan is refused before any group is made
    # Each style's group: grid.group(axis) unless it runs on its own axis (Style.axis: "ep", "cp").
    groups = {id(style): style.group_on(grid, axis) for _, style in matches}  # every rank, same order
    ties: dict[int, nn.Parameter] = {}
    replaced: list[nn.Module] = []  # kept alive so the ids in `ties` stay theirs
    for name, style in matches:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        setattr(parent, child, style.apply(old, groups[id(style)], name, ties))
        replaced.append(old)
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


def _recompute(blocks: range) -> dict[str, Style]:
    """Every block recomputed in backward (dt.parallel.recompute)."""
    return {f"layers.{i}": Recompute() for i in blocks}


def gpt_context(cfg: Any, tp: int, cp: int, cp_attention: str = "ring") -> dict[str, Style]:
    """dt.models.nanogpt.GPT's context-parallel entries (styles on "cp"; empty at cp 1)."""
    return _context(cfg, tp, cp, cp_attention, "layers.*.attn.attend", "layers.0.wpe")


def gpt_experts(cfg: Any) -> dict[str, Style]:
    """dt.models.nanogpt.GPT's expert-parallel entry (on "ep"; empty without experts)."""
    return {"layers.*.mlp": ExpertParallel(cfg.block_size)} if getattr(cfg, "n_experts", 0) else {}


def gpt_recompute(cfg: Any) -> dict[str, Style]:
    """Every block of dt.models.nanogpt.GPT recomputed in backward."""
    return _recompute(range(1, cfg.n_layer + 1))


def llama_context(cfg: Any, tp: int, cp: int, cp_attention: str = "ring") -> dict[str, Style]:
    """dt.models.llama.Llama's context-parallel entries (styles on "cp"; empty at cp 1)."""
    return _context(cfg, tp, cp, cp_attention, "layers.*.self_attn.attend", "rotary")


def llama_recompute(cfg: Any) -> dict[str, Style]:
    """Every decoder layer of dt.models.llama.Llama recomputed in backward."""
    return _recompute(range(cfg.n_layer))


def gpt_plan(cfg: Any, tp: int, sequence_parallel: bool = False, *, cp: int = 1,
             cp_attention: str = "ring", recompute: bool = False, loss_parallel: bool = False,
             experts: bool = True) -> dict[str, Style]:
    """The plan of dt.models.nanogpt.GPT: Megatron's split; the logits gathered for the loss.

    sequence_parallel: between blocks (the layer norms, the residual stream) each
    rank holds block/tp tokens; sequences must split evenly over tp.
    Mixture-of-experts blocks (cfg.n_experts > 0) are expert parallel over the
    grid's "ep" group (replicated over tp: their tokens are). cp > 1: context
    parallel over "cp" (cp_attention "ring" or "ulysses"; inputs split by
    dt.parallel.context.style.shard_sequence). recompute: every block's
    activations recomputed in backward. loss_parallel: the loss reads
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
    plan |= gpt_recompute(cfg) if recompute else {}
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
               cp_attention: str = "ring", recompute: bool = False,
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
    plan |= llama_recompute(cfg) if recompute else {}
    return plan


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
