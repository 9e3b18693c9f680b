"""Mixed precision: `--precision float32|tf32|bfloat16|float16`, what a training step wraps itself in.

    prec = Precision("float16", device)
    with prec.autocast():
        loss = model(x, y)                       # matmuls in 16 bits, weights stay float32
    prec.scale(loss).backward()                  # float16: the loss times the loss scale
    if prec.unscale_and_check(grads, group):     # every rank agrees whether any grad overflowed
        optimizer.step()                         # else the step is skipped and the scale halves

The weights, their gradients and the optimizer's state stay float32 (master
weights): autocast casts a matmul's inputs to 16 bits on the way in, so only
activations are narrow. An update smaller than a weight's last bit would be lost
if the weights were 16-bit; in float32 it is kept.

bfloat16 has float32's 8 exponent bits: nothing overflows that float32 would not,
so it needs no loss scale (unscale_and_check only reports, no communication).
Its 8-bit significand (7 stored) rounds each product's inputs by up to 2^-8
relative (2^-9 on average, round to nearest).

float16 has 11 significand bits but 5 exponent bits: gradients under 6e-8
flush to zero, so the loss is multiplied by a scale (2^16 to start) before the
backward and the gradients divided by it after. A scale too large overflows
some gradient to inf/nan: then the step is skipped on every rank (the check is
one 4-byte all-reduce of a flag, MAX over `group`, dt's own collective: a rank
that stepped alone would leave the replicas apart) and the scale halves; after
`growth_interval` good steps it doubles (torch's GradScaler's policy). CPU
autocast supports float16 in this torch (2.13), so it runs on the CPU too,
slowly: it is for GPUs.

tf32 casts nothing: the tensors stay float32 and a GPU's float32 matmuls run on
its TF32 tensor cores (inputs rounded to a 10-bit significand, float32 sums), for
the whole run (`float32_matmuls`). A CPU has no such mode, so `dt train` refuses it there.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from dt.collectives import all_reduce
from dt.collectives.ops import ReduceOp

__all__ = ["PRECISIONS", "Precision", "autocast_dtype", "float32_matmuls"]

PRECISIONS = ("float32", "tf32", "bfloat16", "float16")  # dt.args.precision's names


def autocast_dtype(kind: str) -> torch.dtype:
    """The dtype a precision's matmul inputs are cast to (tf32: float32 tensors, TF32 matmuls)."""
    return torch.float32 if kind == "tf32" else getattr(torch, kind)


@contextlib.contextmanager
def float32_matmuls(kind: str) -> Iterator[None]:
    """Inside: float32 matmuls on TF32 tensor cores when kind is tf32 (as they were, after)."""
    if kind != "tf32":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # "high": TF32 where the device has it
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class Precision:
    def __init__(self, kind: str = "float32", device: torch.device | str = "cpu", *,
                 init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        if kind not in PRECISIONS:
            raise ValueError(f"unknown precision {kind!r}; choose one of {', '.join(PRECISIONS)}")
        self.kind, self.device = kind, torch.device(device)
        self.dtype = autocast_dtype(kind)
        self.loss_scale = init_scale if kind == "float16" else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0  # since the scale last changed
        self.skipped = 0  # steps skipped for an overflow, this run

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward in 16 bits (float32 and tf32: as it is)."""
        if self.kind in ("float32", "tf32"):
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: times the loss scale under float16."""
        return loss * self.loss_scale if self.kind == "float16" else loss

    def unscale_and_check(self, grads: Iterable[torch.Tensor | None], group: Any = None) -> bool:
        """Divide the gradients by the loss scale; True when every rank's are finite (take the step).

        Collective over `group` under float16 (every rank gets the same answer); the
        scale is updated here. Other precisions: True, no communication.
        """
        if self.kind != "float16":
            return True
        grads = [g for g in grads if g is not None]
        inv = 1.0 / self.loss_scale
        bad = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else self.device)
        for g in grads:
            g.mul_(inv)
            bad = torch.maximum(bad, (~torch.isfinite(g)).any().float().reshape(1))
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            all_reduce(bad, op=ReduceOp.MAX, group=group)
        ok = bool(bad.item() == 0)
        self._update(ok)
        return ok

    def _update(self, ok: bool) -> None:
        if not ok:
            self.loss_scale = max(self.loss_scale / 2, 1.0)
            self.good_steps, self.skipped = 0, self.skipped + 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval and math.isfinite(self.loss_scale * 2):
            self.loss_scale *= 2
            self.good_steps = 0

    def state_dict(self) -> dict[str, float]:
        """What a checkpoint keeps to resume the same scale."""
        return {"loss_scale": self.loss_scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.loss_scale, self.good_steps = float(state["loss_scale"]), int(state["good_steps"])
