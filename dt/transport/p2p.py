"""Public point-to-point, torch-shaped (peers are global ranks), counted like every dt message."""

from __future__ import annotations

from typing import Any

import torch

from dt.transport.comm import Comm, Handle
from dt.transport.group import resolve_group

__all__ = ["irecv", "isend", "recv", "send"]


def isend(tensor: torch.Tensor, dst: int, group: Any = None) -> Handle:
    """Post a send of `tensor` to global rank `dst`; `.wait()` the returned handle."""
    g = resolve_group(group)
    return Comm(g, "send_recv", "p2p").isend(tensor, g.group_rank(dst))


def irecv(tensor: torch.Tensor, src: int, group: Any = None) -> Handle:
    """Post a receive into `tensor` from global rank `src`; `.wait()` the returned handle."""
    g = resolve_group(group)
    return Comm(g, "send_recv", "p2p").irecv(tensor, g.group_rank(src))


def send(tensor: torch.Tensor, dst: int, group: Any = None) -> None:
    isend(tensor, dst, group).wait()


def recv(tensor: torch.Tensor, src: int, group: Any = None) -> None:
    irecv(tensor, src, group).wait()
