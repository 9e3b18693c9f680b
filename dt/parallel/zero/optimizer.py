"""ZeRO stages 1 and 2: a drop-in optimizer that keeps only this rank's shard of the state.

Parameters stay whole on every rank; the optimizer state (stage 1) and the
gradients (stage 2) are sharded. Per step, per rank, with the ring: a
reduce-scatter of the gradients and an all-gather of the updated parameters,
exactly the bytes of DDP's ring all-reduce (zero_traffic_formula).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from dt.collectives import all_gather, broadcast, reduce_scatter, shm_empty
from dt.collectives.ops import ReduceOp
from dt.collectives.scratch import held_bytes
from dt.device import clock
from dt.layout import edges, split_sizes
from dt.parallel.buckets import MB, make_buckets
from dt.parallel.data_parallel import LABEL as DATA_LABEL
from dt.parallel.data_parallel import bucket_sender
from dt.parallel.zero.memory import (
    SHARD_ALGORITHM,
    comm_scratch_formula,
    memory_held,
    zero_memory_formula,
    zero_traffic_formula,
)
from dt.parallel.zero.shards import cut_optimizer_state, full_optimizer_state
from dt.transport import charged_to, default_device, resolve_group

__all__ = ["ShardedOptimizer", "ZeroOptimizer"]


@runtime_checkable
class ShardedOptimizer(Protocol):
    """An optimizer whose averaged gradient lives in this rank's shard: ZeRO's (ZeroOptimizer, ZeroParts).

    `isinstance(opt, ShardedOptimizer)` is how a step tells ZeRO from a replicated optimizer: it
    averages the gradients itself (reduce_gradients), so the step clips and unscales the shard.
    """

    def reduce_gradients(self) -> None: ...

    def shard_gradients(self) -> list[torch.Tensor]: ...

    def shard_pieces(self) -> list[tuple[nn.Parameter, torch.Tensor]]: ...


def _flat_buffer(numel: int, dtype: torch.dtype, device: torch.device, group: Any) -> torch.Tensor:
    """A flat buffer every rank makes at once: in the group's shared memory when on the CPU."""
    if device.type == "cpu":
        return shm_empty(numel, dtype=dtype, group=group)
    return torch.empty(numel, dtype=dtype, device=device)


