"""Agreeing across ranks: the small collectives that keep a checkpoint's ranks in step.

Every failure while saving or loading is agreed on before anyone acts on it
(`agree`), so all ranks raise the same one-line CheckpointError together
instead of some waiting forever on one that gave up. All of it is built on
dt's own collectives, over the whole world.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dt.collectives import all_gather, all_reduce, broadcast, gather
from dt.collectives.ops import ReduceOp
from dt.parallel.checkpoint import files
from dt.parallel.checkpoint.files import CheckpointError
from dt.transport import default_device, resolve_group

__all__ = ["agree", "broadcast_bytes", "gather_bytes", "lock_directory", "raise_if", "world"]


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without torch.distributed (one process saves and loads alone)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device() -> torch.device:
    return default_device(resolve_group(None))


def _on(device: torch.device, data: bytes) -> torch.Tensor:
    """`data` as a uint8 tensor on `device` (NCCL moves only GPU tensors)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)  # host: moved at once


def broadcast_bytes(data: bytes, src: int) -> bytes:
    """Cost: two broadcasts from `src`, 8 bytes then len(data)."""
    dev = _device()
    n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    broadcast(n, src)
    buf = _on(dev, data) if data else torch.empty(int(n), dtype=torch.uint8, device=dev)
    if int(n):
        broadcast(buf, src)
    return bytes(buf.cpu().numpy())


def gather_bytes(data: bytes) -> list[bytes]:
    """Every rank's bytes on rank 0 (others get []). Cost: an all-gather of 8 bytes per rank,
    then a gather of the longest length from every rank."""
    rank, size = world()
    dev = _device()
    lengths = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(size)]
    all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64, device=dev))
    longest = max(int(n) for n in lengths)
    mine = _on(dev, data.ljust(longest, b"\0"))
    parts = [torch.empty(longest, dtype=torch.uint8, device=dev) for _ in range(size)] if rank == 0 else None
    gather(mine, parts, 0)
    return [bytes(p[:int(n)].cpu().numpy()) for p, n in zip(parts, lengths)] if parts else []


def agree(problem: str | None) -> str | None:
    """The problem of the lowest rank that has one, on every rank; None when no rank has one.

    Collective: one all-reduce (MIN) of 8 bytes, plus a broadcast of the message when there is
    one. Every rank then raises the same text, and no rank is left waiting on one that gave up.
    """
    rank, size = world()
    if size == 1:
        return problem
    first = torch.tensor([rank if problem else size], dtype=torch.int64, device=_device())
    all_reduce(first, ReduceOp.MIN)
    src = int(first)
    if src == size:
        return None
    return broadcast_bytes(problem.encode() if rank == src else b"", src).decode()


def raise_if(problem: str | None) -> None:
    if problem:
        raise CheckpointError(problem)


def lock_directory(path: str) -> files.DirectoryLock | None:
    """Collective: rank 0 checks `path` is a writable directory, locks it for this job and
    removes what writers that died mid-save left; every rank raises the same error if not.
    Returns the lock on rank 0 (release it when the job ends), None elsewhere."""
    lock, problem = None, None
    if world()[0] == 0:
        try:
            lock = files.DirectoryLock(files.check_directory(path))
            lock.acquire()
            files.clean_stale(path)
        except CheckpointError as e:
            problem = str(e)
            if lock is not None:
                lock.release()  # a no-op unless it was taken
            lock = None
    try:
        problem = agree(problem)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if problem:
        raise CheckpointError(problem)
    return lock
