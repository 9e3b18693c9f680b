"""Reference solution: broadcast down a binomial tree.

With v = (r - root) mod p, v's parent is v - lowest_bit(v) and its children
are v + 2^k for the powers of two below that bit: ceil(lg p) rounds, the
holders doubling each round. Each rank receives the tensor once and sends
it once per child (dt.layout has the tree; dt.cost.binomial_broadcast counts it).
"""

import torch.distributed as dist

from dt.layout import children, lowest_bit


def broadcast(tensor, src, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    root = src if group is None else dist.get_group_rank(group, src)
    if p == 1 or tensor.numel() == 0:
        return
    flat = tensor.view(-1)
    v = (r - root) % p
    if v:
        parent = v - lowest_bit(v, p)
        dist.recv(flat, group=group, group_src=(parent + root) % p)
    sends = [dist.isend(flat, group=group, group_dst=(child + root) % p) for child in children(v, p)]
    for w in sends:
        w.wait()
