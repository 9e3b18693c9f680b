"""Broken on purpose: a pipelined ring that sizes what it receives like its own chunk.

Each chunk travels in segments of 2 elements. Each rank sizes its receive
buffer, and so counts the segments it expects, by *its own* chunk, not by
the chunk that arrives. When the chunks are uneven (33 elements over 5
ranks: 7, 7, 7, 6, 6) a rank with a 7-element chunk expects 4 segments
from a neighbour whose chunk has 6 and sends 3, and a rank with a
6-element chunk leaves a 4th segment unreceived: the ring deadlocks.
Even lengths pass.
"""

import math

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name

SEGMENT = 2


def _step(send, right, arriving, left, own, group):
    """Send `send` in segments; receive into a buffer sized like our own chunk (the bug)."""
    landing = torch.zeros(math.ceil(own.numel() / SEGMENT) * SEGMENT, dtype=own.dtype)
    works = [dist.irecv(slot, group=group, group_src=left) for slot in landing.split(SEGMENT)]
    works += [dist.isend(seg, group=group, group_dst=right) for seg in send.split(SEGMENT)]
    for w in works:
        w.wait()
    n = min(arriving.numel(), landing.numel())
    return landing[:n]


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    name = op_name(op)
    chunks = list(tensor.view(-1).tensor_split(p))
    for s in range(p - 1):
        out, into = (r - s - 1) % p, (r - s - 2) % p
        got = _step(chunks[out], (r + 1) % p, chunks[into], (r - 1) % p, chunks[r], group)
        combine(chunks[into][:got.numel()], chunks[into][:got.numel()], got, name)
    finish(chunks[r], name, p)
    for s in range(p - 1):
        out, into = (r - s) % p, (r - s - 1) % p
        got = _step(chunks[out], (r + 1) % p, chunks[into], (r - 1) % p, chunks[r], group)
        chunks[into][:got.numel()].copy_(got)
