"""Reference solution: all-to-all by pairwise exchange.

At step k (1 .. p-1) rank r sends block (r+k) mod p to that rank and
receives block r from rank (r-k) mod p: a permutation each step, so every
rank sends one block and receives one, p-1 times. Each rank sends every
block but its own.
"""

import torch.distributed as dist


def all_to_all(output_tensor_list, input_tensor_list, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    output_tensor_list[r].copy_(input_tensor_list[r])
    for k in range(1, p):
        to, frm = (r + k) % p, (r - k) % p
        works = []
        if output_tensor_list[frm].numel():
            works.append(dist.irecv(output_tensor_list[frm], group=group, group_src=frm))
        if input_tensor_list[to].numel():
            works.append(dist.isend(input_tensor_list[to], group=group, group_dst=to))
        for w in works:
            w.wait()
