"""A run that diverged: a NaN or infinite loss, or weights that became so, ends the run before any save.

    check_loss(step, loss)                 # after every step: the global loss, the same on every rank
    check_weights(step, loss, run)         # before every checkpoint: collective over the world

Adam turns one step's infinite gradient into NaN weights, and the loss of that
step was computed before the update, so a finite loss does not make the weights
good: the step after it is the first whose loss shows it. A checkpoint is
therefore written only after every rank has found its own tensors finite (one
all-reduce of a flag per save, not per step). Either check raises `Diverged` on
every rank at the same step (the loss is the global batch's, averaged over the
ranks by dt.train.step; the weights' verdict is all-reduced), so no rank is left
waiting in a collective; `dt train` says it in one line and exits 1.
"""

from __future__ import annotations

import math

import torch

from dt.collectives import all_reduce
from dt.collectives.ops import ReduceOp

__all__ = ["Diverged", "check_loss", "check_weights"]


class Diverged(ArithmeticError):
    """Training diverged at `step`: nothing from this step on is saved."""

    def __init__(self, step: int, what: str):
        super().__init__(f"{what}: training diverged (try a lower --lr, --clip or --warmup); "
                         f"no checkpoint is written from this step on")
        self.step = step


def check_loss(step: int, loss: float) -> None:
    """Raise Diverged if the global loss of `step` (counted from 1) is NaN or infinite."""
    if not math.isfinite(loss):
        raise Diverged(step, f"the loss is {loss} at step {step}")


def check_weights(step: int, loss: float, parameters: list[torch.Tensor], world: int,
                  device: torch.device) -> None:
    """Collective over the world: raise Diverged on every rank if any rank holds a weight that is
    NaN or infinite after `step` (whose loss, `loss`, was finite)."""
    bad = torch.tensor([0.0 if all(bool(torch.isfinite(p).all()) for p in parameters) else 1.0],
                       device=device)
    if world > 1:
        all_reduce(bad, op=ReduceOp.MAX)
    if bad.item():
        raise Diverged(step, f"the weights hold NaN or infinity after step {step} (its loss was {loss:.4g})")

