"""Reference solution: ring reduce-scatter over blocks of any length.

At step s rank r sends the partial sum of block (r-s-1) mod p to its right
and receives the partial sum of block (r-s-2) mod p from its left, adding
its own input's copy of that block. The partial sums live in clones, so
input_list is left as it was. After p-1 steps the last block received is
block r, reduced over every rank. Each rank sends every block but its own.
"""

import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    name = op_name(op)
    if p == 1:
        output.copy_(input_list[0])
        return
    partial = [t.reshape(-1).clone() for t in input_list]  # running sums; the inputs stay as given
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out, into = (r - s - 1) % p, (r - s - 2) % p
        landing = partial[into].new_empty(partial[into].numel())
        works = []
        if landing.numel():
            works.append(dist.irecv(landing, group=group, group_src=left))
        if partial[out].numel():
            works.append(dist.isend(partial[out], group=group, group_dst=right))
        for w in works:
            w.wait()
        combine(partial[into], partial[into], landing, name)
    finish(partial[r], name, p)
    output.view(-1).copy_(partial[r])
