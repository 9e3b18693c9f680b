"""A model and its optimizer as the list of tensors this rank holds, each with its Place.

A model says where its tensors sit (`checkpoint_places()`: DDP, FSDP,
dt.parallelize's Parallel; a plain module is replicated over a group), and an optimizer
says which parameters it steps (a torch optimizer: its param_groups; a
ZeroOptimizer: `checkpoint_pieces`, its flat shard cut at the parameters'
edges). Optimizer state follows its parameter: Adam's exp_avg of a
parameter's shard is the same shard of `optim/<name>/exp_avg`. Scalar
state (Adam's step) is one tensor per parameter, written once.

    save(directory, step, model, optimizer)          # collective
    loaded = load(directory, model, optimizer)       # collective; None: nothing saved yet
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dt.layout import shard_block
from dt.parallel.checkpoint import sharded
from dt.parallel.checkpoint.agree import world
from dt.parallel.checkpoint.files import CheckpointError
from dt.parallel.checkpoint.place import Held, Place
from dt.parallel.checkpoint.sharded import Checkpoint
from dt.transport import resolve_group

__all__ = ["Loaded", "Pieces", "load", "module_places", "optimizer_state", "save", "tensor_parallel_places"]

# A tensor and its pieces: (place, offset) says tensor.view(-1)[offset:offset + place.numel] is `place`.
Pieces = list[tuple[torch.Tensor, list[tuple[Place, int]]]]


def tensor_parallel_places(module: nn.Module, prefix: str = "", replica: int = 0, replicas: int = 1,
                           seen: set[int] | None = None) -> Pieces:
    """Every parameter and buffer of `module` under `prefix`, whole or a tensor-parallel slice.

    A module with `shard_dims` ({param name: dim}) and `sizes` holds the
    slice `group.rank` of each of those parameters along dim (dt's
    tensor-parallel layers); everything else is held whole. Parameters
    already in `seen` (shared, as a tied weight) are skipped.
    """
    seen = set() if seen is None else seen
    out: Pieces = []
    for mod_name, mod in module.named_modules():
        dims = getattr(mod, "shard_dims", {})
        tensors = list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))
        for name, t in tensors:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            full = ".".join(x for x in (prefix, mod_name, name) if x)
            dim = dims.get(name)
            if dim is None:
                shape, block = tuple(t.shape), None
            else:
                shape = tuple(t.shape[:dim]) + (sum(mod.sizes),) + tuple(t.shape[dim + 1:])
                block = shard_block(shape, dim, mod.sizes, mod.group.rank)
            out.append((t, [(Place(full, shape, block, replica=replica, replicas=replicas), 0)]))
    return out


def module_places(module: nn.Module, group: Any = None) -> Pieces:
    """A module replicated over `group` (DDP, a ZeroOptimizer's model): every rank holds all of it.
    Without torch.distributed (one process), it is the only replica."""
    if group is None and world()[1] == 1:
        return tensor_parallel_places(module)
    g = resolve_group(group)
    return tensor_parallel_places(module, replica=g.rank, replicas=g.size)


def _model_pieces(model: nn.Module, optimizer: Any) -> Pieces:
    if hasattr(model, "checkpoint_places"):
        return model.checkpoint_places()
    return module_places(model, getattr(optimizer, "group", None))


def _optimizer_pieces(optimizer: Any, model: Pieces) -> tuple[Any, Pieces]:
    """The torch-like optimizer that holds the state, and the pieces of each parameter it steps."""
    by_id = {id(t): pieces for t, pieces in model}
    if hasattr(optimizer, "checkpoint_pieces"):  # ZeroOptimizer: a flat shard over the parameters
        return optimizer.checkpoint_pieces(lambda p: by_id[id(p)])
    out: Pieces = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in by_id:
                raise ValueError("the optimizer steps a tensor the model does not hold")
            out.append((p, by_id[id(p)]))
    return optimizer, out


def _is_sharded(key: str, value: torch.Tensor, p: torch.Tensor) -> bool:
    """State shaped like its parameter (moments) follows its pieces; the rest (step) is a scalar."""
    return key != "step" and value.numel() == p.numel()


def optimizer_state(optimizer: Any, params: Pieces) -> list[Held]:
    """`optimizer`'s state as Held tensors named optim/<parameter>/<key>."""
    out: list[Held] = []
    for p, pieces in params:
        for key, v in sorted(optimizer.state.get(p, {}).items()):
            if not isinstance(v, torch.Tensor):
                continue
            for place, at in pieces:
                name = f"optim/{place.name}/{key}"
                if _is_sharded(key, v, p):
                    out.append(Held(place.renamed(name), v.reshape(-1)[at:at + place.numel]))
                else:
                    out.append(Held(Place(name, tuple(v.shape), saved=place.saved), v.contiguous()))
    return out


def _optimizer_targets(optimizer: Any, params: Pieces, ckpt: Checkpoint) -> list[Held]:
    """Tensors to load the optimizer's state into, created where torch creates them lazily."""
    out: list[Held] = []
    for p, pieces in params:
        if not pieces:
            continue
        prefix = f"optim/{pieces[0][0].name}/"
        keys = sorted(n[len(prefix):] for n in ckpt.tensors if n.startswith(prefix))
        if not keys:
            continue  # saved before this parameter's first step: nothing to restore
        state = optimizer.state.setdefault(p, {})
        for key in keys:
            name0 = prefix + key
            like_param = ckpt.shape(name0) == pieces[0][0].shape and key != "step"
            shape = p.shape if like_param else ckpt.shape(name0)
            t = state.get(key)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
                t = torch.zeros(shape, dtype=ckpt.dtype(name0), device=p.device)
                state[key] = t
            if like_param:
                out += [Held(place.renamed(f"optim/{place.name}/{key}"), t.view(-1)[at:at + place.numel])
                        for place, at in pieces]
            else:
                out.append(Held(Place(name0, tuple(shape)), t))
    return out


def _held_model(model: Pieces) -> list[Held]:
    return [Held(place, t.detach().reshape(-1)[at:at + place.numel]) for t, pieces in model
            for place, at in pieces]


def _hyperparameters(optimizer: Any) -> list[dict[str, Any]]:
    plain = (int, float, bool, str, type(None))
    return [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "params"
             and (isinstance(v, plain) or (isinstance(v, tuple) and all(isinstance(x, plain) for x in v)))}
            for g in optimizer.param_groups]


