"""ZeRO stage 3 (FSDP): parameters sharded too, gathered per module just in time.

Per step, per rank, with the ring: an all-gather of each module's parameters
before its forward, another before its backward, and a reduce-scatter of its
gradient: about 3 * 4 Psi bytes, 1.5x DDP, the price of holding only 1/N of
the parameters (zero_traffic_formula). Each all-gather is issued one unit
ahead, behind the unit before it (dt.parallel.zero.prefetch), unless
prefetch=False: then each blocks right before its unit runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch import nn

from dt.collectives import broadcast, reduce_scatter
from dt.collectives.ops import ReduceOp
from dt.collectives.scratch import held_bytes
from dt.layout import edges, split_sizes
from dt.parallel.checkpoint.place import Place
from dt.parallel.data_parallel import LABEL as DATA_LABEL
from dt.parallel.recompute import AGAIN, FIRST, recompute_phase
from dt.parallel.zero.memory import (
    SHARD_ALGORITHM,
    comm_scratch_formula,
    memory_held,
    zero_memory_formula,
    zero_traffic_formula,
)
from dt.parallel.zero.prefetch import Finished, Prefetch
from dt.parallel.zero.shards import cut_optimizer_state, full_optimizer_state, gather_flat
from dt.transport import Group, charged_to, resolve_group
from dt.transport.accounting import blocking

__all__ = ["FullyShardedDataParallel"]


class _Unit:
    """One module's own parameters as one flat, sharded buffer.

    `holders[j]`: every (module, attribute) that holds parameter j: one, or two for a weight
    tied between modules (an embedding and a head), whose unit then lives on the root.
    `places[j]`: where parameter j sits in the full model, when the caller said (place_of).
    """

    def __init__(self, module: nn.Module, names: list[str], shard: nn.Parameter,
                 sizes: list[int], shapes: list[torch.Size],
                 holders: list[list[tuple[nn.Module, str]]], places: list[Place | None], ids: list[int],
                 group: Group, divisor: int | None):
        self.module, self.names, self.shard, self.sizes, self.shapes = (
            module, names, shard, sizes, shapes)
        self.holders, self.places = holders, places
        self.group, self.divisor = group, divisor  # its ranks; None: the gradient AVG over them
        self.ids = ids  # id() of the parameters it replaced, in its order (the shared ones found by it)
        self.full: torch.Tensor | None = None  # the gathered parameters while in use

    def set_views(self, full: torch.Tensor) -> None:
        o = 0
        for holders, shape in zip(self.holders, self.shapes):
            for mod, attr in holders:
                setattr(mod, attr, full[o:o + shape.numel()].view(shape))
            o += shape.numel()


class _Unshard(torch.autograd.Function):
    """Forward: all-gather the shards into the full flat parameter.
    Backward: reduce-scatter (AVG, or SUM / the unit's divisor) its gradient back to the shard,
    then free it."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, unit: _Unit, fsdp: FullyShardedDataParallel) -> Any:
        ctx.unit, ctx.fsdp = unit, fsdp
        full = fsdp.gathered(unit)
        ctx.full = full  # this forward's: each forward (a micro-batch) frees its own in backward
        return full

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        unit = ctx.unit
        grad_shard = torch.empty_like(unit.shard)
        op = ReduceOp.AVG if unit.divisor is None else ReduceOp.SUM
        # With prefetch it runs where the gathers ahead run, on the group's thread (it would queue
        # there behind one anyway): its scratch is one thread's pool (comm_scratch_formula), not two.
        ahead = ctx.fsdp.prefetch.enabled
        with charged_to(DATA_LABEL, ctx.fsdp.algorithm):
            work = reduce_scatter(grad_shard, list(grad_full.contiguous().split(unit.sizes)), op, unit.group,
                                  algorithm=ctx.fsdp.algorithm, async_op=ahead)
        if work is not None:
            blocking(work.wait)
        if unit.divisor is not None:
            grad_shard.div_(unit.divisor)
        _free(ctx.full)
        return grad_shard, None, None


def _free(full: torch.Tensor | None) -> None:
    if full is not None:
        full.untyped_storage().resize_(0)


def _tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor in a module's output: itself, in tuples, lists, dicts, or a dataclass's fields
    (a router's Routing), where backward may enter the module first."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        out = [getattr(out, f.name) for f in dataclasses.fields(out)]
    return [t for o in out for t in _tensors(o)] if isinstance(out, (tuple, list)) else []


def _holders(module: nn.Module) -> dict[int, list[tuple[str, nn.Module, str]]]:
    """Every (module name, module, attribute) holding each parameter, by the parameter's id."""
    out: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mod_name, mod in module.named_modules():
        for nm, p in mod.named_parameters(recurse=False):
            out.setdefault(id(p), []).append((mod_name, mod, nm))
    return out


class FullyShardedDataParallel(nn.Module):
    """ZeRO stage 3: each module's own parameters are flattened and sharded over `group`.

    Forward: all-gather a module's parameters just before it runs, free them
    just after. Backward: all-gather them again when the gradient reaches the
    module's output, reduce-scatter their gradient into the shard, free them.
    Each forward (several micro-batches before their backwards) gathers and
    frees its own copy. A weight two modules hold (tied) is one unit on the
    root module, gathered for the whole forward and backward. `parameters()`
    yields only this rank's shards: give those to any torch optimizer.
    `place_of(p)`: where parameter p sits in the full model (a tensor-parallel
    slice, its name there), for checkpoints; default: its name in `module`.
    `separate`: parameters each made a unit of their own, cut the same way on
    every holder of the same size of group: a weight two pipeline stages share
    (a tied embedding and head, each stage's FSDP over its dp x cp group), whose
    shard gradients (shards_of) the stages then sum.
    `experts`: parameters replicated only over `expert_group` (a mixture's experts over
    their replicas, grid.group("edp")): sharded over it, their gradients summed there and
    divided by `expert_divisor` (dp x cp: every plane rank's tokens reached them), as
    ZeRO 1-2 does with experts (dt.parallel.zero.parts).
    Inside a recomputed block (dt.parallel.recompute) a unit gathers in the forward, frees,
    and gathers again in the rerun that backward makes, whose copy backward then uses: the
    same two gathers and one scatter per micro-batch as without recompute.
    `prefetch`: each all-gather issued one unit ahead (dt.parallel.zero.prefetch: in forward
    behind the unit before, in backward behind the unit after); False: each blocks right
    before its unit. The same gathers either way, so the same bytes.
    """

    def __init__(self, module: nn.Module, group: Any = None, algorithm: str = SHARD_ALGORITHM,
                 place_of: Callable[[nn.Parameter], Place] | None = None,
                 separate: Sequence[nn.Parameter] = (), experts: Sequence[nn.Parameter] = (),
                 expert_group: Any = None, expert_divisor: int = 1, prefetch: bool = True):
        super().__init__()
        self.module = module
        self.group = resolve_group(group)
        self.algorithm = algorithm
        self.prefetch = Prefetch(algorithm, enabled=prefetch)
        expert_ids = {id(p) for p in experts}
        self._expert = (resolve_group(expert_group), expert_divisor, expert_ids) if experts else None
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                g = self._group_of(id(t))[0]
                broadcast(t.data, g.ranks[0], group=g)
        self.units: list[_Unit] = []
        self.unit_names: list[str] = []
        self.shards = nn.ParameterList()
        holders = _holders(module)
        params = {id(p): p for p in module.parameters()}
        tied = [i for i, h in holders.items() if len(h) > 1]
        own: dict[int, list[int]] = {}  # module id -> the parameters only it holds, in its order
        for i, h in holders.items():
            if len(h) == 1:
                own.setdefault(id(h[0][1]), []).append(i)
        apart = {id(p) for p in separate}
        for mod_name, mod in list(module.named_modules()):
            mine = own.get(id(mod), [])
            dense = [i for i in mine if i not in apart and i not in expert_ids]
            self._make_unit(mod_name, mod, dense, holders, params, place_of)
            self._make_unit(mod_name, mod, [i for i in mine if i in expert_ids], holders, params, place_of)
            for i in (i for i in mine if i in apart):
                self._make_unit(mod_name, mod, [i], holders, params, place_of)
        self._make_unit("", module, tied, holders, params, place_of)  # on the root: both uses
        self.psi = sum(sum(u.sizes) for u in self.units)

    def _group_of(self, i: int) -> tuple[Group, int | None]:
        """The ranks parameter id `i` is replicated over, and its gradient's divisor (None: AVG)."""
        if self._expert is not None and i in self._expert[2]:
            return self._expert[0], self._expert[1]
        return self.group, None

    def _make_unit(self, mod_name: str, mod: nn.Module, ids: list[int], holders: dict[int, Any],
                   params: dict[int, nn.Parameter], place_of: Any) -> None:
        if not ids:
            return
        group, divisor = self._group_of(ids[0])
        n, r = group.size, group.rank
        own = [params[i] for i in ids]
        flat = torch.cat([p.detach().reshape(-1) for p in own])
        sizes = split_sizes(flat.numel(), n)
        start = edges(sizes)[r]
        shard = nn.Parameter(flat[start:start + sizes[r]].clone())
        first = [holders[i][0] for i in ids]  # a tied weight is named as its first holder names it
        names = [f"{m}.{a}"[len(mod_name) + 1:] if mod_name else (f"{m}.{a}" if m else a)
                 for m, _, a in first]
        unit = _Unit(mod, names, shard, sizes, [p.shape for p in own],
                     [[(h, a) for _, h, a in holders[i]] for i in ids],
                     [place_of(p) if place_of is not None else None for p in own], ids, group, divisor)
        for i in ids:
            for _, holder, attr in holders[i]:
                del holder._parameters[attr]
                setattr(holder, attr, None)
        self.shards.append(shard)
        self.units.append(unit)
        self.unit_names.append(mod_name)
        mod.register_forward_pre_hook(lambda m, a, u=unit: self._before_forward(u))
        mod.register_forward_hook(lambda m, a, out, u=unit: self._after_forward(u, out))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.prefetch.forward():
            return self.module(*args, **kwargs)

    def gathered(self, unit: _Unit) -> torch.Tensor:
        """`unit`'s full flat parameters for the forward starting now (prefetched, or gathered now),
        charged to data parallel's label (dt.train.step's LABELS)."""
        return self.prefetch.before_forward(unit)

    def _before_forward(self, unit: _Unit) -> None:
        unit.full = _Unshard.apply(unit.shard, unit, self) if torch.is_grad_enabled() else self.gathered(unit)
        unit.set_views(unit.full)

    def _after_forward(self, unit: _Unit, out: Any) -> None:
        full, phase = unit.full, recompute_phase()
        if phase == AGAIN:  # the rerun's views are what backward uses: they hold the copy, and free it
            unit.full = None
            return
        _free(full)  # the saved views now point at an empty storage until backward
        needs = [t for t in _tensors(out) if t.requires_grad]
        if phase == FIRST or full is None or not needs:
            return  # FIRST: nothing is saved, backward reruns the forward, which gathers again
        copies = self.prefetch.finishing()  # this forward's copies, in the order the units finished
        copies.append(Finished(unit, full, [False]))  # regathered once, by the first hook that fires
        k = len(copies) - 1
        for t in needs:
            t.register_hook(lambda grad, c=copies, k=k: self._before_backward(c, k))

    def _before_backward(self, copies: list[Finished], k: int) -> None:
        if not copies[k].done[0]:
            self.prefetch.before_backward(copies, k)

    def shards_of(self, params: Sequence[nn.Parameter]) -> list[nn.Parameter]:
        """The shards of the units made of each of `params` alone (given in `separate`), those here."""
        alone = {u.ids[0]: u.shard for u in self.units if len(u.ids) == 1}
        return [alone[id(p)] for p in params if id(p) in alone]

    def shard_pieces(self, leave_out: Collection[int] = ()) -> list[tuple[nn.Module, str, torch.Tensor]]:
        """(module holding it, its attribute, its part of this rank's shard gradient) for each
        parameter this rank's shards cover (after backward; views: scaling them scales it),
        but those whose id() is in `leave_out` (a shared weight another stage counts)."""
        out = []
        for unit in self.units:
            start = edges(unit.sizes)[unit.group.rank]
            end, off = start + unit.shard.numel(), 0
            for holders, shape, i in zip(unit.holders, unit.shapes, unit.ids):
                lo, hi = max(start, off), min(end, off + shape.numel())
                if lo < hi and unit.shard.grad is not None and i not in leave_out:
                    mod, attr = holders[0]
                    out.append((mod, attr, unit.shard.grad[lo - start:hi - start]))
                off += shape.numel()
        return out

    # -- accounting and checkpoints ----------------------------------------------
    @property
    def shard_numel(self) -> int:
        return sum(u.shard.numel() for u in self.units)

    def memory(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes held: parameters, gradients, optimizer state, and the collectives' scratch."""
        params = [u.shard for u in self.units] + [u.full for u in self.units if u.full is not None]
        return {**memory_held(params, [u.shard.grad for u in self.units], optimizer),
                "comm_scratch": held_bytes()}

    def _by_group(self) -> list[tuple[Group, list[_Unit]]]:
        """The units by the group they are sharded over (the plane's first; then the experts')."""
        out: dict[int, tuple[Group, list[_Unit]]] = {}
        for u in self.units:
            out.setdefault(id(u.group), (u.group, []))[1].append(u)
        return list(out.values())

    def formula(self, k: int = 8) -> dict[str, float]:
        out = zero_memory_formula(self.psi, self.group.size, 3, k, shard=self.shard_numel)
        itemsize = self.units[0].shard.element_size() if self.units else 4
        out["comm_scratch"] = max((comm_scratch_formula([u.sizes for u in us], itemsize, g.rank,
                                                        self.algorithm) for g, us in self._by_group()),
                                  default=0)  # one pool the collectives reuse: the largest
        return out

    def expected_bytes_sent(self, micro_batches: int = 1) -> int:
        """Bytes this rank sends per step with `micro_batches` forwards and backwards (each group's
        ring: the plane's for dense units, the experts' replicas' for theirs)."""
        itemsize = self.units[0].shard.element_size() if self.units else 4
        return sum(zero_traffic_formula([u.sizes for u in us], g.rank, 3, itemsize, micro_batches)
                   for g, us in self._by_group())

    @torch.no_grad()
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The full model state (names as in the unwrapped module), gathered on every rank."""
        out: dict[str, torch.Tensor] = {}
        for mod_name, unit in zip(self.unit_names, self.units):
            full = gather_flat(unit.shard, unit.sizes, unit.group)
            o = 0
            for nm, shape in zip(unit.names, unit.shapes):
                out[f"{mod_name}.{nm}" if mod_name else nm] = full[o:o + shape.numel()].view(shape)
                o += shape.numel()
        out.update({nm: b.detach().clone() for nm, b in self.module.named_buffers()})
        return out

    def optim_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """`optimizer`'s state (built over self.parameters()), gathered per original parameter."""
        state, index = {}, 0  # unit by unit: each gathers over its own group
        for u in self.units:
            part = full_optimizer_state(optimizer, [u.shard], [u.sizes], [u.shapes], u.group)
            state |= {index + i: v for i, v in part.items()}
            index += len(u.shapes)
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
            start = edges(unit.sizes)[unit.group.rank]
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
            start = edges(unit.sizes)[unit.group.rank]
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
            start = edges(unit.sizes)[unit.group.rank]
            end, off, pieces = start + unit.shard.numel(), 0, []
            for shape, place in zip(unit.shapes, unit.places):
                name, n = next(names), shape.numel()
                lo, hi = max(start, off), min(end, off + n)
                if lo < hi:
                    where = place.part(lo - off, hi - off) if place is not None else \
                        Place(name, tuple(shape), flat=(lo - off, hi - off))
                    pieces.append((where, lo - start))
                off += n
            out.append((unit.shard, pieces))
        for name, b in self.module.named_buffers():
            out.append((b, [(Place(name, tuple(b.shape), replica=self.group.rank,
                                   replicas=self.group.size), 0)]))
        return out
