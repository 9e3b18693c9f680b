"""Reusable landing buffers for received data that must be reduced before use.

A reduction cannot receive straight into its result: the incoming chunk
lands in a scratch buffer and is then combined with the local one. Allocating
that buffer on every call costs more than it seems: fresh pages from the
operating system fault in one by one on first touch, about 8 ms per 32 MB
all-reduce on the 2-core development machine, a fifth of the whole call.
So each thread keeps its scratch buffers (per slot, dtype and device) and
grows them when a bigger one is needed, as gloo and NCCL keep theirs.

Buffers above MAX_CACHED_BYTES are not kept: memory a user gave back to a
huge one-off call should not stay pinned.
"""

from __future__ import annotations

import threading

import torch

from dt.cost.memory import MAX_CACHED_BYTES

__all__ = ["MAX_CACHED_BYTES", "held_bytes", "release", "release_all", "scratch"]

_local = threading.local()
_caches: dict[int, dict] = {}  # every thread's cache, so memory reports can count them all
_caches_lock = threading.Lock()


def scratch(numel: int, dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
    """A 1-D tensor of `numel` elements whose contents are garbage; valid until the next call
    with the same slot on this thread."""
    nbytes = numel * dtype.itemsize
    if nbytes > MAX_CACHED_BYTES:
        return torch.empty(numel, dtype=dtype, device=device)
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
        with _caches_lock:
            _caches[threading.get_ident()] = cache
    key = (slot, dtype, device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def release() -> None:
    """Drop this thread's cached buffers."""
    _local.buffers = None
    with _caches_lock:
        _caches.pop(threading.get_ident(), None)


def release_all() -> None:
    """Drop every thread's cached buffers (each thread makes new ones when it next needs them)."""
    with _caches_lock:
        for cache in _caches.values():
            cache.clear()


def held_bytes(other_threads_only: bool = False) -> int:
    """Bytes the scratch buffers of every thread of this process hold right now (or of every
    thread but this one: what a thread-local memory counter here cannot see)."""
    me = threading.get_ident()
    with _caches_lock:
        return sum(b.untyped_storage().nbytes() for t, cache in _caches.items() for b in cache.values()
                   if not (other_threads_only and t == me))
