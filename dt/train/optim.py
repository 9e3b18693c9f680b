"""The optimizer `dt train` steps: Adam, written out."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Adam"]


class Adam:
    """Adam (Kingma & Ba), written out: torch.optim's first use imports torch._dynamo,
    seconds per process, which every spawned rank would pay at once on a small box.

    State per parameter: two moments of its shape (8 bytes per float32 parameter
    on top of the parameter and its gradient). Each rank updates only its own
    shard: after the gradient all-reduce every replica takes the same step.
    """

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            m_hat, v_hat = m / (1 - b1 ** self.t), v / (1 - b2 ** self.t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t = state["t"]
        for mine, saved in zip(self.m + self.v, state["m"] + state["v"]):
            mine.copy_(saved)
