"""ZeRO: data parallel that stops keeping N copies of everything.

Plain data parallel holds, on every rank, Psi parameters, Psi gradients and
the optimizer state: in fp32 with Adam that is 4 + 4 + 8 = 16 bytes per
parameter (baseline 16 Psi). ZeRO (Rajbhandari et al., 2020) shards what each
rank does not need in full:

    stage 1  optimizer state sharded           4 Psi + 4 Psi   + K Psi / N
    stage 2  + gradients sharded               4 Psi + (4 + K) Psi / N
    stage 3  + parameters sharded (FSDP)       (4 + 4 + K) Psi / N

(fp32 parameters and gradients, K bytes of optimizer state per parameter:
Adam K = 8, SGD with momentum K = 4, plain SGD K = 0; `zero_memory_formula`.)

Communication per step, per rank, with the ring (dt.cost):

    stage 1, 2  reduce-scatter gradients + all-gather parameters
                = exactly the bytes of DDP's ring all-reduce, about 2 * 4 Psi
    stage 3     all-gather (forward) + all-gather (backward) + reduce-scatter
                about 3 * 4 Psi: 1.5x DDP, the price of not holding parameters

The reduce-scatters and all-gathers run the ring by default (`algorithm=`):
shards are large, the ring is bandwidth-optimal and takes uneven shards as they
come, and the figures above are its exact arithmetic.

Each rank owns one contiguous shard of the flattened parameters
(`cost.split_sizes`: any count, uneven shards, empty shards when
there are fewer elements than ranks) and runs the real torch optimizer on that
shard only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from dt.collectives import all_gather, broadcast, reduce_scatter
from dt.collectives.ops import ReduceOp
from dt.cost import ring_all_gather, ring_reduce_scatter
from dt.layout import split_sizes
from dt.parallel.data_parallel import MB, make_buckets
from dt.transport import resolve_group

__all__ = ["FullyShardedDataParallel", "ZeroOptimizer", "memory_held", "zero_memory_formula",
           "zero_traffic_formula"]


# ---------------------------------------------------------------------------
# The arithmetic, stated once.
# ---------------------------------------------------------------------------

def zero_memory_formula(psi: int, n: int, stage: int, k: int = 8, shard: float | None = None,
                        param_bytes: int = 4, grad_bytes: int = 4) -> dict[str, float]:
    """Bytes one rank holds for parameters, gradients and optimizer state.

    stage 0 (plain DDP): 4Psi, 4Psi, K Psi    -> 16 Psi with fp32 + Adam
    stage 1:             4Psi, 4Psi, K Psi/N  -> 8 Psi + 8 Psi/N
    stage 2:             4Psi, 4Psi/N, K Psi/N -> 4 Psi + 12 Psi/N
    stage 3:             4Psi/N, 4Psi/N, K Psi/N -> 16 Psi/N
    `shard` is this rank's element count, Psi/N when N divides Psi.
    """
    s = psi / n if shard is None else shard
    p = psi if stage < 3 else s
    g = psi if stage < 2 else s
    o = psi if stage < 1 else s
    return {"params": param_bytes * p, "grads": grad_bytes * g, "optimizer": k * o}


def zero_traffic_formula(shard_lists: list[list[int]], rank: int, stage: int,
                         itemsize: int = 4) -> int:
    """Bytes this rank sends per step: ring reduce-scatter + ring all-gather per sharded
    buffer (stages 1, 2: the bytes of a ring all-reduce), plus a second all-gather
    before backward at stage 3. `shard_lists`: element counts of each buffer's shards."""
    total = 0
    for sizes in shard_lists:
        total += ring_reduce_scatter(sizes, itemsize, rank).bytes_sent
        total += ring_all_gather(sizes, itemsize, rank).bytes_sent * (2 if stage == 3 else 1)
    return total


