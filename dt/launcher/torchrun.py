"""Under torchrun: this process joins the launched group (`init`); dt.launcher.world runs the tools on it."""

from __future__ import annotations

import contextlib
import datetime
import os
from typing import Any

import torch.distributed as dist

from dt.args import check_environment, launched_by_torchrun
from dt.launcher.group import init_process_group, resolve_backend
from dt.launcher.pool import DEFAULT_TIMEOUT
from dt.transport import liveness

__all__ = ["init", "under_torchrun"]


def _attempt_store(timeout: float) -> Any:
    """Under torchrun on one node, a store private to this restart attempt (None: use env://).

    torchrun's workers share the agent's TCPStore across restarts (the default
    since torch 2.5), so a group restarted after a worker died would read the
    dead group's addresses from it (gloo: "connectFullMesh failed ... Connection
    refused"; torch issue #135712). The restart count, the same for every worker
    of one node's agent, names a fresh key space. Across nodes the agents' counts
    can differ: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 there instead.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("LOCAL_WORLD_SIZE") != env["WORLD_SIZE"]:
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), False,
                          timeout=datetime.timedelta(seconds=timeout))
    return dist.PrefixStore(f"dt/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def init(backend: str | None = "auto", timeout: float = DEFAULT_TIMEOUT) -> None:
    """Initialise torch.distributed from torchrun's environment (env://).

    backend "auto": NCCL when CUDA is available (one GPU per rank, LOCAL_RANK's), else gloo.
    """
    if dist.is_initialized():
        return
    check_environment()  # a bad DT_* value: one clear error now, not at each rank's first collective
    store = _attempt_store(timeout)
    if store is None:
        init_process_group(resolve_backend(backend), timeout, init_method="env://")
    else:
        init_process_group(resolve_backend(backend), timeout, store=store,
                           rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    with contextlib.suppress(Exception):  # no store to share: waits end at their timeout
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                              timeout=datetime.timedelta(seconds=60))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        liveness.attach(liveness.StoreChannel(dist.PrefixStore(f"dt/attempt{attempt}", store)),
                        keep_ports=(store.port,))


def under_torchrun() -> bool:
    """Whether this process is a rank torchrun launched (its environment names the world)."""
    return launched_by_torchrun()
