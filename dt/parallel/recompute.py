"""Activation recompute (checkpointing), full (per block) or selective (the attention core), as plan entries.

    plan |= {f"layers.{i}": Recompute() for i in range(1, cfg.n_layer + 1)}   # gpt_plan(recompute="full")
    plan |= {"layers.*.attn.attend": Recompute()}                      # gpt_plan(recompute="selective")

A block's forward normally keeps every intermediate it will need in
backward (attention scores, the MLP's 4h activations, ...). Recompute()
runs the block under torch.utils.checkpoint (non-reentrant): forward keeps
only the block's inputs, and backward runs the block's forward again to
rebuild the rest just before it is needed. Saved activations fall from
every block's intermediates to one [b, s, h] input per block, for one more
forward of compute per step (Chen et al. 2016; Megatron's full recompute).

Selective recompute (Korthikanti et al. 2022, arXiv 2205.05198) wraps only the
attention core, softmax(q k^T) v, whose saved tensors grow with the sequence
(the s^2 scores when written out; torch's fused kernel keeps its output and
log-sum-exp instead) while its FLOPs are a small share of the block's: the
linear layers keep their inputs as without recompute, the core keeps only its
q, k, v, and backward reruns the core alone. The same style does it, applied
to the core module (`recompute_plan` says which modules each kind wraps).

Gradients are bit for bit those without recompute: the same operations run
on the same values (no dropout here; a block drawing random numbers would
need torch.utils.checkpoint's RNG preservation, which it keeps on by default).

A hook, not a swap: the block keeps its class, names and parameters (its
instance's forward is wrapped), so the tensor- and context-parallel styles
swap the modules inside it as without recompute, and their collectives run
again, in the same order on every rank, when the block is recomputed.
Apply it to the whole model before a pipeline cut (gpt_recompute(cfg), whose
names are the model's): the wrapped blocks travel into their stages, and no
recompute region spans a stage boundary. Counters a block's modules keep of
their forwards (an MoE's routing statistics, `counted`) are put back after
each recomputation, so they count every token once, as without recompute.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from dt.cost.flops import RECOMPUTE
from dt.parallel.tensor.styles import Style, Ties

__all__ = ["AGAIN", "FIRST", "RECOMPUTE", "Recompute", "recompute_kind", "recompute_phase", "recompute_plan",
           "recomputed"]

MARK = "recomputes"  # set on a block whose forward Recompute wrapped
# a module's dict of per-forward totals (dt.parallel.expert.ShardedMoE, dt.models.moe.MoE)
COUNTERS = "counted"
FIRST, AGAIN = "first", "again"  # a recomputed block's forward: the step's own, or its rerun in backward
_phase = threading.local()


def recompute_phase() -> str | None:
    """Which forward of a recomputed block is running on this thread: FIRST (the step's, whose
    activations are dropped), AGAIN (its rerun in backward), or None (outside any such block).

    FSDP reads it (dt.parallel.zero.fsdp): a unit inside a recomputed block gathers again in
    the rerun, which is what backward then uses, so it does not regather in backward too."""
    return getattr(_phase, "now", None)


@contextlib.contextmanager
def _in_phase(phase: str) -> Iterator[None]:
    before = recompute_phase()
    _phase.now = phase
    try:
        yield
    finally:
        _phase.now = before


@contextlib.contextmanager
def _keeping_counters(module: nn.Module) -> Iterator[None]:
    """Run a recomputation, then put every counter inside `module` back as it was before it."""
    kept = [(m, dict(getattr(m, COUNTERS))) for m in module.modules()
            if isinstance(getattr(m, COUNTERS, None), dict)]
    try:
        yield
    finally:
        for m, counts in kept:
            setattr(m, COUNTERS, counts)


@contextlib.contextmanager
def _both(a: Any, b: Any) -> Iterator[None]:
    with a, b:
        yield


def recomputed(module: nn.Module) -> bool:
    """Whether Recompute wrapped this module's forward."""
    return getattr(module, MARK, False)


class Recompute(Style):
    """Run the module's forward under torch.utils.checkpoint(use_reentrant=False)."""

    replaces = False

    def group_on(self, grid: Any, axis: str | None) -> None:
        return None  # no communication of its own: no group

    def apply(self, module: nn.Module, group: Any, name: str, ties: Ties) -> nn.Module:
        if recomputed(module):
            raise ValueError(f"{name}: Recompute is applied once per block; this one already recomputes")
        forward = type(module).forward  # the class's: children swapped later are what it calls

        def contexts() -> tuple[Any, Any]:  # (around the first forward, around each recomputation)
            return _in_phase(FIRST), _both(_keeping_counters(module), _in_phase(AGAIN))

        @functools.wraps(forward)
        def recompute(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(forward, module, *args, use_reentrant=False, context_fn=contexts, **kwargs)

        module.forward = recompute
        setattr(module, MARK, True)
        return module


def recompute_kind(value: bool | str) -> str:
    """One of RECOMPUTE ("none", "selective", "full") from a name or a bool (True: "full", False: "none")."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if value not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)} (or a bool), got {value!r}")
    return value


def recompute_plan(kind: bool | str, blocks: list[str], cores: str) -> dict[str, Style]:
    """The plan entries of a recompute kind: "full" wraps each of `blocks` (module names), "selective"
    the attention cores (`cores`, a pattern), "none" nothing."""
    kind = recompute_kind(kind)
    if kind == "full":
        return {name: Recompute() for name in blocks}
    return {cores: Recompute()} if kind == "selective" else {}
