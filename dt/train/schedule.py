"""The learning rate at each step: linear warmup, then cosine decay to a floor.

    lr = WarmupCosine(peak=3e-4, warmup=100, total=5000, floor=3e-5)
    lr(0) == 3e-6, lr(99) == 3e-4, lr(2550) == 1.65e-4, lr(5000) == 3e-5

Warmup (steps 0 .. warmup-1 rise as peak * (step + 1) / warmup): Adam's
second-moment estimate starts from a handful of gradients, so its first
steps are large and noisy; ramping the rate up keeps them from throwing the
freshly initialised weights far off. Cosine decay (warmup .. total): the
rate falls slowly at first, fastest mid-way and gently at the end, to
floor, where it stays if training runs on. nanoGPT and the GPT-3 and Llama
papers train this way, with the floor a tenth of the peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["WarmupCosine"]


@dataclass(frozen=True)
class WarmupCosine:
    peak: float
    warmup: int
    total: int
    floor: float = 0.0

    def __post_init__(self) -> None:
        if not self.peak > 0 or not 0 <= self.floor <= self.peak:
            raise ValueError(f"the learning rate schedule needs peak > 0 and 0 <= floor <= peak, got "
                             f"peak {self.peak}, floor {self.floor}")
        if not 0 <= self.warmup <= self.total:
            raise ValueError(f"the learning rate schedule needs 0 <= warmup <= total steps, got "
                             f"warmup {self.warmup}, total {self.total}")

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"no learning rate before step 0 (asked for step {step})")
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if step >= self.total:
            return self.floor
        progress = (step - self.warmup) / (self.total - self.warmup)
        return self.floor + (self.peak - self.floor) * 0.5 * (1 + math.cos(math.pi * progress))
