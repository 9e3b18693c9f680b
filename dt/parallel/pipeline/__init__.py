"""Pipeline parallelism: layers split into stages, micro-batches flowing through.

    stage = dt.pipeline.stage_module(model, group)       # this rank's layers
    pipe = dt.pipeline.Pipeline(stage, group)
    loss = pipe.train_step(x, y, loss_fn, micro_batches=8, schedule_name="1f1b")

Stage s (of p) runs layers [a_s, b_s) of the model. A batch is cut into m
micro-batches; stage s receives micro-batch i's activation from stage s-1,
runs its layers, sends the output to stage s+1; backward runs the other way
with the gradient of that activation. Per micro-batch and stage boundary one
activation of b*(...)*bytes goes forward and one gradient of the same size
comes back: 2 messages (plus a 64-byte header each, since shapes and dtypes
are sent, not agreed in advance) and no collective at all.

The price is the bubble. Stage s idles until the first micro-batch reaches it
and again while the last one drains, p-1 slots out of m+p-1 in all:

    bubble = (p - 1) / (m + p - 1)        (v virtual stages: (p-1) / (v*m + p-1))

GPipe runs every forward, then every backward, so each stage stashes the
activations of all m micro-batches. 1F1B (PipeDream-Flush) runs
min(p - s - 1, m) warm-up forwards, then alternates one forward with one
backward and drains the rest: the same bubble, but at most p micro-batches
stashed on any stage. Interleaving (Megatron) gives each rank v chunks of
1/v the layers (chunks s, s+p, ...): the fill and drain slots shrink to 1/v,
for v times more messages.

Why no schedule can deadlock here: every send is an isend that nobody waits
on until the end of the step, so sends never block; only receives block, and
a receive waits on a forward of the stage before or a backward of the stage
after, which those stages reach without waiting on this one (the wait-for
graph of each schedule is acyclic). Messages between two ranks arrive in the
order sent, and both ends walk the micro-batches in the same order.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dt import transport

__all__ = ["Pipeline", "StepStats", "bubble_fraction", "partition", "schedule", "stage_module"]


def bubble_fraction(p: int, m: int, virtual: int = 1) -> float:
    """Idle fraction of a pipeline step: (p-1) / (v*m + p-1).

    Each stage works v*m chunk-slots (m micro-batches through v model chunks
    of 1/v the work each) and idles p-1 of them while the pipe fills and
    drains. v=1 gives GPipe's and 1F1B's (p-1)/(m+p-1).
    """
    if p < 1 or m < 1 or virtual < 1:
        raise ValueError(f"p, m and virtual must be at least 1, got {p}, {m}, {virtual}")
    return (p - 1) / (virtual * m + p - 1)


def partition(n_layers: int, stages: int, sizes: Sequence[int] | None = None) -> list[range]:
    """Layer ranges of each stage: balanced by count (first stages get the extra) or `sizes`."""
    if sizes is None:
        if not 1 <= stages <= n_layers:
            raise ValueError(f"cannot split {n_layers} layers into {stages} non-empty stages")
        q, r = divmod(n_layers, stages)
        sizes = [q + (s < r) for s in range(stages)]
    if len(sizes) != stages or sum(sizes) != n_layers or min(sizes) < 1:
        raise ValueError(f"stage sizes {list(sizes)} must be {stages} positive counts "
                         f"summing to {n_layers}")
    starts = [sum(sizes[:s]) for s in range(stages)]
    return [range(a, a + n) for a, n in zip(starts, sizes)]


def stage_module(layers: nn.Sequential | Sequence[nn.Module], group: Any = None,
                 sizes: Sequence[int] | None = None, virtual: int = 1) -> nn.Module:
    """This rank's stage: its slice of `layers` as an nn.Sequential.

    virtual=v cuts the model into p*v chunks (`sizes` then has p*v entries) and
    gives rank s the chunks s, s+p, s+2p, ... as an nn.ModuleList.
    """
    g = transport.resolve_group(group)
    layers = list(layers)
    parts = partition(len(layers), g.size * virtual, sizes)
    chunks = [nn.Sequential(*[layers[i] for i in parts[c * g.size + g.rank]]) for c in range(virtual)]
    return chunks[0] if virtual == 1 else nn.ModuleList(chunks)


def schedule(name: str, p: int, s: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """The ordered ("F"|"B", chunk, micro-batch) actions of stage s.

    gpipe: every forward, then every backward. 1f1b: min(p-s-1, m) warm-up
    forwards, then one forward one backward, then the remaining backwards.
    interleaved (v chunks per stage): GPipe's order over the virtual stages,
    micro-batches in groups of p, each group through chunk 0, then chunk 1, ...
    (Megatron's order), backwards mirrored. Every stage sorts its actions by the
    same key, so a receive only ever waits on an action earlier in that order.
    """
    if name in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{name} runs one chunk per stage; use 'interleaved' for virtual={v}")
    if name == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if name == "1f1b":
        warmup = min(p - s - 1, m)
        acts = [("F", 0, i) for i in range(warmup)]
        for k in range(m - warmup):           # steady state: one forward, one backward
            acts += [("F", 0, warmup + k), ("B", 0, k)]
        acts += [("B", 0, i) for i in range(m - warmup, m)]  # cooldown
        return acts
    if name == "interleaved":
        work = [(c, i) for c in range(v) for i in range(m)]
        fwd = sorted(work, key=lambda ci: (ci[1] // p, ci[0], ci[1]))
        bwd = sorted(work, key=lambda ci: (ci[1] // p, v - 1 - ci[0], ci[1]))
        return [("F", c, i) for c, i in fwd] + [("B", c, i) for c, i in bwd]
    raise ValueError(f"unknown schedule {name!r}; one of 'gpipe', '1f1b', 'interleaved'")


# --------------------------------------------------------------------------
# Point-to-point with a header: the receiver learns shape and dtype first.
# --------------------------------------------------------------------------

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.bool, torch.uint8]
_HEADER = 8  # int64 words: dtype code, ndim, up to 6 dims


def _header(t: torch.Tensor) -> torch.Tensor:
    if t.dim() > _HEADER - 2:
        raise ValueError(f"pipeline activations have at most {_HEADER - 2} dims, got {t.dim()}")
    h = torch.zeros(_HEADER, dtype=torch.int64)
    h[0], h[1] = _DTYPES.index(t.dtype), t.dim()
    h[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return h


@dataclass
class StepStats:
    """What one step cost this stage."""

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

    def __init__(self, module: nn.Module | Sequence[nn.Module], group: Any = None):
        # A module is one stage; a list (or ModuleList) holds this rank's v virtual
        # stages, chunk c being part c*p + stage of the model (stage_module(virtual=v)).
        self.module = module
        chunks = module if isinstance(module, (list, tuple, nn.ModuleList)) else [module]
        self.chunks = list(chunks)
        self.group = transport.resolve_group(group)
        self.stage, self.stages = self.group.rank, self.group.size
        self.me = self.group.global_rank(self.stage)
        self.is_first, self.is_last = self.stage == 0, self.stage == self.stages - 1
        self.stats = StepStats()
        self._sends: list[tuple[Any, torch.Tensor]] = []
        self._loopback: deque[torch.Tensor] = deque()

    # -- wire -------------------------------------------------------------
    def _send(self, t: torch.Tensor, dst: int) -> None:
        t = t.detach().contiguous()
        if dst == self.me:  # one stage holding consecutive chunks: no wire
            self._loopback.append(t)
            return
        h = _header(t)
        # Kept alive (with their handles) until the end of the step: isend
        # reads the buffer while the transfer is in flight.
        for buf in (h, t):
            self._sends.append((transport.isend(buf, dst, self.group), buf))
        self.stats.bytes_sent += t.numel() * t.element_size() + h.numel() * 8

    def _recv(self, src: int) -> torch.Tensor:
        if src == self.me:
            return self._loopback.popleft()
        t0 = time.perf_counter()
        h = torch.empty(_HEADER, dtype=torch.int64)
        transport.irecv(h, src, self.group).wait()
        dtype, ndim = _DTYPES[int(h[0])], int(h[1])
        t = torch.empty(h[2:2 + ndim].tolist(), dtype=dtype)
        transport.irecv(t, src, self.group).wait()
        self.stats.idle_s += time.perf_counter() - t0
        return t

    def _drain_sends(self) -> None:
        t0 = time.perf_counter()
        for handle, _ in self._sends:
            handle.wait()
        self._sends.clear()
        self.stats.idle_s += time.perf_counter() - t0

    def _peer(self, chunk: int, direction: int) -> int | None:
        """Global rank of the chunk before (-1) or after (+1) this rank's `chunk`.

        Virtual position pos = chunk * p + stage lives on rank pos % p, so with
        v > 1 the last rank hands on to the first rank's next chunk.
        """
        pos = chunk * self.stages + self.stage + direction
        if not 0 <= pos < self.stages * len(self.chunks):
            return None  # the model's input, or its loss
        return self.group.global_rank(pos % self.stages)

    # -- steps ------------------------------------------------------------
    def _micro(self, x: torch.Tensor | None, m: int) -> list[Any]:
        return list(torch.tensor_split(x, m)) if x is not None else [None] * m

    def train_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   micro_batches: int = 1, schedule_name: str = "1f1b") -> float | None:
        """Forward and backward of one batch; gradients accumulate in the stage's parameters.

        `inputs` is needed on the first stage, `targets` on the last (others may
        pass None). The batch is cut into `micro_batches` pieces along dim 0
        (uneven allowed); each piece's loss is weighted by its share of the
        batch, so the gradients equal those of loss_fn on the whole batch when
        loss_fn is a mean. Returns the batch loss on the last stage, else None.
        """
        m = micro_batches
        batch = inputs if self.is_first else targets
        if batch is not None and m > batch.shape[0]:
            raise ValueError(f"{m} micro-batches of a batch of {batch.shape[0]}")
        self.stats = StepStats()
        t_step = time.perf_counter()
        xs = self._micro(inputs if self.is_first else None, m)
        ys = self._micro(targets if self.is_last else None, m)
        n_total = targets.shape[0] if self.is_last else 0
        stash: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
        total_loss = 0.0
        for kind, c, i in schedule(schedule_name, self.stages, self.stage, m, len(self.chunks)):
            prev, nxt = self._peer(c, -1), self._peer(c, +1)
            if kind == "F":
                x = xs[i] if prev is None else self._recv(prev)
                if prev is not None and x.is_floating_point():
                    x.requires_grad_(True)
                t0 = time.perf_counter()
                out = self.chunks[c](x)
                if nxt is None:  # the stash holds the weighted loss to backward from
                    out = loss_fn(out, ys[i]) * (ys[i].shape[0] / n_total)
                    total_loss += out.item()
                self.stats.compute_s += time.perf_counter() - t0
                if nxt is not None:
                    self._send(out, nxt)
                stash[c, i] = (None if prev is None else x, out)
                self.stats.peak_stash = max(self.stats.peak_stash, len(stash))
            else:
                x, out = stash.pop((c, i))
                grad = None if nxt is None else self._recv(nxt)
                t0 = time.perf_counter()
                torch.autograd.backward(out, grad)
                self.stats.compute_s += time.perf_counter() - t0
                if x is not None and x.is_floating_point():
                    self._send(x.grad, prev)
        self._drain_sends()
        self.stats.step_s = time.perf_counter() - t_step
        return total_loss if self.is_last else None

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor | None, micro_batches: int = 1) -> torch.Tensor | None:
        """Inference: micro-batches flow forward only; the last stage returns the outputs."""
        self.stats = StepStats()
        t_step = time.perf_counter()
        xs, outs = self._micro(inputs if self.is_first else None, micro_batches), []
        for kind, c, i in schedule("interleaved", self.stages, self.stage, micro_batches,
                                   len(self.chunks)):
            if kind == "B":
                continue
            prev, nxt = self._peer(c, -1), self._peer(c, +1)
            x = xs[i] if prev is None else self._recv(prev)
            t0 = time.perf_counter()
            out = self.chunks[c](x)
            self.stats.compute_s += time.perf_counter() - t0
            if nxt is None:
                outs.append((i, out))
            else:
                self._send(out, nxt)
        self._drain_sends()
        self.stats.step_s = time.perf_counter() - t_step
        return torch.cat([o for _, o in sorted(outs, key=lambda io: io[0])]) if self.is_last else None
