"""The process group a launcher makes (which backend, NCCL's device bound at init), and where
each run on it starts (`start_run`: the pool's workers and torchrun's ranks alike)."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from dt import transport
from dt.device import backend_for, local_device
from dt.transport import settings
from dt.transport.group import GROUPS

__all__ = ["destroy_past_groups", "init_process_group", "resolve_backend", "launcher_wait", "start_run"]


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


def launcher_wait(run_timeout: float) -> float:
    """dt's per-wait timeout (the launcher's, rule 5) for a run given `run_timeout` seconds.

    It fires inside the run's, so a deadlock is reported by the stuck ranks themselves,
    with their collective and step, before the launcher gives up on them.
    """
    return max(0.5, 0.8 * run_timeout)


def start_run(wait: float) -> None:
    """Start a run where a new process would, whatever the last run in this process left.

    The transport's state goes (dt.transport.state: settings, groups' links and segments,
    threads, traffic records, NCCL's rules recorder), and so do the process groups past runs
    made with dist.new_group (destroy_past_groups); what outlives a run stays: the default
    process group and shared_group's, the watchdog's channel, and the failures heard
    (between_runs: a faster peer may already have announced one for this run). Then `wait`,
    the launcher's wait for this run (launcher_wait). A pool's worker calls it before each
    job; under torchrun, where the process and its process group outlive the runs,
    LaunchedWorld.run does.
    """
    transport.reset(between_runs=True)
    destroy_past_groups()
    settings.set_launcher_timeout(wait)


def destroy_past_groups() -> None:
    """Destroy every process group an earlier run made with dist.new_group (a subgroup, a device
    mesh's), keeping the default group and shared_group's (made once and reused by every run).

    Why: each gloo group keeps a socket loop that wakes every 10 ms, and nothing else ends it
    while the process lives. A pool's worker runs many runs, each free to make groups of its own;
    kept, they add up run after run, and a pool of dozens of workers spends a growing share of the
    cores waking loops no run uses. Every rank runs this at the same point, the start of its next
    run, when no call is in flight on any of them.
    """
    if not dist.is_initialized():
        return
    world = dist.group.WORLD
    kept = {id(world)} | {id(pg) for made_in, pg in GROUPS.made.values() if made_in is world}
    registry = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", {})  # torch's groups
    for pg in [pg for pg in registry if id(pg) not in kept]:
        try:
            dist.destroy_process_group(pg)
        except RuntimeError:  # a ProcessGroup subclass torch never named (a custom backend's own):
            pass  # its last step, unregistering the name, fails; the rest is already undone
    settings.forget_groups(kept)
