"""Bruck all-gather and the dissemination barrier: lg p steps, not p-1.

Bruck: rank r keeps the blocks it has gathered in rotated order (slot i holds
rank r+i's block). In step k, with d = 2^k, it sends its first min(d, p-d)
slots to rank r-d and receives as many into slots d.. from rank r+d, doubling
what it holds. After ceil(lg p) steps it holds all p blocks and un-rotates.

Cost: ceil(lg p) steps; (p-1) blocks sent per rank, as the ring, but in
ceil(lg p) messages instead of p-1: the latency-optimal all-gather.
"""

from __future__ import annotations

import torch

from dt import cost
from dt.collectives.registry import algorithm, joined, tensor_forms
from dt.collectives.ring import ring_all_gather
from dt.cost import levels, textbook
from dt.transport import Comm, default_device, resolve_group


def bruck_rounds(comm: Comm, rotated: torch.Tensor) -> None:
    """rotated: (p, block) with this rank's block in row 0; filled in place."""
    p, r = comm.size, comm.rank
    d, step = 1, 0
    while d < p:
        comm.step = step
        count = min(d, p - d)
        send = rotated[:count] if rotated.shape[1] else None
        recv = rotated[d:d + count] if rotated.shape[1] else None
        comm.exchange(send, (r - d) % p, recv, (r + d) % p)
        d, step = d * 2, step + 1


def _bruck_gather(comm: Comm, output: torch.Tensor, input: torch.Tensor) -> None:
    p, r = comm.size, comm.rank
    block = input.numel()
    rotated = torch.empty((p, block), dtype=input.dtype, device=input.device)
    rotated[0].copy_(input.reshape(-1))
    bruck_rounds(comm, rotated)
    out = output.view(p, block)
    # slot i holds rank (r + i) % p: two slices undo the rotation.
    out[r:].copy_(rotated[: p - r])
    out[:r].copy_(rotated[p - r:])


@algorithm("all_gather", "bruck", formula=textbook.bruck_all_gather, levels=levels.bruck_all_gather,
           traffic=lambda c: (cost.bruck_all_gather(c.blocks[0], c.itemsize, c.p) if len(set(c.blocks)) == 1
                              else cost.ring_all_gather(c.blocks, c.itemsize, c.rank, c.segment_elems)))
def bruck_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                     group: object = None) -> None:
    """tensor_list[i] = rank i's tensor, by Bruck, when every entry has the same length.

    Bruck's rotation needs equal blocks; with uneven entries (which every rank
    sees alike, in its tensor_list) this falls back to the ring all-gather.
    """
    g = resolve_group(group)
    sizes = [t.numel() for t in tensor_list]
    if len(set(sizes)) > 1:
        ring_all_gather(tensor_list, tensor, g)
        return
    flat = joined([t.view(-1) for t in tensor_list])  # tensor_forms' blocks: gathered in place
    out = torch.empty(sum(sizes), dtype=tensor.dtype, device=tensor.device) if flat is None else flat
    _bruck_gather(Comm(g, "all_gather", "bruck"), out, tensor)
    if flat is None and sizes[0]:
        for t, part in zip(tensor_list, out.split(sizes[0])):
            t.view(-1).copy_(part)


(bruck_all_gather_into_tensor,) = tensor_forms("bruck", all_gather=bruck_all_gather)


@algorithm("barrier", "dissemination", formula=textbook.dissemination_barrier,
           traffic=lambda c: cost.dissemination_barrier(c.p))
def dissemination_barrier(group: object = None) -> None:
    """In round k every rank signals rank r+2^k and waits for rank r-2^k.

    After ceil(lg p) rounds each rank has heard, directly or not, from all
    others, so none leaves before all have arrived. Cost: ceil(lg p) steps,
    one empty message each way per step.
    """
    comm = Comm(resolve_group(group), "barrier", "dissemination")
    p, r = comm.size, comm.rank
    device = default_device(comm.group)
    token_out = torch.empty(0, dtype=torch.uint8, device=device)
    token_in = torch.empty(0, dtype=torch.uint8, device=device)
    d, step = 1, 0
    while d < p:
        comm.step = step
        comm.exchange(token_out, (r + d) % p, token_in, (r - d) % p)
        d, step = d * 2, step + 1
