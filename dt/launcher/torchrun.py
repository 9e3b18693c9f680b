"""Under torchrun: this process joins the launched group (`init`); dt.launcher.world runs the tools on it."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import signal
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

from dt.args import check_environment, launched_by_torchrun
from dt.launcher.group import init_process_group, resolve_backend
from dt.launcher.pool import DEFAULT_TIMEOUT
from dt.transport import liveness

__all__ = ["die_with_agent", "init", "under_torchrun"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_bound_to: int | None = None  # the agent this rank dies with, once bound


def die_with_agent() -> None:
    """Make this rank die with the torchrun agent that started it, however the agent dies.

    torchrun's agent stops its workers when it is stopped, but not when it is
    SIGKILLed: nothing runs in it then, and its workers (each in a session of its
    own) would train on, orphaned. The agent is this rank's parent (it starts each
    rank with Popen), so on Linux the kernel's parent-death signal ends the rank
    the moment the agent dies. Had the agent already died before the signal was
    set, the rank has a new parent by then: checked right after, so no death is
    missed. Elsewhere a thread polls for the same change of parent.
    Idempotent; only under torchrun (TORCHELASTIC_RUN_ID names its job).
    """
    global _bound_to
    if _bound_to is not None or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    agent = os.getppid()
    _bound_to = agent
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != agent:  # the agent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)
        return

    def watch() -> None:
        while os.getppid() == agent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="dt-agent-watch", daemon=True).start()


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
    die_with_agent()
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