def _layout(model: Any, optimizer: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"world": world()[1]}
    for obj in (model, optimizer):
        out.update(getattr(obj, "checkpoint_layout", lambda: {})())
    return out


def save(directory: str, step: int, model: nn.Module, optimizer: Any = None, *, keep: int = 3,
         meta: dict[str, Any] | None = None) -> str:
    """Save `model` (and `optimizer`) sharded as DIRECTORY/step-NNNNNNNN; collective over the world."""
    pieces = _model_pieces(model, optimizer)
    held = _held_model(pieces)
    info = dict(meta or {})
    if optimizer is not None:
        inner, params = _optimizer_pieces(optimizer, pieces)
        held += optimizer_state(inner, params)
        info["param_groups"] = _hyperparameters(inner)
    return sharded.save(directory, step, held, layout=_layout(model, optimizer), meta=info, keep=keep)


@dataclass
class Loaded:
    """What `load` found: the step to continue from, where, and what it skipped on the way."""

    step: int
    path: str
    layout: dict[str, Any]
    meta: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def load(directory: str, model: nn.Module, optimizer: Any = None, *, hyperparameters: bool = True,
         check: Callable[[Checkpoint], None] | None = None) -> Loaded | None:
    """Load the newest good checkpoint under `directory` into `model` (and `optimizer`), resharded
    to this run's layout. Collective over the world. None when there is none yet.

    `check(checkpoint)` may refuse it (raise CheckpointError) before anything is read.
    `hyperparameters`: restore the optimizer's lr, betas, ... as torch's load_state_dict does.
    """
    ckpt, warnings = sharded.latest(directory)
    if ckpt is None:
        return None
    if check is not None:
        check(ckpt)
    pieces = _model_pieces(model, optimizer)
    targets = [Held(place, t.data.view(-1)[at:at + place.numel]) for t, ps in pieces for place, at in ps]
    inner = None
    if optimizer is not None:
        inner, params = _optimizer_pieces(optimizer, pieces)
        targets += _optimizer_targets(inner, params, ckpt)
    with torch.no_grad():
        ckpt.read(targets)
    if inner is not None and hyperparameters:
        saved = ckpt.meta.get("param_groups", [])
        if len(saved) != len(inner.param_groups):
            raise CheckpointError(f"checkpoint {ckpt.path}: {len(saved)} optimizer parameter groups, "
                                  f"this optimizer has {len(inner.param_groups)}")
        for g, s in zip(inner.param_groups, saved):
            g.update({k: tuple(v) if isinstance(g.get(k), tuple) else v for k, v in s.items()})
    return Loaded(ckpt.step, ckpt.path, ckpt.layout, ckpt.meta, warnings)