def memory_held(params: Iterable[torch.Tensor], grads: Iterable[torch.Tensor | None],
                optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Measured bytes held: distinct storages behind params, grads and optimizer state.

    Counting storages, not tensors, means views into one flat buffer count once
    and freed (resized to 0) buffers count 0. Adam's `step` counters (one scalar
    per tensor) are left out, as in the ZeRO paper's K.
    """
    def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            if t is not None:
                s = t.untyped_storage()
                seen[s.data_ptr() if s.nbytes() else -id(s)] = s.nbytes()
        return sum(seen.values())

    state = [v for st in optimizer.state.values() for key, v in st.items()
             if isinstance(v, torch.Tensor) and key != "step"]
    return {"params": storage_bytes(params), "grads": storage_bytes(grads),
            "optimizer": storage_bytes(state)}


def _gather_flat(shard: torch.Tensor, sizes: list[int], group: Any,
                 algorithm: str = "ring") -> torch.Tensor:
    full = torch.empty(sum(sizes), dtype=shard.dtype, device=shard.device)
    all_gather(list(full.split(sizes)), shard.detach().contiguous(), group=group,
               algorithm=algorithm)
    return full


def _full_optimizer_state(inner: torch.optim.Optimizer, shards: list[nn.Parameter],
                          sizes: list[list[int]], shapes: list[list[torch.Size]],
                          group: Any) -> dict[int, dict[str, Any]]:
    """Gather each shard's optimizer state and cut it back into per-parameter tensors."""
    out: dict[int, dict[str, Any]] = {}
    index = 0
    for shard, sz, shp in zip(shards, sizes, shapes):
        st = inner.state.get(shard, {})
        keys = sorted(st)
        per_param: list[dict[str, Any]] = [{} for _ in shp]
        for key in keys:
            v = st[key]
            if isinstance(v, torch.Tensor) and v.numel() == shard.numel() and key != "step":
                full = _gather_flat(v, sz, group)
                for j, piece in enumerate(full.split([s.numel() for s in shp])):
                    per_param[j][key] = piece.view(shp[j]).clone()
            else:
                for j in range(len(shp)):
                    per_param[j][key] = v.clone() if isinstance(v, torch.Tensor) else v
        for d in per_param:
            if d:
                out[index] = d
            index += 1
    return out


