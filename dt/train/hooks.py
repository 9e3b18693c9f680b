"""What happens around each training step, apart from the step itself: the loop calls two hooks.

    hooks = StepHooks(args, data, forward_loss, rank=..., dp_rank=..., start=start, ...)
    for step in range(start, args.steps):
        hooks.begin(step, optimizer)         # the learning rate of this step (warmup + cosine)
        loss = ...                           # the training step
        hooks.end(step, loss, times, grad_norm)   # validation, metrics line, progress line
    hooks.close()

Every rank calls both (validation is collective over the mesh); only rank 0
writes the metrics file and the progress line. `times` is the loop's
cumulative time split; the hooks take the step's share as the difference.
Time spent validating is kept apart (`eval_s`), so tokens/s is training's.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from dt.train.dataset import TrainData
from dt.train.evaluate import ForwardLoss, validation_loss
from dt.train.layouts import world
from dt.train.metrics import MetricsLog, mfu, run_marker
from dt.train.peak import format_mfu
from dt.train.progress import Progress
from dt.train.schedule import WarmupCosine

__all__ = ["StepHooks", "schedule_of"]


def schedule_of(args: argparse.Namespace) -> WarmupCosine:
    """--lr, --warmup, --lr-min over --steps: without --warmup or --lr-min, a constant --lr."""
    floor = args.lr if getattr(args, "lr_min", None) is None else args.lr_min
    return WarmupCosine(peak=args.lr, warmup=getattr(args, "warmup", 0), total=args.steps, floor=floor)


class StepHooks:
    def __init__(self, args: argparse.Namespace, data: TrainData, forward_loss: ForwardLoss, *,
                 rank: int, dp_rank: int, start: int, desc: str,
                 flops_per_token: float | None = None, peak_flops: float | None = None):
        self.args, self.data, self.forward_loss = args, data, forward_loss
        self.rank, self.dp_rank = rank, dp_rank
        self.lr = schedule_of(args)
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.tokens_per_step = args.batch_size * args.block_size
        self.eval_every = getattr(args, "eval_every", 0)
        self.log = MetricsLog(getattr(args, "metrics", None) if rank == 0 else None,
                              run_marker(args, world(args), start) if rank == 0 else None)
        self.bar = Progress(args.steps, start, desc) if rank == 0 and not args.no_progress else None
        self.val_losses: list[tuple[int, float]] = []
        self.eval_s = 0.0
        self._t0, self._times, self._lr = 0.0, {}, 0.0

    def begin(self, step: int, optimizer: Any) -> None:
        """Set this step's learning rate on every parameter group."""
        self._lr = self.lr(step)
        for group in optimizer.param_groups:
            group["lr"] = self._lr
        self._t0 = time.perf_counter()

    def end(self, step: int, loss: float, times: dict[str, float], grad_norm: float | None = None) -> None:
        """After the step: validate when due, write its metrics line, move the progress line."""
        wall = time.perf_counter() - self._t0
        split = {k: v - self._times.get(k, 0.0) for k, v in times.items()}
        self._times = dict(times)
        done = step + 1
        tokens_per_s = self.tokens_per_step / wall if wall > 0 else 0.0
        record: dict[str, Any] = {"step": done, "loss": loss, "lr": self._lr, "grad_norm": grad_norm,
                                  "tokens_per_s": tokens_per_s, "time": split}
        if self.flops_per_token and self.peak_flops:
            record["mfu"] = mfu(self.flops_per_token, tokens_per_s, self.peak_flops)
        if self.eval_every and (done % self.eval_every == 0 or done == self.args.steps):
            t0 = time.perf_counter()
            record["val_loss"] = validation_loss(self.forward_loss, self.data, self.args, self.dp_rank)
            self.eval_s += time.perf_counter() - t0
            self.val_losses.append((done, record["val_loss"]))
        self.log.write(record)
        if self.bar is not None:
            self.bar.update(loss, _postfix(record, self.val_losses, done))

    def close(self) -> None:
        self.log.close()
        if self.bar is not None:
            self.bar.close()


def _postfix(record: dict[str, Any], val_losses: list[tuple[int, float]], done: int) -> dict[str, str]:
    """What the progress line shows beside the loss: the newest validation loss (with the step it
    was measured at, once older than this step), speed, MFU, norm."""
    out = {}
    if val_losses:
        at, val = val_losses[-1]
        out["val"] = f"{val:.4f}" + ("" if at == done else f" (step {at})")
    out["lr"] = f"{record['lr']:.2e}"
    if record.get("grad_norm") is not None:
        out["norm"] = f"{record['grad_norm']:.3f}"
    out["tok/s"] = f"{record['tokens_per_s']:.0f}"
    if record.get("mfu") is not None:
        out["MFU"] = format_mfu(record["mfu"])
    return out
