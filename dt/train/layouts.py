"""Which layouts `dt train` runs: the one rule, shared by `dt train` and `dt plan`.

A layout is a mesh (dp x cp x ep x tp x pp), a ZeRO stage, a pipeline
schedule (with its micro-batch count and virtual chunks) and the model and
batch it carries. `layout_error` says, in one line, why a layout cannot run,
or None when it can: dt train refuses with it before any process starts, and
the planner (dt.plan) enumerates only layouts it accepts, so every layout the
planner ranks is one `dt train` runs, and the other way round.

Only what the options say is checked here; whether the run fits in memory,
and how many processes this host holds, are dt train's other checks.
"""

from __future__ import annotations

from typing import Any

from dt.parallel.recompute import RECOMPUTE

__all__ = ["layout_error", "world"]


def world(a: Any) -> int:
    """Processes the mesh needs: ep lives inside dp x cp."""
    return a.dp * a.cp * a.tp * a.pp


def _sequence_parallel_error(a: Any) -> str | None:
    if not getattr(a, "sequence_parallel", False):
        return None
    if a.tp == 1:
        return "--sequence-parallel splits each sequence over the tensor-parallel ranks: it needs --tp > 1"
    if a.experts:
        return ("--sequence-parallel splits a sequence's tokens over tp, but a mixture of experts routes "
                "whole sequences: drop --experts or --sequence-parallel")
    if a.block_size % (a.cp * a.tp):
        return (f"--sequence-parallel splits each rank's {a.block_size} / cp tokens over tp: --block-size "
                f"must be divisible by cp * tp = {a.cp * a.tp}")
    return None


def _mesh_error(a: Any) -> str | None:
    if a.n_head % a.tp:
        return f"--n-head {a.n_head} must be divisible by --tp {a.tp}"
    if a.n_embd % a.n_head:
        return f"--n-embd {a.n_embd} must be divisible by --n-head {a.n_head}"
    if (a.dp * a.cp) % a.ep:
        return (f"--ep {a.ep} must divide dp * cp = {a.dp * a.cp}: the experts are spread "
                "over ranks of the data x context plane")
    if a.ep > 1 and not a.experts:
        return "--ep > 1 needs --experts (an MoE model)"
    if a.experts and not a.top_k <= a.experts:
        return f"--top-k must be between 1 and --experts {a.experts}"
    if a.zero == 3 and a.pp == 1 and a.virtual > 1 and not a.untied:
        return ("--zero 3 (FSDP) shards each chunk apart, but on one stage the tied embedding and head "
                "are two chunks of one rank: use --virtual 1, --untied, or --zero 1 or 2")
    model, kv = getattr(a, "model", "gpt"), getattr(a, "n_kv_head", None) or a.n_head
    if model == "llama" and a.experts:
        return "--model llama has no mixture of experts (dt.models.llama): --experts are the GPT's"
    if model == "llama" and a.n_head % kv:
        return f"--n-head {a.n_head} must be a multiple of --n-kv-head {kv}"
    if model == "llama" and kv % a.tp:
        return f"--n-kv-head {kv} must be divisible by --tp {a.tp} (whole heads per rank)"
    if model == "llama" and (a.n_embd // a.n_head) % 2:
        return f"--model llama needs an even head size: --n-embd {a.n_embd} / --n-head {a.n_head}"
    if a.cp > 1 and a.block_size < 2 * a.cp:
        return (f"--block-size {a.block_size} is too short for --cp {a.cp}: zig-zag gives each "
                "rank two chunks of every sequence (at least 2 * cp tokens)")
    if a.cp > 1 and a.cp_attention == "ulysses" and a.n_head % (a.tp * a.cp):
        return f"Ulysses needs --n-head {a.n_head} divisible by tp * cp = {a.tp * a.cp}"
    return None


def layout_error(a: Any) -> str | None:
    """Why dt train cannot run layout `a` (its options' names), in one line; None when it can.

    `a.micro_batches` must be set (dt train's default, 2 * pp capped at the
    per-rank batch, is filled in before this check).
    """
    per_rank = a.batch_size // a.dp
    if a.batch_size % a.dp or per_rank < 1:
        return f"--batch-size {a.batch_size} must be a positive multiple of --dp {a.dp}"
    if not 1 <= a.micro_batches <= per_rank:
        return f"--micro-batches must be between 1 and the per-rank batch {per_rank}"
    if a.virtual > 1 and a.schedule != "interleaved":
        return "--virtual > 1 needs --schedule interleaved"
    if a.n_layer + 2 < a.pp * a.virtual:
        return f"{a.n_layer} blocks + embedding + head cannot fill {a.pp} stages x {a.virtual} chunks"
    recompute = getattr(a, "recompute", False)
    if not isinstance(recompute, bool) and recompute not in RECOMPUTE:
        return f"--recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}"
    return _mesh_error(a) or _sequence_parallel_error(a)
