"""The peak of live tensor bytes: what a memory model predicts, measured on either device.

    with LiveBytes(device) as live:
        loss = model(x).sum(); loss.backward()
    live.peak, live.current     # bytes above what was live when the block began

    with LiveBytes() as live:   # a backward's own peak, its forward's bytes counted as they go
        loss = model(x).sum(); held = live.current
        live.reset_peak(); loss.backward()
    live.peak - held

    with SavedBytes(exclude=[*model.parameters(), *model.buffers()]) as saved:
        loss = model(x).sum()   # saved.bytes: what autograd keeps for backward (activations)

On a GPU it reads the caching allocator (torch.cuda.memory_allocated and
max_memory_allocated, whose peak counter it resets on entry). On the CPU there
is no such counter and the process RSS says little (the allocator keeps freed
pages, and torch, Python and the libraries are in it), so dt counts tensors
itself: a TorchDispatchMode sees every op's outputs; each storage it has not seen
is counted with its nbytes and a weakref finalizer takes it off when the storage
is freed. What is counted, and why:

- storages, not tensors: a view (or an in-place op's result) shares its input's
  storage, so an output aliasing an input is never counted again;
- only storages made inside the block: what was live at entry is the baseline, as
  on the GPU (the model's weights, a batch made before);
- backward's tensors too: the autograd engine runs each node under the mode that
  was active (thread-local state travels with it), gradients included;
- storage bytes as torch asks for them, not the allocator's rounding (the GPU's
  512-byte blocks): within a percent at any shape worth predicting;
- a storage resized in place counts its new size from then on: dt's FSDP frees a
  gathered unit by `untyped_storage().resize_(0)` and refills the same storage for
  backward. Storage.resize_ reaches no dispatch mode, so while a counter is active
  torch.UntypedStorage.resize_ is wrapped to tell it (a tensor's aten resize_ it sees).

SavedBytes counts what autograd keeps for backward (saved_tensors_hooks): distinct
storages packed, the excluded ones (weights, buffers) left out. It is what
dt.cost.activations predicts, to the byte.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes", "SavedBytes"]


_RESIZES = {torch.ops.aten.resize_.default, torch.ops.aten.resize_as_.default}  # in place, seen here


class _Counter(TorchDispatchMode):
    """Counts the bytes of every storage an op creates, until it is freed or resized."""

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._lock = threading.Lock()  # finalizers may run on another thread (autograd's)
        self._alive: dict[int, int] = {}  # id of each live storage counted (its finalizer's key): bytes

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _RESIZES:  # its output is its input: not new, but maybe another size
            self.resized(args[0].untyped_storage())
            return out
        inputs = {_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _key(t) not in inputs:
                self._count(t.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = id(storage), storage.nbytes()
        with self._lock:
            if key in self._alive:
                return
            self._alive[key] = nbytes
            self._add(nbytes)
        weakref.finalize(storage, self._freed, key)

    def resized(self, storage: torch.UntypedStorage) -> None:
        """A storage changed size in place: a counted one counts its new bytes from now on."""
        key, nbytes = id(storage), storage.nbytes()
        with self._lock:
            if key in self._alive:
                self._add(nbytes - self._alive[key])
                self._alive[key] = nbytes

    def _add(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def _freed(self, key: int) -> None:
        with self._lock:
            self.current -= self._alive.pop(key, 0)


_active: list[_Counter] = []  # the counters inside a block now (any thread): each hears every resize
_active_lock = threading.Lock()
_storage_resize = torch.UntypedStorage.resize_  # torch's own (StorageBase's), back when the last ends
_own_resize = "resize_" in vars(torch.UntypedStorage)


def _resize_told(storage: torch.UntypedStorage, nbytes: int) -> Any:
    out = _storage_resize(storage, nbytes)
    for counter in list(_active):
        counter.resized(storage)
    return out


def _listen(counter: _Counter) -> None:
    with _active_lock:
        if not _active:
            torch.UntypedStorage.resize_ = _resize_told  # type: ignore[method-assign]
        _active.append(counter)


def _stop_listening(counter: _Counter) -> None:
    with _active_lock:
        _active.remove(counter)
        if not _active and _own_resize:
            torch.UntypedStorage.resize_ = _storage_resize  # type: ignore[method-assign]
        elif not _active:
            del torch.UntypedStorage.resize_  # StorageBase's shows through again


def _key(t: torch.Tensor) -> int:
    """The storage a tensor lives in (views and in-place results share their input's)."""
    return id(t.untyped_storage()) if t.layout == torch.strided else id(t)


class LiveBytes:
    """Current and peak live tensor bytes allocated inside a `with` block, on `device`."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._counter: _Counter | None = None
        self._base = 0
        self._cuda_peak = 0
        self._cuda_current = 0

    def __enter__(self) -> LiveBytes:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._counter = _Counter()
            _listen(self._counter)
            self._counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._cuda_peak = torch.cuda.max_memory_allocated(self.device) - self._base
            self._cuda_current = torch.cuda.memory_allocated(self.device) - self._base
        elif self._counter is not None:
            self._counter.__exit__(*exc)
            _stop_listening(self._counter)

    def reset_peak(self) -> None:
        """Start the peak again from what is live now (still above the entry's bytes): a later
        phase's own peak, in which what earlier phases made counts while it lives."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._counter is not None:
            with self._counter._lock:
                self._counter.peak = self._counter.current

    @property
    def peak(self) -> int:
        """The most bytes live at once inside the block (above the entry's)."""
        if self.device.type == "cuda":
            return self._cuda_peak
        return self._counter.peak if self._counter is not None else 0

    @property
    def current(self) -> int:
        """Bytes made inside the block and still live (on the GPU: as of the block's end)."""
        if self.device.type == "cuda":
            return self._cuda_current
        return self._counter.current if self._counter is not None else 0


class SavedBytes:
    """Bytes of the distinct storages autograd saves for backward inside a `with` block."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {_key(t) for t in exclude}
        self._kept: dict[int, torch.UntypedStorage] = {}  # held, so no address is reused meanwhile
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout == torch.strided:
            storage = t.untyped_storage()
            if id(storage) not in self._excluded and storage.data_ptr() not in self._kept:
                self._kept[storage.data_ptr()] = storage
        return t

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(s.nbytes() for s in self._kept.values())
