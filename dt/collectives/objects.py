"""Collectives of picklable Python objects, built from dt's tensor collectives.

An object travels as its pickle, a uint8 tensor whose length only its owner
knows, so every object collective is two collectives: first the lengths
(one int64 per object), then the bytes, into buffers sized from the lengths.
torch pads every pickle to the longest one so that one equal-sized
all_gather fits all; dt's all_gather, gather and scatter take blocks of
different sizes (uneven lists), so here each rank sends exactly its bytes.

Signatures, in-place results and roots are torch.distributed's:
all_gather_object, broadcast_object_list, gather_object, scatter_object_list,
send_object_list, recv_object_list. As with torch, unpickling runs whatever
the sender pickled: use them only with ranks you trust.

Cost: the lengths' collective (8 bytes per object) plus the bytes' collective
with the pickles as its blocks; dt.traffic() charges each to its tensor
collective (all_gather, broadcast, gather, scatter, send_recv).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from dt import transport
from dt.collectives import arguments
from dt.collectives.api import all_gather, all_gather_into_tensor, broadcast, gather, scatter
from dt.transport import Group, resolve_group

__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]


def _to_tensor(obj: Any, device: torch.device) -> torch.Tensor:
    buf = io.BytesIO()
    pickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8).to(device)  # host: then moved


def _to_object(t: torch.Tensor) -> Any:
    return pickle.loads(t.cpu().numpy().tobytes())


def _lengths(n: int, device: torch.device) -> torch.Tensor:
    return torch.empty(n, dtype=torch.int64, device=device)


def _root(g: Group, rank: int | None, group_rank: int | None, what: str,
          default: int | None = 0) -> int:
    """A global rank from torch's pair (src, group_src); raises what is wrong with it."""
    errors: list[str] = []
    found = arguments.root(g, rank, group_rank, what, errors, default)
    if errors:
        raise ValueError(f"rank {g.ranks[g.rank]}: {'; '.join(errors)}")
    return found


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """object_list[i] = rank i's `obj` (object_list has one slot per rank of the group)."""
    g = resolve_group(group)
    device = transport.default_device(g)
    mine = _to_tensor(obj, device)
    lengths = _lengths(g.size, device)
    all_gather_into_tensor(lengths, torch.tensor([mine.numel()], device=device), group=g)
    pickles = [torch.empty(n, dtype=torch.uint8, device=device) for n in lengths.tolist()]
    all_gather(pickles, mine, group=g)
    if len(object_list) < g.size:
        raise ValueError(f"all_gather_object: object_list has {len(object_list)} slots but the "
                         f"group has {g.size} ranks")
    for i, t in enumerate(pickles):
        object_list[i] = _to_object(t)


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: torch.device | None = None, group_src: int | None = None) -> None:
    """Every rank's object_list[i] = src's object_list[i] (the lists must have the same length)."""
    g = resolve_group(group)
    root = _root(g, src, group_src, "src")
    device = torch.device(device) if device is not None else transport.default_device(g)
    is_root = g.ranks[g.rank] == root
    if is_root:
        pickles = [_to_tensor(o, device) for o in object_list]
        lengths = torch.tensor([t.numel() for t in pickles], dtype=torch.int64, device=device)
    else:
        lengths = _lengths(len(object_list), device)
    broadcast(lengths, src=root, group=g)
    sizes = lengths.tolist()
    payload = (torch.cat(pickles) if is_root and pickles
               else torch.empty(sum(sizes), dtype=torch.uint8, device=device))
    broadcast(payload, src=root, group=g)
    if not is_root:
        for i, t in enumerate(payload.split(sizes)):
            object_list[i] = _to_object(t)


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                  group: Any = None, group_dst: int | None = None) -> None:
    """On dst, object_gather_list[i] = rank i's `obj`; other ranks pass None."""
    g = resolve_group(group)
    root = _root(g, dst, group_dst, "dst")
    device = transport.default_device(g)
    is_root = g.ranks[g.rank] == root
    mine = _to_tensor(obj, device)
    lengths = [_lengths(1, device) for _ in range(g.size)] if is_root else None
    gather(torch.tensor([mine.numel()], device=device), lengths, dst=root, group=g)
    pickles = ([torch.empty(int(n), dtype=torch.uint8, device=device) for n in lengths]
               if lengths is not None else None)
    gather(mine, pickles, dst=root, group=g)
    if pickles is not None:
        if object_gather_list is None or len(object_gather_list) < g.size:
            raise ValueError(f"gather_object: object_gather_list on dst {root} must have a slot "
                             f"for each of the group's {g.size} ranks")
        for i, t in enumerate(pickles):
            object_gather_list[i] = _to_object(t)


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None, src: int | None = None,
                        group: Any = None, group_src: int | None = None) -> None:
    """scatter_object_output_list[0] on rank i = src's scatter_object_input_list[i]."""
    g = resolve_group(group)
    root = _root(g, src, group_src, "src")
    device = transport.default_device(g)
    is_root = g.ranks[g.rank] == root
    pickles = [_to_tensor(o, device) for o in scatter_object_input_list or []] if is_root else None
    lengths = ([torch.tensor([t.numel()], device=device) for t in pickles]
               if pickles is not None else None)
    length = _lengths(1, device)
    scatter(length, lengths, src=root, group=g)
    mine = torch.empty(int(length), dtype=torch.uint8, device=device)
    scatter(mine, pickles, src=root, group=g)
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at least 1.")
    scatter_object_output_list[0] = _to_object(mine)


def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: torch.device | None = None, group_dst: int | None = None,
                     use_batch: bool = False) -> None:
    """Send every object of `object_list` to dst (which calls recv_object_list with as many slots)."""
    g = resolve_group(group)
    peer = _root(g, dst, group_dst, "dst", default=None)
    device = torch.device(device) if device is not None else transport.default_device(g)
    pickles = [_to_tensor(o, device) for o in object_list]
    transport.send(torch.tensor([t.numel() for t in pickles], dtype=torch.int64, device=device),
                   peer, group=g)
    if pickles:
        transport.send(torch.cat(pickles), peer, group=g)


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: torch.device | None = None, group_src: int | None = None,
                     use_batch: bool = False) -> int:
    """Fill object_list with the objects src sent; return src, as torch does."""
    g = resolve_group(group)
    peer = _root(g, src, group_src, "src", default=None)
    device = torch.device(device) if device is not None else transport.default_device(g)
    lengths = _lengths(len(object_list), device)
    transport.recv(lengths, peer, group=g)
    sizes = lengths.tolist()
    if object_list:
        payload = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        transport.recv(payload, peer, group=g)
        for i, t in enumerate(payload.split(sizes)):
            object_list[i] = _to_object(t)
    return peer
