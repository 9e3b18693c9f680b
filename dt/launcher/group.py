"""The process group a launcher makes: which backend, and NCCL's device bound at init."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from dt.device import backend_for, local_device
from dt.transport import settings

__all__ = ["init_process_group", "resolve_backend"]


def resolve_backend(backend: str | None) -> str:
    """"auto" (or None): nccl where CUDA is, else gloo."""
    return backend_for("auto") if backend in (None, "auto") else backend


def init_process_group(backend: str, timeout: float, **kwargs: Any) -> None:
    """init_process_group with this rank's device bound under NCCL.

    Binding the device (device_id=) makes NCCL create its communicator now,
    eagerly, on every rank at once, instead of lazily at a pair's first
    message, where ranks that start on different neighbours (a ring, Bruck)
    could wait on each other in a cycle.
    """
    extra: dict[str, Any] = {}
    if backend == "nccl":
        rank = kwargs.get("rank", int(os.environ.get("RANK", "0")))
        local = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", kwargs.get("world_size", 1)))
        device = local_device(backend, local, local_world)
        torch.cuda.set_device(device)
        extra["device_id"] = device
        extra["timeout"] = datetime.timedelta(seconds=timeout)  # NCCL's watchdog uses it
    # On gloo dt's own waits (settings.timeout_for) time every message; the group keeps
    # torch's default, so it does not count as a timeout the user gave the group.
    dist.init_process_group(backend, **kwargs, **extra)
    settings.launcher_owns(dist.group.WORLD)
