"""A flat buffer sharded over a group, and gathering it back.

ZeRO cuts a flat buffer of parameters (or their optimizer state) into one
contiguous shard per rank, laid out by dt.layout.split_sizes. These
helpers put the shards back together (the parameters before a module runs,
stage 3; the full state for state_dict, every stage) and cut a full state
into this rank's shard (load_state_dict).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dt.collectives import all_gather

__all__ = ["cut_optimizer_state", "full_optimizer_state", "gather_flat"]


def gather_flat(shard: torch.Tensor, sizes: list[int], group: Any,
                 algorithm: str = "ring") -> torch.Tensor:
    full = torch.empty(sum(sizes), dtype=shard.dtype, device=shard.device)
    all_gather(list(full.split(sizes)), shard.detach().contiguous(), group=group,
               algorithm=algorithm)
    return full


def full_optimizer_state(inner: torch.optim.Optimizer, shards: list[nn.Parameter],
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
                full = gather_flat(v, sz, group)
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


def cut_optimizer_state(per_param: list[dict[str, Any]], numels: list[int], start: int,
                        end: int) -> dict[str, Any]:
    """The state of the flat shard [start, end) over parameters of `numels` elements, from each
    parameter's full state (torch's per-parameter format). No communication.

    Tensors shaped like their parameter (moments) are concatenated and cut; the rest
    (Adam's step) is one value for the whole shard, taken from the first parameter that has it.
    """
    out: dict[str, Any] = {}
    keys = sorted({k for st in per_param for k in st})
    for key in keys:
        values = [st.get(key) for st in per_param]
        flat_like = key != "step" and all(
            isinstance(v, torch.Tensor) and v.numel() == n for v, n in zip(values, numels) if v is not None)
        if flat_like:
            some = next(v for v in values if v is not None)
            full = torch.cat([(v if v is not None else some.new_zeros(n)).reshape(-1)
                              for v, n in zip(values, numels)]) if values else some.new_zeros(0)
            out[key] = full[start:end].clone()
        else:
            first = next(v for v in values if v is not None)
            out[key] = first.clone() if isinstance(first, torch.Tensor) else first
    return out
