"""Checkpoints of `dt train`: every rank's shard in one file, written atomically by rank 0.

save_checkpoint gathers each rank's serialised model and optimizer state on
rank 0 (point to point: a length, then the bytes), which writes them to
PATH.tmp and moves that over PATH with os.replace, so a crash never leaves
half a checkpoint. load_checkpoint has every rank read the file and take its
own shard: one machine, or a shared filesystem. The mesh and the model
config are stored with the shards and must match the run that loads them.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch

from dt import transport
from dt.collectives import barrier
from dt.models.gpt import ParallelGPT
from dt.train.optim import Adam

__all__ = ["load_checkpoint", "save_checkpoint"]


def _to_bytes(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)  # host: moved by the caller


def save_checkpoint(path: str, model: ParallelGPT, optimizer: Adam,
                    step: int) -> None:
    """Collective: rank 0 receives each rank's serialised shard and writes one file.

    Cost: every rank sends its model + optimizer state to rank 0 (point to
    point, a length first); rank 0 receives world-1 of them in rank order.
    """
    me, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    mine = _to_bytes({"model": model.stage.state_dict(), "optimizer": optimizer.state_dict(),
                      "step": step, "coords": model.mesh.coords()})
    device = transport.default_device(transport.resolve_group(None))
    mine = mine.to(device)  # NCCL moves only GPU tensors
    if me != 0:
        transport.send(torch.tensor([mine.numel()], dtype=torch.int64, device=device), 0)
        transport.send(mine, 0)
    else:
        shards = [bytes(mine.cpu().numpy())]
        for r in range(1, world):
            n = torch.empty(1, dtype=torch.int64, device=device)
            transport.recv(n, r)
            data = torch.empty(int(n), dtype=torch.uint8, device=device)
            transport.recv(data, r)
            shards.append(bytes(data.cpu().numpy()))
        m = model.mesh
        state = {"step": step, "mesh": m.sizes(),
                 "config": model.cfg.as_dict(), "ranks": shards}
        tmp = f"{path}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: readers see the old file or the new one, never half
    barrier()  # nobody returns before the file is complete


def load_checkpoint(path: str, model: ParallelGPT, optimizer: Adam) -> int:
    """Load this rank's shard; returns the step to continue from."""
    state = torch.load(path, weights_only=False)
    m = model.mesh
    if state["mesh"] != m.sizes() or state["config"] != model.cfg.as_dict():
        raise ValueError(f"checkpoint {path} is for mesh {state['mesh']} and model "
                         f"{state['config']}, not this run's")
    mine = torch.load(io.BytesIO(state["ranks"][m.rank]), weights_only=False)
    model.stage.load_state_dict(mine["model"])
    optimizer.load_state_dict(mine["optimizer"])
    return int(state["step"])
