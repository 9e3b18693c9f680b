"""Broken on purpose: a ring that receives every chunk into a buffer the size of its own.

With uneven chunks (33 elements over 5 ranks: 7, 7, 7, 6, 6) rank 3 receives
a 7-element chunk into a 6-element buffer; gloo aborts the receiving process.
"""

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    name = op_name(op)
    chunks = list(tensor.view(-1).tensor_split(p))
    for s in range(p - 1):
        out, into = (r - s - 1) % p, (r - s - 2) % p
        buf = torch.empty_like(chunks[r])  # the bug: our chunk's size, not the arriving one's
        works = [dist.irecv(buf, group=group, group_src=(r - 1) % p),
                 dist.isend(chunks[out], group=group, group_dst=(r + 1) % p)]
        for w in works:
            w.wait()
        combine(chunks[into], chunks[into], buf, name)
    finish(chunks[r], name, p)
    for s in range(p - 1):
        out, into = (r - s) % p, (r - s - 1) % p
        works = [dist.irecv(chunks[into], group=group, group_src=(r - 1) % p),
                 dist.isend(chunks[out], group=group, group_dst=(r + 1) % p)]
        for w in works:
            w.wait()