class ZeroOptimizer:
    """`optimizer_cls` run on this rank's shard of `params`; ZeRO stage 1 or 2.

    Use in place of DDP + optimizer: plain (unwrapped) model, this optimizer.
    Parameters are broadcast from the group's first rank at construction.
    Stage 1: backward leaves full local gradients; step() reduce-scatters them
    (AVG) so each rank gets its shard averaged, updates that shard, and
    all-gathers the parameters. Stage 2: gradients are reduce-scattered in
    buckets during backward (hooks, as in DDP) and the full gradient of each
    parameter is freed as soon as it is in a bucket; only the shard is kept.
    """

    def __init__(self, params: Iterable[nn.Parameter], optimizer_cls: type[torch.optim.Optimizer],
                 stage: int = 1, group: Any = None, bucket_cap_mb: float = 25,
                 first_bucket_mb: float = 1, algorithm: str = SHARD_ALGORITHM,
                 divisor: int | None = None,
                 keep_full: Iterable[nn.Parameter] = (), **optim_kwargs: Any):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer does stages 1 and 2; stage 3 is "
                             f"FullyShardedDataParallel (got stage={stage})")
        self.params = [p for p in params if p.requires_grad]
        if len({p.dtype for p in self.params}) > 1:
            raise ValueError("ZeroOptimizer flattens all parameters into one buffer: one dtype")
        self.stage, self.group, self.algorithm = stage, resolve_group(group), algorithm
        n, r = self.group.size, self.group.rank
        # Gradients are summed over the group and divided by this: the group's size (an average),
        # unless more ranks than the group fed them (an expert's tokens come from the whole plane).
        self.divisor = n if divisor is None else divisor
        self.numels = [p.numel() for p in self.params]
        self.offsets = edges(self.numels)[:-1]
        self.psi = sum(self.numels)
        # One flat buffer; every parameter becomes a view into it. On CPU it lives in the
        # group's shared memory (dt.shm_empty), as do the flat gradients: the shared-memory
        # reduce-scatter and all-gather then read the peers' shards in place.
        device = self.params[0].device if self.params else default_device(self.group)
        self.flat = _flat_buffer(self.psi, self.params[0].dtype if self.params else torch.float32,
                                 device, self.group)
        if self.params:
            torch.cat([p.detach().reshape(-1) for p in self.params], out=self.flat)
        broadcast(self.flat, self.group.ranks[0], group=self.group)
        for p, o in zip(self.params, self.offsets):
            p.data = self.flat[o:o + p.numel()].view_as(p)
        self.shard_sizes = split_sizes(self.psi, n)
        self.start, self.end = edges(self.shard_sizes)[r:r + 2]
        self.shard = nn.Parameter(self.flat[self.start:self.end])  # aliases self.flat
        self.optimizer = optimizer_cls([self.shard], **optim_kwargs)
        self.last_step = {"comm_s": 0.0}
        self._reduced = False  # reduce_gradients has run since the last step

        if stage == 1:
            self.flat_grad = _flat_buffer(self.psi, self.flat.dtype, self.flat.device, self.group).zero_()
            for p, o in zip(self.params, self.offsets):
                p.grad = self.flat_grad[o:o + p.numel()].view_as(p)
        else:
            self.shard_grad = torch.zeros(self.end - self.start, dtype=self.flat.dtype,
                                          device=self.flat.device)
            # A weight another pipeline stage also holds (a tied embedding and head) keeps its full
            # gradient until reduce_gradients: its holders sum it after backward (the step's tied
            # sum), which a hook cannot (see _kept_out); it is reduce-scattered once, then.
            kept = {id(p) for p in keep_full}
            self.kept = [i for i, p in enumerate(self.params) if id(p) in kept]
            self.buckets = self._make_buckets(int(first_bucket_mb * MB), int(bucket_cap_mb * MB))
            self._bucket_of = {i: b for b, idx in enumerate(self.buckets) for i in idx}
            self._index = {p: i for i, p in enumerate(self.params)}
            self._in_backward = False
            for i, p in enumerate(self.params):
                if i not in self.kept:
                    p.register_post_accumulate_grad_hook(self._grad_ready)

    # -- stage 2: bucketed reduce-scatter during backward --------------------
    def _make_buckets(self, first: int, cap: int) -> list[list[int]]:
        """Buckets in backward order, never across a kept parameter: they and the kept ranges tile
        the flat buffer, so a step scatters every element once per backward or once per step."""
        order = list(range(len(self.params)))[::-1]
        runs: list[list[int]] = [[]]
        for i in order:
            if i in self.kept:
                runs.append([])
            else:
                runs[-1].append(i)
        out: list[list[int]] = []
        for run in runs:
            if run:
                out += [[run[i] for i in b] for b in make_buckets(
                    [self.params[i] for i in run], first if not out else cap, cap)]
        return out

    def _kept_out(self) -> None:
        """Reduce-scatter each kept parameter's full gradient into the shard (once per step).

        Why not a hook, summing the tied gradient across its stages in backward: ZeRO 2's
        backward ends by waiting for its reduce-scatters, before the pipeline sends the
        input's gradient on, and the other stage reaches its half of the sum only after it
        receives that gradient: the two would wait on each other.
        """
        for i in self.kept:
            p, o = self.params[i], self.offsets[i]
            full = p.grad.reshape(-1) if p.grad is not None else self.flat.new_zeros(p.numel())
            a, z = min(max(self.start, o), o + p.numel()), min(max(self.end, o), o + p.numel())
            out = torch.empty(z - a, dtype=self.flat.dtype, device=self.flat.device)
            with charged_to(DATA_LABEL, self.algorithm):
                self._reduce_scatter_now(out, self._cut(o, o + p.numel(), full))
            self.shard_grad[a - self.start:z - self.start] += out
            p.grad = None

    def _range(self, b: int) -> tuple[int, int]:
        idx = self.buckets[b]
        return min(self.offsets[i] for i in idx), max(self.offsets[i] + self.numels[i] for i in idx)

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self._in_backward:
            self._in_backward = True
            self._next, self._works = 0, []
            self._buffers: dict[int, torch.Tensor] = {}
            self._arrived: dict[int, set[int]] = {}
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        i = self._index[p]
        b = self._bucket_of[i]
        lo, hi = self._range(b)
        if b not in self._buffers:
            self._buffers[b] = torch.zeros(hi - lo, dtype=self.flat.dtype, device=self.flat.device)
        self._buffers[b][self.offsets[i] - lo:self.offsets[i] - lo + p.numel()].copy_(p.grad.view(-1))
        p.grad = None  # the full gradient is not kept: that is stage 2
        self._arrived.setdefault(b, set()).add(i)
        while self._next < len(self.buckets) and \
                len(self._arrived.get(self._next, ())) == len(self.buckets[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, b: int) -> None:
        lo, hi = self._range(b)
        buf = self._buffers.setdefault(b, torch.zeros(hi - lo, dtype=self.flat.dtype,
                                                      device=self.flat.device))
        pieces = self._pieces(b, buf)
        a, z = min(max(self.start, lo), hi), min(max(self.end, lo), hi)
        out = torch.empty(z - a, dtype=self.flat.dtype, device=self.flat.device)
        # On dt's gradient thread, charged to data parallel's label (dt.parallel.data_parallel).
        work = bucket_sender().submit(self._reduce_scatter, out, pieces)
        self._works.append((work, out, a - self.start))

    def _reduce_scatter(self, out: torch.Tensor, pieces: list[torch.Tensor]) -> float:
        t0 = clock(self.flat.device)
        with charged_to(DATA_LABEL, self.algorithm):
            self._reduce_scatter_now(out, pieces)
        return clock(self.flat.device) - t0

    def _reduce_scatter_now(self, out: torch.Tensor, pieces: list[torch.Tensor]) -> None:
        """This rank's piece of the pieces summed over the group, divided by self.divisor."""
        average = self.divisor == self.group.size
        reduce_scatter(out, pieces, ReduceOp.AVG if average else ReduceOp.SUM, self.group,
                       algorithm=self.algorithm)
        if not average:
            out.div_(self.divisor)

    def _finish_backward(self) -> None:
        for b in range(self._next, len(self.buckets)):  # parameters with no grad: zeros
            self._launch(b)
        for work, out, at in self._works:
            self.last_step["comm_s"] += work.result()
            self.shard_grad[at:at + out.numel()] += out  # accumulate, like .grad
        self._buffers.clear()
        self._in_backward = False

    # -- the step --------------------------------------------------------------
    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Average the gradients over the group into this rank's shard (self.shard.grad).

        Stage 1: the reduce-scatter of the full local gradients; stage 2: backward
        already did it (the shard is ready). step() calls it when the caller has not:
        call it first to read or scale the averaged shard (clipping, loss scaling).
        """
        if self._reduced:
            return
        t0 = clock(self.flat.device)
        if self.stage == 1:
            for p, o in zip(self.params, self.offsets):
                slot = self.flat_grad[o:o + p.numel()].view_as(p)
                if p.grad is None:
                    slot.zero_()
                elif p.grad.data_ptr() != slot.data_ptr():
                    slot.copy_(p.grad)
                p.grad = slot
            mine = self.flat_grad[self.start:self.end]
            self._reduce_scatter_now(mine, list(self.flat_grad.split(self.shard_sizes)))
            self.shard.grad = mine
        else:
            self._kept_out()
            self.shard.grad = self.shard_grad
        self._reduced = True
        self.last_step["step_comm_s"] = clock(self.flat.device) - t0

    def shard_gradients(self) -> list[torch.Tensor]:
        """The gradient this rank holds once reduce_gradients has run: its shard's, averaged."""
        return [self.shard.grad]

    def shard_pieces(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """(parameter, its part of the shard's averaged gradient) for each parameter the shard
        covers, in order; after reduce_gradients. Views: scaling them scales the shard."""
        out = []
        for p, off, n in zip(self.params, self.offsets, self.numels):
            lo, hi = max(self.start, off), min(self.end, off + n)
            if lo < hi:
                out.append((p, self.shard.grad[lo - self.start:hi - self.start]))
        return out

    @torch.no_grad()
    def step(self) -> None:
        self.reduce_gradients()
        t0 = clock(self.flat.device)
        self.optimizer.step()
        all_gather(list(self.flat.split(self.shard_sizes)), self.shard.detach(), group=self.group,
                   algorithm=self.algorithm)
        self.last_step["step_comm_s"] = self.last_step.get("step_comm_s", 0.0) + clock(self.flat.device) - t0
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (kept as buffers: stage 1 full, stage 2 the shard)."""
        if self.stage == 1:
            self.flat_grad.zero_()
        else:
            self.shard_grad.zero_()
            for p in self.params:
                p.grad = None
        self.last_step = {"comm_s": 0.0}
        self._reduced = False

    # -- accounting and checkpoints --------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def memory(self) -> dict[str, int]:
        """Bytes held: parameters, gradients, optimizer state, and the collectives' scratch."""
        grads = [self.flat_grad] if self.stage == 1 else [self.shard_grad]
        grads += [p.grad for p in self.params]
        return {**memory_held(self.params, grads, self.optimizer), "comm_scratch": held_bytes()}

    def _scattered(self) -> list[list[int]]:
        """Element counts of the pieces of every reduce-scatter one step runs."""
        if self.stage == 1:
            return [self.shard_sizes]
        return [[t.numel() for t in self._pieces(b, None)] for b in range(len(self.buckets))] + \
            self._kept_cuts()

    def _kept_cuts(self) -> list[list[int]]:
        """Element counts of each kept parameter's reduce-scatter pieces."""
        return [[t.numel() for t in self._cut(self.offsets[i], self.offsets[i] + self.numels[i], None)]
                for i in self.kept]

    def _pieces(self, b: int, buf: torch.Tensor | None) -> list[torch.Tensor]:
        """Bucket b's buffer cut where the shards' boundaries fall (empty pieces included)."""
        return self._cut(*self._range(b), buf)

    def _cut(self, lo: int, hi: int, buf: torch.Tensor | None) -> list[torch.Tensor]:
        """`buf`, elements [lo, hi) of the flat buffer, cut where the shards' boundaries fall."""
        if buf is None:
            buf = torch.empty(hi - lo, device="meta")
        bounds = edges(self.shard_sizes)
        return [buf[min(max(bounds[j], lo), hi) - lo:min(max(bounds[j + 1], lo), hi) - lo]
                for j in range(self.group.size)]

    def formula(self, k: int = 8) -> dict[str, float]:
        kept = sum(self.numels[i] for i in self.kept) if self.stage == 2 else 0
        out = zero_memory_formula(self.psi, self.group.size, self.stage, k, shard=self.end - self.start,
                                  kept=kept)
        out["comm_scratch"] = comm_scratch_formula(self._scattered(), self.flat.element_size(),
                                                   self.group.rank, self.algorithm)
        return out

    def expected_bytes_sent(self, micro_batches: int = 1) -> int:
        """Bytes this rank sends per step with `micro_batches` backwards (zero_traffic_formula)."""
        kept = self._kept_cuts() if self.stage == 2 else []
        return zero_traffic_formula([self.shard_sizes], self.group.rank, self.stage,
                                    self.flat.element_size(), micro_batches, kept)

    def state_dict(self) -> dict[str, Any]:
        """The full (unsharded) optimizer state, as torch's optimizer over `params` has it.

        Collective: an all-gather of each state tensor's shards (ring: (N-1)/N of it sent per rank).
        """
        state = full_optimizer_state(self.optimizer, [self.shard], [self.shard_sizes],
                                      [[p.shape for p in self.params]], self.group)
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": list(range(len(self.params)))} for g in self.optimizer.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full optimizer state in torch's format (what state_dict() returns, or what torch's
        optimizer over the same parameters saved): each rank keeps its shard. No communication."""
        saved, groups = state_dict["state"], state_dict["param_groups"]
        if len(groups) != len(self.optimizer.param_groups):
            raise ValueError(f"the state has {len(groups)} parameter groups, ZeroOptimizer has "
                             f"{len(self.optimizer.param_groups)}")
        self.optimizer.state[self.shard] = cut_optimizer_state(
            [saved.get(i, {}) for i in range(len(self.params))], self.numels, self.start, self.end)
        for mine, theirs in zip(self.optimizer.param_groups, groups):
            mine.update({k: v for k, v in theirs.items() if k != "params"})

    # -- sharded checkpoints (dt.parallel.checkpoint) ----------------------------
    def checkpoint_layout(self) -> dict[str, Any]:
        return {"zero": self.stage, "dp": self.group.size}

    def checkpoint_pieces(self, pieces_of: Any) -> tuple[torch.optim.Optimizer, list[Any]]:
        """The inner optimizer and, for its one parameter (this rank's flat shard), the piece of
        each model parameter the shard covers, with where in the shard that piece starts."""
        pieces = []
        for p, off, n in zip(self.params, self.offsets, self.numels):
            lo, hi = max(self.start, off), min(self.end, off + n)
            if lo < hi:
                (place, _), = pieces_of(p)  # a ZeroOptimizer's model holds each parameter whole
                pieces.append((place.part(lo - off, hi - off), lo - self.start))
        return self.optimizer, [(self.shard, pieces)]
