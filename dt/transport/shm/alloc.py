"""Tensors that live in shared memory, so the load/store algorithms read them where they are.

    grads = dt.shm_empty(1 << 20, group=g)    # on every rank of g, in the same order
    ...                                       # fill it as any tensor
    dt.all_reduce(grads, group=g)             # two_shot reads the peers' grads in place

A user tensor elsewhere is copied into the group's staging area once per
call (never twice: the result is written straight into the caller's tensor).
A tensor from `shm_empty` skips even that copy: every rank of the host maps
every rank's part of the allocation, so a collective publishes its address
(board.py) and the peers load from it directly: zero-copy, as NCCL's
registered buffers and torch's symmetric memory do on GPUs.

The allocation is collective (like creating a parameter): every rank of the
group calls shm_empty with the same size in the same order (dt.shm_empty,
in dt.collectives.api, checks that across ranks like any collective). It makes one
segment per host holding every local rank's part (`part` bytes apart: the
layout is symmetric, so rank j's copy of a tensor sits at the same offset
of part j), shared and unlinked at once (segment.py: nothing can leak).
Groups that have no board (ranks on several hosts, the wire turned off, a
single rank) get an ordinary tensor: the call stays valid everywhere.

Meant for long-lived buffers (gradient buckets, flat shards, layer
outputs): the memory is kept until the process exits.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dt.transport.connect import connect
from dt.transport.group import Group, resolve_group
from dt.transport.shm.attach import share

__all__ = ["allocate", "is_shared"]

PAGE = 4096


def allocate(g: Group, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The allocation itself (dt.shm_empty validates the call across ranks, then calls this on
    every rank of the group, in issue order): shared where the group has a board."""
    links = connect(g, "shm_empty")
    if links.board is None or links.host is None:
        return torch.empty(shape, dtype=dtype)  # host: shared memory is host memory
    board = links.board
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()  # host: a size
    part = max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)
    seg = share(g, links.topology, f"a{len(board.allocations)}", part * board.p)
    board.add_allocation(seg.tensor, part)
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)  # host: nothing to share
    # A storage of exactly this rank's bytes (memory accounting sees what the rank owns),
    # over the same mapping the peers' parts are read through.
    mine = torch.frombuffer(seg.mm, dtype=torch.uint8, count=nbytes, offset=board.me * part)  # host: shm
    return mine.view(dtype).view(shape)


def is_shared(tensor: torch.Tensor, group: Any = None) -> bool:
    """Whether `tensor` lives in one of the group's shared allocations (collectives read it
    in place)."""
    g = resolve_group(group)
    board = g.links.board
    return board is not None and board.find(tensor) is not None
