"""Binomial trees: broadcast and reduce in ceil(lg p) steps.

Number the ranks relative to the root, v = (r - root) mod p. In a binomial
tree rank v's parent is v with its lowest set bit cleared, and its children
are v + 2^k for every 2^k below that bit (v + 2^k < p). The root (v = 0)
has children 1, 2, 4, ...; the set of ranks holding the data doubles every
step, so ceil(lg p) steps reach everyone.

- binomial broadcast: receive from the parent, then send to the children,
  largest subtree first. ceil(lg p) steps, but the whole n on every edge:
  lg p * n on the critical path. For short messages.
- binomial reduce: the same tree upside down: receive from the children in
  a fixed order, reduce, send the sum to the parent.
- scatter + all-gather broadcast (van de Geijn): a binomial scatter of p
  pieces (each subtree gets its run of pieces, halving every level), then a
  ring all-gather of the pieces. 2(p-1)/p n bytes on the critical path
  whatever p is, at the price of ceil(lg p) + p - 1 steps. For long messages.
"""

from __future__ import annotations

import torch

from dt import cost
from dt.collectives.ops import ReduceOp, combine, finish, op_name
from dt.collectives.registry import algorithm
from dt.collectives.ring_engine import DEFAULT_SEGMENT_BYTES, ring_pass
from dt.collectives.scratch import scratch
from dt.cost import textbook
from dt.layout import children, edges, lowest_bit, split_sizes
from dt.transport import Comm, resolve_group


@algorithm("broadcast", "binomial", formula=textbook.binomial_broadcast,
           traffic=lambda c: cost.binomial_broadcast(c.n, c.itemsize, c.p, c.rank, c.root))
def binomial_broadcast(tensor: torch.Tensor, src: int, group: object = None) -> None:
    """Broadcast from `src` (a global rank) down a binomial tree.

    Cost (dt.cost.binomial_broadcast): ceil(lg p) steps; every rank but the
    root receives n; rank v sends n to each of its children.
    """
    g = resolve_group(group)
    comm = Comm(g, "broadcast", "binomial")
    p, r = comm.size, comm.rank
    root = g.group_rank(src)
    flat = tensor.view(-1)
    if p == 1 or flat.numel() == 0:
        return
    v = (r - root) % p
    bit = lowest_bit(v, p)
    if v:
        comm.step = bit.bit_length() - 1
        comm.recv(flat, (v - bit + root) % p)
    sends = []
    for child in children(v, p):
        comm.step = (child - v).bit_length() - 1
        sends.append(comm.isend(flat, (child + root) % p))
    for h in sends:
        h.wait()


@algorithm("reduce", "binomial", formula=textbook.binomial_reduce,
           traffic=lambda c: cost.binomial_reduce(c.n, c.itemsize, c.p, c.rank, c.root))
def binomial_reduce(tensor: torch.Tensor, dst: int, op: object = ReduceOp.SUM,
                    group: object = None) -> None:
    """Reduce onto `dst` (a global rank) up a binomial tree; only dst's tensor is written.

    Each rank posts every child's receive at once (one landing buffer per
    child, so nothing waits on a handshake), reduces them in a fixed order
    (smallest subtree first, the order the data arrives), then sends its partial
    result to its parent.

    Cost (dt.cost.binomial_reduce): ceil(lg p) steps; every rank but the
    root sends n; rank v receives and reduces n per child.
    """
    g = resolve_group(group)
    comm = Comm(g, "reduce", "binomial")
    p, r = comm.size, comm.rank
    root, name = g.group_rank(dst), op_name(op)
    flat = tensor.view(-1)
    if p == 1 or flat.numel() == 0:
        return
    v = (r - root) % p
    kids = children(v, p)[::-1]  # smallest subtree first: the first to be ready
    acc = flat if v == 0 else flat.clone()
    if kids:
        landing = scratch(len(kids) * flat.numel(), flat.dtype, flat.device).view(len(kids), -1)
        handles = []
        for k, child in enumerate(kids):
            comm.step = (child - v).bit_length() - 1
            handles.append(comm.irecv(landing[k], (child + root) % p))
        for k, h in enumerate(handles):
            h.wait()
            combine(acc, acc, landing[k], name)
    if v:
        bit = lowest_bit(v, p)
        comm.step = bit.bit_length() - 1
        comm.send(acc, (v - bit + root) % p)
    else:
        finish(acc, name, p)


@algorithm("broadcast", "scatter_allgather", formula=textbook.scatter_allgather_broadcast,
           traffic=lambda c: cost.scatter_allgather_broadcast(c.n, c.itemsize, c.p, c.rank, c.root,
                                                              c.segment_elems))
def scatter_allgather_broadcast(tensor: torch.Tensor, src: int, group: object = None,
                                *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Broadcast from `src`: binomial scatter of p pieces, then ring all-gather.

    Piece j (split_sizes(n, p)) belongs to relative rank j, so every subtree's
    pieces are one contiguous slice: each scatter edge is one message.

    Cost (dt.cost.scatter_allgather_broadcast): ceil(lg p) + p - 1 steps;
    about 2(p-1)/p n bytes sent per rank (the root sends n - n/p in the
    scatter, every rank (p-1)/p n in the all-gather, less the piece of its
    right neighbour).
    """
    g = resolve_group(group)
    comm = Comm(g, "broadcast", "scatter_allgather")
    p, r = comm.size, comm.rank
    root = g.group_rank(src)
    flat = tensor.view(-1)
    if p == 1 or flat.numel() == 0:
        return
    v = (r - root) % p
    offsets = edges(split_sizes(flat.numel(), p))

    def pieces(a: int, b: int) -> torch.Tensor:
        return flat[offsets[a]:offsets[min(b, p)]]

    bit = lowest_bit(v, p)
    if v:
        comm.step = bit.bit_length() - 1
        mine = pieces(v, v + bit)
        if mine.numel():
            comm.recv(mine, (v - bit + root) % p)
    sends = []
    for child in children(v, p):
        span = pieces(child, child + (child - v))
        if span.numel():
            comm.step = (child - v).bit_length() - 1
            sends.append(comm.isend(span, (child + root) % p))
    for h in sends:
        h.wait()
    comm.step = lowest_bit(0, p).bit_length() - 1
    # Ring all-gather: rank a's chunk is the piece of relative rank a - root.
    chunks = [pieces((a - root) % p, (a - root) % p + 1) for a in range(p)]
    ring_pass(comm, chunks, first=0, segment_bytes=segment_bytes)
