"""The ring: reduce-scatter, all-gather and all-reduce, and the chain broadcast.

Ranks sit on a ring, each sending to its right neighbour (r+1) and receiving
from its left (r-1). The buffer is cut into p chunks (`split_sizes`, the same
arithmetic the cost model uses, so every receive matches its send whatever
the length: 0, 1, primes, fewer elements than ranks). In p-1 steps each chunk
travels once around the ring:

- reduce-scatter: the received chunk is reduced into the local one before it
  is forwarded, so after p-1 steps rank r holds chunk r summed over all ranks;
- all-gather: the received chunk is stored and forwarded unchanged;
- all-reduce: reduce-scatter, then all-gather of the reduced chunks.

Each rank sends (p-1)/p of the buffer per pass whatever p is, which is why the
ring is bandwidth-optimal; it pays for that with p-1 sequential steps per pass.

Read `reference_ring_all_reduce` first: the algorithm as the textbook loop,
one exchange per step. The registered algorithms run the same schedule through
dt.collectives.ring_engine, which pipelines it (receives posted ahead, each
segment forwarded the moment it is reduced: the gather lap starts on a rank's
chunk as soon as it is final); a test holds the two equal bit for bit.
"""

from __future__ import annotations

import torch

from dt import cost
from dt.collectives.ops import ReduceOp, combine, finish, op_name
from dt.collectives.registry import algorithm, tensor_forms
from dt.collectives.ring_engine import DEFAULT_SEGMENT_BYTES, ring_pass, segments
from dt.collectives.scratch import scratch as scratch_buffer
from dt.cost import levels, textbook
from dt.layout import split_sizes
from dt.transport import RECV, SEND, Comm, resolve_group

__all__ = ["DEFAULT_SEGMENT_BYTES", "reference_ring_all_reduce", "ring_all_gather", "ring_all_reduce",
           "ring_broadcast", "ring_pass", "ring_reduce_scatter"]


def reference_ring_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM,
                              group: object = None) -> None:
    """Ring all-reduce in place, as the textbook writes it: 2(p-1) steps, one exchange each.

    At step s rank r sends chunk (r - s - 1) mod p to the right and receives chunk
    (r - s - 2) mod p from the left. For the first p-1 steps (reduce-scatter) it adds
    what arrives into its own copy of that chunk, so it ends holding chunk r reduced
    over every rank; for the next p-1 (all-gather) what arrives is final and is stored.
    Not registered: the algorithm= "ring" runs this schedule pipelined (ring_engine).
    """
    comm = Comm(resolve_group(group), "all_reduce", "ring")
    p, r, name = comm.size, comm.rank, op_name(op)
    if p == 1:
        return
    chunks = tensor.view(-1).split(split_sizes(tensor.numel(), p))
    right, left = (r + 1) % p, (r - 1) % p
    incoming = torch.empty(max(c.numel() for c in chunks), dtype=tensor.dtype, device=tensor.device)
    for step in range(2 * (p - 1)):
        comm.step = step
        send, recv = chunks[(r - step - 1) % p], chunks[(r - step - 2) % p]
        reducing = step < p - 1
        landed = incoming[:recv.numel()] if reducing else recv
        comm.exchange(send if send.numel() else None, right, landed if landed.numel() else None, left)
        if reducing:
            combine(recv, recv, landed, name)  # my copy first, then the arrival: the engine's order
            if step == p - 2:
                finish(recv, name, p)  # AVG: divide once, on the chunk now reduced


