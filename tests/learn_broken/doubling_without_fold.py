"""Broken on purpose: recursive doubling that assumes a power of two.

At distance d = 1, 2, 4, ... rank r swaps its whole tensor with rank r XOR d,
skipping partners past the end. On 2 or 8 ranks every rank meets every
other; on 3 or 5 some ranks miss some contributions: their result is wrong.
"""

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    name = op_name(op)
    flat = tensor.view(-1)
    d = 1
    while d < p:
        partner = r ^ d
        if partner < p and flat.numel():  # the bug: no fold for the ranks past a power of two
            theirs = torch.empty_like(flat)
            works = [dist.irecv(theirs, group=group, group_src=partner),
                     dist.isend(flat, group=group, group_dst=partner)]
            for w in works:
                w.wait()
            combine(flat, flat, theirs, name)
        d *= 2
    finish(flat, name, p)
