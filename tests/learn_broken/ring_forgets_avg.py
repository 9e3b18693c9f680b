"""Broken on purpose: a correct ring that never divides, so ReduceOp.AVG returns the sum."""

import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, op_name


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    name = op_name(op)
    chunks = list(tensor.view(-1).tensor_split(p))
    for s in range(p - 1):
        out, into = (r - s - 1) % p, (r - s - 2) % p
        buf = chunks[into].clone()
        works = [dist.irecv(buf, group=group, group_src=(r - 1) % p),
                 dist.isend(chunks[out], group=group, group_dst=(r + 1) % p)]
        for w in works:
            w.wait()
        combine(chunks[into], chunks[into], buf, name)  # AVG combines as SUM ... and nothing divides
    for s in range(p - 1):
        out, into = (r - s) % p, (r - s - 1) % p
        works = [dist.irecv(chunks[into], group=group, group_src=(r - 1) % p),
                 dist.isend(chunks[out], group=group, group_dst=(r + 1) % p)]
        for w in works:
            w.wait()
