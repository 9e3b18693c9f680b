"""All-to-all by pairwise exchange.

Rank r owes block j to rank j. In step k (1..p-1) rank r sends block r+k to
rank r+k and receives block r-k from rank r-k: every rank sends and receives
exactly one block per step, so no link carries two messages at once and no
rank waits on a receive its peer has not been asked to send.

Cost: p-1 steps; (p-1)/p * n bytes sent per rank for even blocks.
"""

from __future__ import annotations

import torch

from dt import cost
from dt.collectives.registry import algorithm
from dt.cost import textbook
from dt.transport import Comm, resolve_group


@algorithm("all_to_all", "pairwise", formula=textbook.pairwise_all_to_all,
           traffic=lambda c: cost.pairwise_all_to_all(c.blocks, c.received_blocks, c.itemsize, c.rank))
def pairwise_all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor],
                        group: object = None) -> None:
    """output_list[j] on rank r receives input_list[r] of rank j (blocks may differ in length)."""
    comm = Comm(resolve_group(group), "all_to_all", "pairwise")
    p, r = comm.size, comm.rank
    output_list[r].view(-1).copy_(input_list[r].reshape(-1))
    for k in range(1, p):
        comm.step = k - 1
        to, frm = (r + k) % p, (r - k) % p
        send = input_list[to].reshape(-1)
        recv = output_list[frm].view(-1)
        comm.exchange(send if send.numel() else None, to, recv if recv.numel() else None, frm)
