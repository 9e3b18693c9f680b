"""A flat buffer sharded over a group, and gathering it back.

ZeRO cuts a flat buffer of parameters (or their optimizer state) into one
contiguous shard per rank, laid out by dt.layout.split_sizes. These two
helpers put the shards back together: the parameters before a module runs
(stage 3) and the full state for a checkpoint (every stage).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dt.collectives import all_gather

__all__ = ["full_optimizer_state", "gather_flat"]


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
