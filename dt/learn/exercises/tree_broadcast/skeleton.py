# dt exercise: tree_broadcast
import torch.distributed as dist  # noqa: F401

from dt.layout import children, lowest_bit  # noqa: F401  (the binomial tree's arithmetic)


def broadcast(tensor, src, group=None):
    """Every rank's tensor = src's (src a global rank), down a binomial tree."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # v = (r - root) % p; receive from v - lowest_bit(v); send to children(v, p)
    raise NotImplementedError("write the tree")
