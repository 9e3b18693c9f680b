"""Reference solution: recursive-doubling all-reduce with MPICH's fold.

The extra ranks past the largest power of two p' fold in (each even rank of
the first 2e hands its tensor to its odd neighbour), the p' virtual ranks
exchange the whole tensor with vrank XOR d for d = 1, 2, ..., p'/2, reducing
each time, and the odd ranks hand the result back. lg p' steps (+2 with a
fold), n bytes per step (dt.cost.recursive_doubling_all_reduce).
"""

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name
from dt.layout import Fold


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    name = op_name(op)
    flat = tensor.view(-1)
    if p == 1 or flat.numel() == 0:
        return
    fold = Fold(p, r)
    theirs = torch.empty_like(flat)
    if fold.folded and fold.vrank is None:  # sit out: hand over the tensor, get the result back
        dist.send(flat, group=group, group_dst=fold.partner)
        dist.recv(flat, group=group, group_src=fold.partner)
        return
    if fold.folded:
        dist.recv(theirs, group=group, group_src=fold.partner)
        combine(flat, flat, theirs, name)
    d = 1
    while d < fold.p2:
        peer = fold.real(fold.vrank ^ d)
        works = [dist.irecv(theirs, group=group, group_src=peer),
                 dist.isend(flat, group=group, group_dst=peer)]
        for w in works:
            w.wait()
        combine(flat, flat, theirs, name)
        d *= 2
    finish(flat, name, p)
    if fold.folded:
        dist.send(flat, group=group, group_dst=fold.partner)