def _flat_chunks(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(flat.split(sizes))


@algorithm("all_reduce", "ring", formula=textbook.ring_all_reduce, levels=levels.ring_all_reduce,
           traffic=lambda c: cost.ring_all_reduce(c.n, c.itemsize, c.p, c.rank, c.segment_elems))
def ring_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: object = None,
                    *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Ring all-reduce in place: reduce-scatter then all-gather, one ring_pass of two laps.

    Cost (dt.cost.ring_all_reduce): 2(p-1) steps; 2(p-1)/p * n bytes sent per rank; (p-1)/p * n reduced.
    """
    comm = Comm(resolve_group(group), "all_reduce", "ring")
    flat = tensor.view(-1)
    chunks = _flat_chunks(flat, split_sizes(flat.numel(), comm.size))
    ring_pass(comm, chunks, first=-1, op=op_name(op), segment_bytes=segment_bytes, laps=2)


@algorithm("reduce_scatter", "ring", formula=textbook.ring_reduce_scatter, levels=levels.ring_reduce_scatter,
           traffic=lambda c: cost.ring_reduce_scatter(c.blocks, c.itemsize, c.rank, c.segment_elems))
def ring_reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor],
                        op: object = ReduceOp.SUM, group: object = None,
                        *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Ring reduce-scatter: output on rank r = reduction of input_list[r] over ranks.

    Chunks may have different lengths (uneven shards). The inputs are read, not
    written. Cost: p-1 steps; (p-1)/p * n bytes sent per rank (n = all chunks).
    """
    comm = Comm(resolve_group(group), "reduce_scatter", "ring")
    name = op_name(op)
    sources = [t.reshape(-1) for t in input_list]
    # Chunks this rank reduces on the way and forwards: reused buffers (slot 2;
    # ring_pass's landing buffers are slots 0 and 1).
    sizes = [t.numel() for t in sources]
    pool = scratch_buffer(sum(sizes), output.dtype, output.device, slot=2)
    work = list(pool.split(sizes))
    work[comm.rank] = output.view(-1)
    ring_pass(comm, work, first=-1, op=name, sources=sources, segment_bytes=segment_bytes)
    if comm.size == 1:
        output.view(-1).copy_(sources[0])


@algorithm("all_gather", "ring", formula=textbook.ring_all_gather, levels=levels.ring_all_gather,
           traffic=lambda c: cost.ring_all_gather(c.blocks, c.itemsize, c.rank, c.segment_elems))
def ring_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: object = None,
                    *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Ring all-gather into tensor_list (entries may differ in length).

    Cost: p-1 steps; (p-1)/p * n bytes sent per rank (n = all entries).
    """
    comm = Comm(resolve_group(group), "all_gather", "ring")
    chunks = [t.view(-1) for t in tensor_list]
    own = chunks[comm.rank]
    if own.data_ptr() != tensor.data_ptr() or own.numel() != tensor.numel():
        own.copy_(tensor.reshape(-1))
    ring_pass(comm, chunks, first=0, segment_bytes=segment_bytes)


@algorithm("broadcast", "ring", formula=textbook.ring_broadcast,
           traffic=lambda c: cost.ring_broadcast(c.n, c.itemsize, c.p, c.rank, c.root, c.segment_elems))
def ring_broadcast(tensor: torch.Tensor, src: int, group: object = None,
                   *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Pipelined chain from `src` (a global rank) along the ring.

    Each rank receives a segment from its left and forwards it right at once,
    so the segments stream through the chain. Cost: p-2+k steps for k segments;
    n bytes sent by every rank but the last in the chain.
    """
    g = resolve_group(group)
    comm = Comm(g, "broadcast", "ring")
    p, r = comm.size, comm.rank
    root = g.group_rank(src)
    position = (r - root) % p
    flat = tensor.view(-1)
    seg = max(1, segment_bytes // max(1, flat.element_size())) if segment_bytes else 0
    segs = segments(flat, seg)
    right, left = (r + 1) % p, (r - 1) % p
    if not comm.ahead:
        # One batch per segment: forward segment j while receiving segment j+1.
        if position > 0 and segs:
            comm.recv(segs[0], left)
        for j, s in enumerate(segs):
            comm.step = position + j
            ops = [(SEND, s, right)] if position < p - 1 else []
            ops += [(RECV, segs[j + 1], left)] if position > 0 and j + 1 < len(segs) else []
            for h in comm.batch(ops):
                h.wait()
        return
    sends = []
    receives = [comm.irecv(s, left) for s in segs] if position > 0 else []
    for j, s in enumerate(segs):
        comm.step = position + j
        if position > 0:
            receives[j].wait()
        if position < p - 1:
            sends.append(comm.isend(s, right))
    for h in sends:
        h.wait()


tensor_forms("ring", all_gather=ring_all_gather, reduce_scatter=ring_reduce_scatter)
