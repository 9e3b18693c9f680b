"""Reference solution: ring all-reduce = ring reduce-scatter, then ring all-gather.

The tensor is cut into p chunks (dt.layout.split_sizes: the same cut the
cost model counts). In the reduce-scatter lap each rank sends to its right
and receives from its left; a received chunk is reduced into the local copy
and forwarded the next step, so after p-1 steps rank r holds chunk r reduced
over every rank. The all-gather lap carries the reduced chunks once more
around the ring. Each rank sends every chunk but one per lap: 2(p-1)/p of
the tensor in all, whatever p is.
"""

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name
from dt.layout import split_sizes


def _exchange(send, to, recv, frm, group):
    """Post this step's receive and send together, then wait for both (never one before the other)."""
    works = []
    if recv.numel():
        works.append(dist.irecv(recv, group=group, group_src=frm))
    if send.numel():
        works.append(dist.isend(send, group=group, group_dst=to))
    for w in works:
        w.wait()


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)  # ranks in the group, not the world
    name = op_name(op)
    right, left = (r + 1) % p, (r - 1) % p
    chunks = list(tensor.view(-1).split(split_sizes(tensor.numel(), p)))
    landing = torch.empty_like(chunks[0])  # the first chunk is the longest

    # Reduce-scatter: at step s send chunk r-s-1, receive chunk r-s-2 and reduce it.
    for s in range(p - 1):
        out, into = (r - s - 1) % p, (r - s - 2) % p
        buf = landing[: chunks[into].numel()]  # the size of the chunk that arrives, not of ours
        _exchange(chunks[out], right, buf, left, group)
        combine(chunks[into], chunks[into], buf, name)
    finish(chunks[r], name, p)  # AVG: divide the finished sum, once

    # All-gather: at step s send chunk r-s (first our own, reduced), receive chunk r-s-1.
    for s in range(p - 1):
        out, into = (r - s) % p, (r - s - 1) % p
        _exchange(chunks[out], right, chunks[into], left, group)
