"""The optimizer `dt train` steps: Adam, written out."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

__all__ = ["Adam"]


class Adam:
    """Adam (Kingma & Ba), written out: torch.optim's first use imports torch._dynamo,
    seconds per process, which every spawned rank would pay at once on a small box.

    State per parameter, laid out as torch.optim.Adam lays it out (so ZeroOptimizer
    can shard it and checkpoints read it alike): `step`, and two moments of the
    parameter's shape, `exp_avg` and `exp_avg_sq` (8 bytes per float32 parameter
    on top of the parameter and its gradient), made at the parameter's first step.
    Each rank updates only its own shard: after the gradient all-reduce every
    replica takes the same step. The update is torch.optim.Adam's (foreach=False),
    its bias corrections folded into scalars as torch folds them, so the two agree
    to rounding; it makes one temporary of the parameter's size (`denom`), freed
    before the next parameter's: the working set the planner prices
    (dt.cost.stack.Stack.optimizer_copies, the "dt" stack's).
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.param_groups = [{"params": [p for p in params if p.requires_grad], "lr": lr,
                              "betas": betas, "eps": eps}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st.update(step=torch.tensor(0.0),  # host: a counter, as torch.optim keeps it
                              exp_avg=torch.zeros_like(p),
                              exp_avg_sq=torch.zeros_like(p))
                st["step"] += 1
                t, m, v = float(st["step"]), st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                # p -= lr m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t),
                # with the bias corrections folded into scalars: one temporary, `denom`, freed
                # before the next parameter's is made
                denom = v.sqrt().div_(math.sqrt(1 - b2 ** t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
                del denom
