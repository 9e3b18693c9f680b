"""One pipeline stage at run time: its chunks of the model, playing its schedule out.

Pipeline.train_step walks this stage's actions (schedules.py) in order: a
forward receives its input from the stage before (or takes the micro-batch),
runs the chunk and sends the output on; a backward receives the output's
gradient from the stage after (or starts from the loss), runs autograd and
sends the input's gradient back. Activations stay stashed from their forward
to their backward; the stats say how many at most, and how long the stage
sat idle waiting on its neighbours (the bubble).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dt import transport
from dt.device import clock
from dt.parallel.pipeline.lockstep import stage_plan
from dt.parallel.pipeline.p2p import LABEL, StageLink
from dt.parallel.pipeline.p2p import header_groups as make_header_groups
from dt.parallel.pipeline.schedules import neighbour, schedule, stage_layers
from dt.parallel.pipeline.timeline import Orders

__all__ = ["LABEL", "MicroBatchHooks", "Pipeline", "PipelineStepStats", "stage_module"]


@dataclass
class MicroBatchHooks:
    """What a trainer wraps around each micro-batch's forward and backward (dt.train.step); all optional.

    autocast: a context manager entered around every forward (mixed precision).
    scale: applied to each micro-batch's weighted loss before its backward (loss
    scaling); the loss reported stays unscaled. before_backward(chunk, last):
    called before each backward of `chunk`, `last` True for that chunk's final
    micro-batch this step (data parallel then synchronises its gradients).
    """

    autocast: Callable[[], Any] | None = None
    scale: Callable[[torch.Tensor], torch.Tensor] | None = None
    before_backward: Callable[[int, bool], None] | None = None


def stage_module(layers: nn.Sequential | Sequence[nn.Module], group: Any = None,
                 sizes: Sequence[int] | None = None, virtual: int = 1) -> nn.Module:
    """This rank's stage: its slice of `layers` as an nn.Sequential.

    virtual=v cuts the model into p*v chunks (`sizes` then has p*v entries) and
    gives rank s the chunks s, s+p, s+2p, ... as an nn.ModuleList (stage_layers).
    """
    g = transport.resolve_group(group)
    layers = list(layers)
    chunks = [nn.Sequential(*[layers[i] for i in r])
              for r in stage_layers(len(layers), g.size, g.rank, sizes, virtual)]
    return chunks[0] if virtual == 1 else nn.ModuleList(chunks)


@dataclass
class PipelineStepStats:
    """What one pipeline step (train_step or forward) cost this stage."""

    step_s: float = 0.0      # wall time of the step
    idle_s: float = 0.0      # blocked on a receive or on the last sends: the bubble (+ wire time)
    compute_s: float = 0.0   # forward and backward of this stage's layers
    peak_stash: int = 0      # most (chunk, micro-batch) activations held at once
    bytes_sent: int = 0

    @property
    def bubble(self) -> float:
        return self.idle_s / self.step_s if self.step_s else 0.0


class Pipeline:
    """One stage of a pipeline over `group` (the pipeline group; stage = group rank)."""

    def __init__(self, module: nn.Module | Sequence[nn.Module], group: Any = None,
                 header_groups: dict[int, Any] | None = None):
        # A module is one stage; a list (or ModuleList) holds this rank's v virtual
        # stages, chunk c being part c*p + stage of the model (stage_module(virtual=v)).
        self.module = module
        chunks = module if isinstance(module, (list, tuple, nn.ModuleList)) else [module]
        self.chunks = list(chunks)
        self.group = transport.resolve_group(group)
        self.stage, self.stages = self.group.rank, self.group.size
        self.is_first, self.is_last = self.stage == 0, self.stage == self.stages - 1
        if header_groups is None and self.group.size == dist.get_world_size():
            # Every rank is building this pipeline: its header groups can be made here.
            header_groups = make_header_groups([self.group.ranks])
        self.wire = StageLink(self.group, header_groups)
        self.stats = PipelineStepStats()

    def _peer(self, chunk: int, direction: int) -> int | None:
        """Global rank of the chunk before (-1) or after (+1) this rank's `chunk`; None past the ends."""
        s = neighbour(self.stages, len(self.chunks), self.stage, chunk, direction)
        return None if s is None else self.group.global_rank(s)

    # -- steps ------------------------------------------------------------
    def _begin_step(self, orders: Orders) -> tuple[tuple[str, int, int], ...]:
        """Start a step in which every stage runs its actions in `orders`; this stage's actions."""
        self.stats = PipelineStepStats()
        me = self.group.global_rank(self.stage)
        actions = orders[self.stage]
        incoming = sum(1 for kind, c, _ in actions
                       if kind == "F" and self._peer(c, -1) not in (None, me))
        plan = stage_plan(orders, len(self.chunks), self.stage) if self.wire.lockstep else None
        self.wire.begin(incoming, plan)
        self._t_step = clock(self.wire.device)
        return actions

    def _orders(self, name: str, m: int, forward_only: bool = False) -> Orders:
        """Every stage's actions this step (each stage plans its messages from its neighbours')."""
        orders = (schedule(name, self.stages, s, m, len(self.chunks)) for s in range(self.stages))
        return tuple(tuple((kind, chunk, i) for kind, chunk, i in order if not forward_only or kind == "F")
                     for order in orders)

    def _end_step(self) -> None:
        """Wait for the step's last sends; the step's time, bytes and idle time into `stats`."""
        self.wire.drain()
        self.stats.step_s = clock(self.wire.device) - self._t_step
        self.stats.idle_s = self.wire.wait_s
        self.stats.bytes_sent = self.wire.bytes_sent

    def _micro(self, x: torch.Tensor | None, m: int) -> list[Any]:
        return list(torch.tensor_split(x, m)) if x is not None else [None] * m

    def train_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   micro_batches: int = 1, schedule_name: str = "1f1b",
                   hooks: MicroBatchHooks | None = None) -> float | None:
        """Forward and backward of one batch; gradients accumulate in the stage's parameters.

        `inputs` is needed on the first stage, `targets` on the last (others may
        pass None). The batch is cut into `micro_batches` pieces along dim 0
        (uneven allowed); each piece's loss is weighted by its share of the
        batch, so the gradients equal those of loss_fn on the whole batch when
        loss_fn is a mean. Returns the batch loss on the last stage, else None.
        """
        hooks = hooks or MicroBatchHooks()
        autocast = hooks.autocast or contextlib.nullcontext
        m = micro_batches
        batch = inputs if self.is_first else targets
        if batch is not None and m > batch.shape[0]:
            raise ValueError(f"{m} micro-batches of a batch of {batch.shape[0]}")
        actions = self._begin_step(self._orders(schedule_name, m))
        last_backward = {c: i for kind, c, i in actions if kind == "B"}  # each chunk's final one
        xs = self._micro(inputs if self.is_first else None, m)
        ys = self._micro(targets if self.is_last else None, m)
        n_total = targets.shape[0] if self.is_last else 0
        stash: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        total_loss = 0.0
        for kind, c, i in actions:
            prev, nxt = self._peer(c, -1), self._peer(c, +1)
            if kind == "F":
                x = xs[i] if prev is None else self.wire.recv(prev)
                if prev is not None and x.is_floating_point():
                    x.requires_grad_(True)
                t0 = clock(self.wire.device)
                with autocast():
                    out = self.chunks[c](x)
                    if nxt is None:  # the stash holds the weighted loss to backward from
                        out = loss_fn(out, ys[i]) * (ys[i].shape[0] / n_total)
                if nxt is None:
                    total_loss += out.item()
                    out = hooks.scale(out) if hooks.scale is not None else out
                self.stats.compute_s += clock(self.wire.device) - t0
                if nxt is not None:
                    self.wire.send(out, nxt, activation=True)
                stash[c, i] = (None if prev is None else x, out)
                self.stats.peak_stash = max(self.stats.peak_stash, len(stash))
            else:
                x, out = stash.pop((c, i))
                grad = None if nxt is None else self.wire.recv(nxt, like=out)
                if hooks.before_backward is not None:
                    hooks.before_backward(c, i == last_backward[c])
                t0 = clock(self.wire.device)
                torch.autograd.backward(out, grad)
                self.stats.compute_s += clock(self.wire.device) - t0
                if x is not None and x.is_floating_point():
                    self.wire.send(x.grad, prev, activation=False)
        self._end_step()
        return total_loss if self.is_last else None

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor | None, micro_batches: int = 1) -> torch.Tensor | None:
        """Inference: micro-batches flow forward only; the last stage returns the outputs."""
        # interleaved's forwards: micro-batches in groups of p through each chunk in turn
        actions = self._begin_step(self._orders("interleaved", micro_batches, forward_only=True))
        xs, outs = self._micro(inputs if self.is_first else None, micro_batches), []
        for _, c, i in actions:
            prev, nxt = self._peer(c, -1), self._peer(c, +1)
            x = xs[i] if prev is None else self.wire.recv(prev)
            t0 = clock(self.wire.device)
            out = self.chunks[c](x)
            self.stats.compute_s += clock(self.wire.device) - t0
            if nxt is None:
                outs.append((i, out))
            else:
                self.wire.send(out, nxt, activation=True)
        self._end_step()
        return torch.cat([o for _, o in sorted(outs, key=lambda io: io[0])]) if self.is_last else None