# ---------------------------------------------------------------------------
# Stages 1 and 2: a drop-in optimizer; parameters stay whole on every rank.
# ---------------------------------------------------------------------------

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
                 first_bucket_mb: float = 1, algorithm: str = "ring", **optim_kwargs: Any):
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer does stages 1 and 2; stage 3 is "
                             f"FullyShardedDataParallel (got stage={stage})")
        self.params = [p for p in params if p.requires_grad]
        if len({p.dtype for p in self.params}) > 1:
            raise ValueError("ZeroOptimizer flattens all parameters into one buffer: one dtype")
        self.stage, self.group, self.algorithm = stage, resolve_group(group), algorithm
        n, r = self.group.size, self.group.rank
        self.numels = [p.numel() for p in self.params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(self.params))]
        self.psi = sum(self.numels)
        # One flat buffer; every parameter becomes a view into it.
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params]) if self.params \
            else torch.zeros(0)
        broadcast(self.flat, self.group.ranks[0], group=self.group)
        for p, o in zip(self.params, self.offsets):
            p.data = self.flat[o:o + p.numel()].view_as(p)
        self.shard_sizes = split_sizes(self.psi, n)
        self.start = sum(self.shard_sizes[:r])
        self.end = self.start + self.shard_sizes[r]
        self.shard = nn.Parameter(self.flat[self.start:self.end])  # aliases self.flat
        self.optimizer = optimizer_cls([self.shard], **optim_kwargs)
        self.last_step = {"comm_s": 0.0}

        if stage == 1:
            self.flat_grad = torch.zeros_like(self.flat)
            for p, o in zip(self.params, self.offsets):
                p.grad = self.flat_grad[o:o + p.numel()].view_as(p)
        else:
            self.shard_grad = torch.zeros(self.end - self.start, dtype=self.flat.dtype)
            order = list(range(len(self.params)))[::-1]  # backward order
            self.buckets = [[order[i] for i in b] for b in make_buckets(
                [self.params[i] for i in order], int(first_bucket_mb * MB), int(bucket_cap_mb * MB))]
            self._bucket_of = {i: b for b, idx in enumerate(self.buckets) for i in idx}
            self._index = {p: i for i, p in enumerate(self.params)}
            self._in_backward = False
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    # -- stage 2: bucketed reduce-scatter during backward --------------------
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
            self._buffers[b] = torch.zeros(hi - lo, dtype=self.flat.dtype)
        self._buffers[b][self.offsets[i] - lo:self.offsets[i] - lo + p.numel()].copy_(p.grad.view(-1))
        p.grad = None  # the full gradient is not kept: that is stage 2
        self._arrived.setdefault(b, set()).add(i)
        while self._next < len(self.buckets) and \
                len(self._arrived.get(self._next, ())) == len(self.buckets[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, b: int) -> None:
        lo, hi = self._range(b)
        buf = self._buffers.setdefault(b, torch.zeros(hi - lo, dtype=self.flat.dtype))
        bounds = [sum(self.shard_sizes[:j]) for j in range(self.group.size + 1)]
        pieces = [buf[min(max(bounds[j], lo), hi) - lo:min(max(bounds[j + 1], lo), hi) - lo]
                  for j in range(self.group.size)]
        a, z = min(max(self.start, lo), hi), min(max(self.end, lo), hi)
        out = torch.empty(z - a, dtype=self.flat.dtype)
        work = reduce_scatter(out, pieces, ReduceOp.AVG, self.group, algorithm=self.algorithm,
                              async_op=True)
        self._works.append((work, out, a - self.start))

    def _finish_backward(self) -> None:
        for b in range(self._next, len(self.buckets)):  # parameters with no grad: zeros
            self._launch(b)
        for work, out, at in self._works:
            work.wait()
            self.last_step["comm_s"] += work.finished_at - work.started_at
            self.shard_grad[at:at + out.numel()] += out  # accumulate, like .grad
        self._buffers.clear()
        self._in_backward = False

    # -- the step --------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        t0 = time.perf_counter()
        if self.stage == 1:
            for p, o in zip(self.params, self.offsets):
                slot = self.flat_grad[o:o + p.numel()].view_as(p)
                if p.grad is None:
                    slot.zero_()
                elif p.grad.data_ptr() != slot.data_ptr():
                    slot.copy_(p.grad)
                p.grad = slot
            mine = self.flat_grad[self.start:self.end]
            reduce_scatter(mine, list(self.flat_grad.split(self.shard_sizes)), ReduceOp.AVG,
                           self.group, algorithm=self.algorithm)
            self.shard.grad = mine
        else:
            self.shard.grad = self.shard_grad
        self.optimizer.step()
        all_gather(list(self.flat.split(self.shard_sizes)), self.shard.detach(), group=self.group,
                   algorithm=self.algorithm)
        self.last_step["step_comm_s"] = time.perf_counter() - t0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (kept as buffers: stage 1 full, stage 2 the shard)."""
        if self.stage == 1:
            self.flat_grad.zero_()
        else:
            self.shard_grad.zero_()
            for p in self.params:
                p.grad = None
        self.last_step = {"comm_s": 0.0}

    # -- accounting and checkpoints --------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def memory(self) -> dict[str, int]:
        grads = [self.flat_grad] if self.stage == 1 else [self.shard_grad]
        grads += [p.grad for p in self.params]
        return memory_held(self.params, grads, self.optimizer)

    def formula(self, k: int = 8) -> dict[str, float]:
        return zero_memory_formula(self.psi, self.group.size, self.stage, k,
                                   shard=self.end - self.start)

    def expected_bytes_sent(self) -> int:
        return zero_traffic_formula([self.shard_sizes], self.group.rank, self.stage,
                                    self.flat.element_size())

    def state_dict(self) -> dict[str, Any]:
        """The full (unsharded) optimizer state, as torch's optimizer over `params` has it."""
        state = _full_optimizer_state(self.optimizer, [self.shard], [self.shard_sizes],
                                      [[p.shape for p in self.params]], self.group)
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": list(range(len(self.params)))} for g in self.optimizer.param_groups]
        return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------------
# Stage 3: parameters sharded too; gathered per layer, just in time.
# ---------------------------------------------------------------------------

class _Unit:
    """One module's own parameters as one flat, sharded buffer."""

    def __init__(self, module: nn.Module, names: list[str], shard: nn.Parameter,
                 sizes: list[int], shapes: list[torch.Size]):
        self.module, self.names, self.shard, self.sizes, self.shapes = (
            module, names, shard, sizes, shapes)
        self.full: torch.Tensor | None = None  # the gathered parameters while in use

    def set_views(self, full: torch.Tensor) -> None:
        o = 0
        for name, shape in zip(self.names, self.shapes):
            setattr(self.module, name, full[o:o + shape.numel()].view(shape))
            o += shape.numel()


class _Unshard(torch.autograd.Function):
    """Forward: all-gather the shards into the full flat parameter.
    Backward: reduce-scatter (AVG) its gradient back to the shard, then free it."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, unit: _Unit, fsdp: FullyShardedDataParallel) -> Any:
        ctx.unit, ctx.fsdp = unit, fsdp
        return _gather_flat(shard, unit.sizes, fsdp.group, fsdp.algorithm)

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        unit, g = ctx.unit, ctx.fsdp.group
        grad_shard = torch.empty_like(unit.shard)
        reduce_scatter(grad_shard, list(grad_full.contiguous().split(unit.sizes)), ReduceOp.AVG, g,
                       algorithm=ctx.fsdp.algorithm)
        _free(unit)
        return grad_shard, None, None


def _free(unit: _Unit) -> None:
    if unit.full is not None:
        unit.full.untyped_storage().resize_(0)


class FullyShardedDataParallel(nn.Module):
    """ZeRO stage 3: each module's own parameters are flattened and sharded over `group`.

    Forward: all-gather a module's parameters just before it runs, free them
    just after. Backward: all-gather them again when the gradient reaches the
    module's output, reduce-scatter their gradient into the shard, free them.
    `parameters()` yields only this rank's shards: give those to any torch
    optimizer. A module whose forward runs twice per step is not supported.
    """

    def __init__(self, module: nn.Module, group: Any = None, algorithm: str = "ring"):
        super().__init__()
        self.module = module
        self.group = resolve_group(group)
        self.algorithm = algorithm
        n, r = self.group.size, self.group.rank
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                broadcast(t.data, self.group.ranks[0], group=self.group)
        self.units: list[_Unit] = []
        self.unit_names: list[str] = []
        self.shards = nn.ParameterList()
        for mod_name, mod in list(module.named_modules()):
            own = list(mod.named_parameters(recurse=False))
            if not own:
                continue
            flat = torch.cat([p.detach().reshape(-1) for _, p in own])
            sizes = split_sizes(flat.numel(), n)
            start = sum(sizes[:r])
            shard = nn.Parameter(flat[start:start + sizes[r]].clone())
            unit = _Unit(mod, [nm for nm, _ in own], shard, sizes, [p.shape for _, p in own])
            for nm, _ in own:
                del mod._parameters[nm]
                setattr(mod, nm, None)
            self.shards.append(shard)
            self.units.append(unit)
            self.unit_names.append(mod_name)
            mod.register_forward_pre_hook(lambda m, a, u=unit: self._before_forward(u))
            mod.register_forward_hook(lambda m, a, out, u=unit: self._after_forward(u, out))
        self.psi = sum(sum(u.sizes) for u in self.units)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _before_forward(self, unit: _Unit) -> None:
        if torch.is_grad_enabled():
            unit.full = _Unshard.apply(unit.shard, unit, self)
        else:
            unit.full = _gather_flat(unit.shard, unit.sizes, self.group, self.algorithm)
        unit.set_views(unit.full)

    def _after_forward(self, unit: _Unit, out: Any) -> None:
        _free(unit)  # the saved views now point at an empty storage until backward
        outs = out if isinstance(out, (tuple, list)) else [out]
        needs = [t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad]
        unit.regathered = False
        for t in needs:
            t.register_hook(lambda grad, u=unit: self._before_backward(u))

    def _before_backward(self, unit: _Unit) -> None:
        if unit.regathered or unit.full is None:
            return
        unit.regathered = True
        full = unit.full
        full.untyped_storage().resize_(full.numel() * full.element_size())
        # Into .data: refilling the storage must not bump the version autograd checks.
        all_gather(list(full.data.split(unit.sizes)), unit.shard.detach(), group=self.group,
                   algorithm=self.algorithm)

    # -- accounting and checkpoints ----------------------------------------------
    @property
    def shard_numel(self) -> int:
        return sum(u.shard.numel() for u in self.units)

    def memory(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        params = [u.shard for u in self.units] + [u.full for u in self.units if u.full is not None]
        return memory_held(params, [u.shard.grad for u in self.units], optimizer)

    def formula(self, k: int = 8) -> dict[str, float]:
        return zero_memory_formula(self.psi, self.group.size, 3, k, shard=self.shard_numel)

    def expected_bytes_sent(self) -> int:
        return zero_traffic_formula([u.sizes for u in self.units], self.group.rank, 3,
                                    self.units[0].shard.element_size() if self.units else 4)

    @torch.no_grad()
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The full model state (names as in the unwrapped module), gathered on every rank."""
        out: dict[str, torch.Tensor] = {}
        for mod_name, unit in zip(self.unit_names, self.units):
            full = _gather_flat(unit.shard, unit.sizes, self.group)
            o = 0
            for nm, shape in zip(unit.names, unit.shapes):
                out[f"{mod_name}.{nm}" if mod_name else nm] = full[o:o + shape.numel()].view(shape)
                o += shape.numel()
        out.update({nm: b.detach().clone() for nm, b in self.module.named_buffers()})
        return out

    def optim_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`optimizer`'s state (built over self.parameters()), gathered per original parameter."""
        state = _full_optimizer_state(optimizer, [u.shard for u in self.units],
                                      [u.sizes for u in self.units],
                                      [u.shapes for u in self.units], self.group)
        names = [f"{m}.{nm}" if m else nm for m, u in zip(self.unit_names, self.units)
                 for nm in u.names]
        return {"state": {names[i]: v for i, v in state.items()}}
