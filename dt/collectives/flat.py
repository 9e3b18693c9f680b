"""Flat algorithms: one root talks to everyone directly.

The obvious correct baseline. Two hops of latency whatever p is, which wins
for small messages; but the root sends or receives (p-1) * n bytes, which
loses to the ring as soon as bandwidth matters. `naive_all_reduce` is the
original design's baseline: reduce to the root, then broadcast from it.
"""

from __future__ import annotations

import torch

from dt import cost
from dt.collectives.ops import ReduceOp, combine, finish, op_name
from dt.collectives.registry import algorithm
from dt.cost import levels, textbook
from dt.transport import Comm, resolve_group


@algorithm("reduce", "flat", aliases=("naive",), formula=textbook.flat_reduce,
           traffic=lambda c: cost.flat_reduce(c.n, c.itemsize, c.p, c.rank, c.root))
def flat_reduce(tensor: torch.Tensor, dst: int, op: object = ReduceOp.SUM,
                group: object = None) -> None:
    """Every rank sends its tensor to `dst`, which reduces them in rank order.

    Cost: 1 step; n bytes sent per non-root rank, (p-1) * n received by the root.
    Only the root's tensor is written (as in torch.distributed.reduce).
    """
    g = resolve_group(group)
    comm = Comm(g, "reduce", "flat")
    root, name = g.group_rank(dst), op_name(op)
    flat = tensor.view(-1)
    if comm.size == 1 or flat.numel() == 0:
        return
    if comm.rank != root:
        comm.send(flat, root)
        return
    others = [i for i in range(comm.size) if i != root]
    landing = torch.empty((len(others), flat.numel()), dtype=flat.dtype, device=flat.device)
    handles = {i: comm.irecv(landing[k], i) for k, i in enumerate(others)}
    contributions = {i: landing[k] for k, i in enumerate(others)}
    contributions[root] = flat
    # Rank order, not arrival order: the same floating-point result on every run.
    acc = None
    for i in range(comm.size):
        if i in handles:
            handles[i].wait()
        if acc is None:
            acc = contributions[i].clone()
        else:
            combine(acc, acc, contributions[i], name)
    flat.copy_(acc)
    finish(flat, name, comm.size)


@algorithm("broadcast", "flat", aliases=("naive",), formula=textbook.flat_broadcast,
           traffic=lambda c: cost.flat_broadcast(c.n, c.itemsize, c.p, c.rank, c.root))
def flat_broadcast(tensor: torch.Tensor, src: int, group: object = None) -> None:
    """The root sends the whole tensor to each rank in turn (all posted at once).

    Cost: 1 step; (p-1) * n bytes sent by the root, n received by each other rank.
    """
    g = resolve_group(group)
    comm = Comm(g, "broadcast", "flat")
    root = g.group_rank(src)
    flat = tensor.view(-1)
    if comm.size == 1 or flat.numel() == 0:
        return
    if comm.rank == root:
        handles = [comm.isend(flat, i) for i in range(comm.size) if i != root]
        for h in handles:
            h.wait()
    else:
        comm.recv(flat, root)


@algorithm("all_reduce", "naive", formula=textbook.naive_all_reduce, levels=levels.naive_all_reduce,
           traffic=lambda c: cost.naive_all_reduce(c.n, c.itemsize, c.p, c.rank))
def naive_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: object = None) -> None:
    """Reduce to group rank 0, then broadcast from it.

    Cost: 2 steps; the root receives (p-1) * n and sends (p-1) * n bytes, the
    others send and receive n each.
    """
    g = resolve_group(group)
    name = op_name(op)
    root = g.global_rank(0)
    flat_reduce(tensor, root, name, group=g)
    flat_broadcast(tensor, root, group=g)


@algorithm("gather", "flat", aliases=("naive",), formula=textbook.flat_gather,
           traffic=lambda c: cost.flat_gather(c.blocks, c.itemsize, c.rank, c.root))
def flat_gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int,
                group: object = None) -> None:
    """Every rank sends its tensor to `dst`, which receives them all at once.

    Cost: 1 step; the root receives (p-1)/p * n bytes (n = everything gathered).
    """
    g = resolve_group(group)
    comm = Comm(g, "gather", "flat")
    root = g.group_rank(dst)
    if comm.rank != root:
        if tensor.numel():
            comm.send(tensor.reshape(-1), root)
        return
    assert gather_list is not None
    gather_list[root].view(-1).copy_(tensor.reshape(-1))
    handles = [comm.irecv(gather_list[i].view(-1), i)
               for i in range(comm.size) if i != root and gather_list[i].numel()]
    for h in handles:
        h.wait()


@algorithm("scatter", "flat", aliases=("naive",), formula=textbook.flat_gather,
           traffic=lambda c: cost.flat_scatter(c.blocks, c.itemsize, c.rank, c.root))
def flat_scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int,
                 group: object = None) -> None:
    """The root sends entry i of scatter_list to rank i (all posted at once).

    Cost: 1 step; the root sends (p-1)/p * n bytes.
    """
    g = resolve_group(group)
    comm = Comm(g, "scatter", "flat")
    root = g.group_rank(src)
    if comm.rank != root:
        if tensor.numel():
            comm.recv(tensor.view(-1), root)
        return
    assert scatter_list is not None
    tensor.view(-1).copy_(scatter_list[root].reshape(-1))
    handles = [comm.isend(scatter_list[i].reshape(-1), i)
               for i in range(comm.size) if i != root and scatter_list[i].numel()]
    for h in handles:
        h.wait()
