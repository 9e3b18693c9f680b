"""Reference solution: ring all-gather of shards of any length.

Rank r starts with its own shard in tensor_list[r]. At step s it sends
shard (r-s) mod p to its right and receives shard (r-s-1) mod p from its
left, straight into its place in tensor_list; the shard received at step s
is the one sent at step s+1. Each rank sends every shard but its right
neighbour's: (p-1)/p of the gathered bytes when the shards are even.
"""

import torch.distributed as dist


def all_gather(tensor_list, tensor, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    tensor_list[r].copy_(tensor)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        out, into = tensor_list[(r - s) % p], tensor_list[(r - s - 1) % p]
        works = []
        if into.numel():
            works.append(dist.irecv(into, group=group, group_src=left))
        if out.numel():
            works.append(dist.isend(out, group=group, group_dst=right))
        for w in works:
            w.wait()
