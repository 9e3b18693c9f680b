"""The same worker code under torchrun: `launch` runs this rank's share in this process."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from dt.launcher.group import init_process_group, resolve_backend
from dt.launcher.pool import DEFAULT_TIMEOUT, run_workers
from dt.transport import liveness, settings

__all__ = ["init", "launch"]


def init(backend: str | None = "auto", timeout: float = DEFAULT_TIMEOUT) -> None:
    """Initialise torch.distributed from torchrun's environment (env://).

    backend "auto": NCCL when CUDA is available (one GPU per rank, LOCAL_RANK's), else gloo.
    """
    if dist.is_initialized():
        return
    init_process_group(resolve_backend(backend), timeout, init_method="env://")
    with contextlib.suppress(Exception):  # no store to share: waits end at their timeout
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                              timeout=datetime.timedelta(seconds=60))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        liveness.attach(liveness.StoreChannel(dist.PrefixStore(f"dt/attempt{attempt}", store)),
                        keep_ports=(store.port,))


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def launch(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = DEFAULT_TIMEOUT,
           backend: str = "auto", **kwargs: Any) -> list[Any]:
    """run_workers here, or under torchrun just this rank: [fn(*args)] with rank 0's first."""
    if _under_torchrun():
        init(backend, timeout)
        settings.set_launcher_timeout(timeout)
        return [fn(*args, **kwargs)]
    return run_workers(fn, world_size, *args, timeout=timeout, backend=backend, **kwargs)
