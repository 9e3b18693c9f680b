"""ZeRO stage 3 (FSDP): parameters sharded too, gathered per module just in time.

Per step, per rank, with the ring: an all-gather of each module's parameters
before its forward, another before its backward, and a reduce-scatter of its
gradient: about 3 * 4 Psi bytes, 1.5x DDP, the price of holding only 1/N of
the parameters (zero_traffic_formula).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dt.collectives import all_gather, broadcast, reduce_scatter
from dt.collectives.ops import ReduceOp
from dt.collectives.scratch import held_bytes
from dt.layout import edges, split_sizes
from dt.parallel.checkpoint.place import Place
from dt.parallel.zero.memory import (
    comm_scratch_formula,
    memory_held,
    zero_memory_formula,
    zero_traffic_formula,
)
from dt.parallel.zero.shards import cut_optimizer_state, full_optimizer_state, gather_flat
from dt.transport import resolve_group

__all__ = ["FullyShardedDataParallel"]


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
        return gather_flat(shard, unit.sizes, fsdp.group, fsdp.algorithm)

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
            start = edges(sizes)[r]
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
            unit.full = gather_flat(unit.shard, unit.sizes, self.group, self.algorithm)
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
        """Bytes held: parameters, gradients, optimizer state, and the collectives' scratch."""
        params = [u.shard for u in self.units] + [u.full for u in self.units if u.full is not None]
        return {**memory_held(params, [u.shard.grad for u in self.units], optimizer),
                "comm_scratch": held_bytes()}

    def formula(self, k: int = 8) -> dict[str, float]:
        out = zero_memory_formula(self.psi, self.group.size, 3, k, shard=self.shard_numel)
        itemsize = self.units[0].shard.element_size() if self.units else 4
        out["comm_scratch"] = comm_scratch_formula([u.sizes for u in self.units], itemsize,
                                                   self.group.rank, self.algorithm)
        return out

    def expected_bytes_sent(self, micro_batches: int = 1) -> int:
        """Bytes this rank sends per step with `micro_batches` forwards and backwards."""
        return zero_traffic_formula([u.sizes for u in self.units], self.group.rank, 3,
                                    self.units[0].shard.element_size() if self.units else 4, micro_batches)

    @torch.no_grad()
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The full model state (names as in the unwrapped module), gathered on every rank."""
        out: dict[str, torch.Tensor] = {}
        for mod_name, unit in zip(self.unit_names, self.units):
            full = gather_flat(unit.shard, unit.sizes, self.group)
            o = 0
            for nm, shape in zip(unit.names, unit.shapes):
                out[f"{mod_name}.{nm}" if mod_name else nm] = full[o:o + shape.numel()].view(shape)
                o += shape.numel()
        out.update({nm: b.detach().clone() for nm, b in self.module.named_buffers()})
        return out

    def optim_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`optimizer`'s state (built over self.parameters()), gathered per original parameter."""
        state = full_optimizer_state(optimizer, [u.shard for u in self.units],
                                      [u.sizes for u in self.units],
                                      [u.shapes for u in self.units], self.group)
        names = self._names()
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        return {"state": {names[i]: v for i, v in state.items()}, "param_groups": groups}

    def _names(self) -> list[str]:
        return [f"{m}.{nm}" if m else nm for m, u in zip(self.unit_names, self.units) for nm in u.names]

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, torch.Tensor],  # type: ignore[override]
                        strict: bool = True) -> None:
        """Load a full model state (names as in the unwrapped module): each rank keeps its shards.

        No communication: every rank reads the full tensors and copies its slice.
        """
        names = self._names()
        buffers = dict(self.module.named_buffers())
        missing = [n for n in names + list(buffers) if n not in state_dict]
        unexpected = [n for n in state_dict if n not in set(names) | set(buffers)]
        if strict and (missing or unexpected):
            raise RuntimeError(f"FullyShardedDataParallel.load_state_dict: missing keys {missing}, "
                               f"unexpected keys {unexpected}")
        it = iter(names)
        for unit in self.units:
            mine = [state_dict.get(n) for n in [next(it) for _ in unit.names]]
            if any(t is None for t in mine):
                continue
            flat = torch.cat([t.reshape(-1) for t in mine])
            start = edges(unit.sizes)[self.group.rank]
            unit.shard.copy_(flat[start:start + unit.shard.numel()])
        for n, b in buffers.items():
            if n in state_dict:
                b.copy_(state_dict[n])

    def load_optim_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load `optimizer`'s state from the full per-parameter form optim_state_dict returns
        (keyed by parameter name, as torch's optimizer over the unwrapped module holds it once
        its indices are replaced by names). Each rank keeps its shard; no communication."""
        saved = state["state"]
        it = iter(self._names())
        for unit in self.units:
            mine = [saved.get(next(it), {}) for _ in unit.names]
            start = edges(unit.sizes)[self.group.rank]
            optimizer.state[unit.shard] = cut_optimizer_state(
                mine, [s.numel() for s in unit.shapes], start, start + unit.shard.numel())
        for mine, theirs in zip(optimizer.param_groups, state.get("param_groups", [])):
            mine.update({k: v for k, v in theirs.items() if k != "params"})

    # -- sharded checkpoints (dt.parallel.checkpoint) ----------------------------
    def checkpoint_layout(self) -> dict[str, Any]:
        return {"zero": 3, "dp": self.group.size}

    def checkpoint_places(self) -> list[tuple[torch.Tensor, list[tuple[Place, int]]]]:
        """Each unit's shard and the piece of each parameter it holds (where in the shard it
        starts); buffers are replicated over the group."""
        out: list[tuple[torch.Tensor, list[tuple[Place, int]]]] = []
        names = iter(self._names())
        for unit in self.units:
            start = edges(unit.sizes)[self.group.rank]
            end, off, pieces = start + unit.shard.numel(), 0, []
            for shape in unit.shapes:
                name, n = next(names), shape.numel()
                lo, hi = max(start, off), min(end, off + n)
                if lo < hi:
                    pieces.append((Place(name, tuple(shape), flat=(lo - off, hi - off)), lo - start))
                off += n
            out.append((unit.shard, pieces))
        for name, b in self.module.named_buffers():
            out.append((b, [(Place(name, tuple(b.shape), replica=self.group.rank,
                                   replicas=self.group.size), 0)]))
        return out
