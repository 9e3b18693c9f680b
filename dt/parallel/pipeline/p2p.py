"""The pipeline's wire: activations forward, their gradients back, each with a shape header.

Stages agree on nothing in advance: every tensor is preceded by a header of
8 int64 words (dtype code, ndim, up to 6 dims), so a stage learns what it is
about to receive from the message itself. Per tensor: one 64-byte header
message and one data message.

Sends are isends that nobody waits on until the end of the step (`drain`),
so a send never blocks; only receives block (see the package docstring for
why no schedule deadlocks). Every message the pipeline moves goes through
this one class, so a change of how they are posted is a change here only.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

from dt import transport
from dt.transport import Group

__all__ = ["Wire"]

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.bool, torch.uint8]
_HEADER = 8  # int64 words: dtype code, ndim, up to 6 dims


def _header(t: torch.Tensor) -> torch.Tensor:
    if t.dim() > _HEADER - 2:
        raise ValueError(f"pipeline activations have at most {_HEADER - 2} dims, got {t.dim()}")
    h = torch.zeros(_HEADER, dtype=torch.int64)
    h[0], h[1] = _DTYPES.index(t.dtype), t.dim()
    h[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return h


class Wire:
    """One stage's point-to-point traffic over the pipeline group, and what it cost this step.

    Peers are global ranks. A message to this rank itself (one stage holding
    consecutive chunks) never touches the wire: it is queued and popped.
    `bytes_sent` and `wait_s` (time blocked receiving or draining sends) count
    from the last `reset`.
    """

    def __init__(self, group: Group):
        self.group = group
        self.me = group.global_rank(group.rank)
        self._sends: list[tuple[Any, torch.Tensor]] = []
        self._loopback: deque[torch.Tensor] = deque()
        self.bytes_sent = 0
        self.wait_s = 0.0

    def reset(self) -> None:
        """Start counting a new step."""
        self.bytes_sent, self.wait_s = 0, 0.0

    def send(self, t: torch.Tensor, dst: int) -> None:
        """Post header and data to `dst`; returns at once (the buffers are kept until `drain`)."""
        t = t.detach().contiguous()
        if dst == self.me:
            self._loopback.append(t)
            return
        h = _header(t)
        # Kept alive (with their handles) until drain(): isend reads the buffer
        # while the transfer is in flight.
        for buf in (h, t):
            self._sends.append((transport.isend(buf, dst, self.group), buf))
        self.bytes_sent += t.numel() * t.element_size() + h.numel() * h.element_size()

    def recv(self, src: int) -> torch.Tensor:
        """The next tensor from `src`: its header, then a buffer of that shape and dtype."""
        if src == self.me:
            return self._loopback.popleft()
        t0 = time.perf_counter()
        h = torch.empty(_HEADER, dtype=torch.int64)
        transport.irecv(h, src, self.group).wait()
        dtype, ndim = _DTYPES[int(h[0])], int(h[1])
        t = torch.empty(h[2:2 + ndim].tolist(), dtype=dtype)
        transport.irecv(t, src, self.group).wait()
        self.wait_s += time.perf_counter() - t0
        return t

    def drain(self) -> None:
        """Wait for every send posted since the last drain (the end of a step)."""
        t0 = time.perf_counter()
        for handle, _ in self._sends:
            handle.wait()
        self._sends.clear()
        self.wait_s += time.perf_counter() - t0
