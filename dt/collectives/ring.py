"""The ring: one engine for reduce-scatter, all-gather and all-reduce.

Ranks sit on a ring, each sending to its right neighbour (r+1) and receiving
from its left (r-1). The buffer is cut into p chunks (`split_sizes`, the same
arithmetic the cost model uses, so every receive matches its send whatever
the length: 0, 1, primes, fewer elements than ranks). In p-1 steps each chunk
travels once around the ring:

- reduce-scatter: the received chunk is reduced into the local one before it
  is forwarded, so after p-1 steps rank r holds chunk r summed over all ranks;
- all-gather: the received chunk is stored and forwarded unchanged;
- all-reduce: reduce-scatter, then all-gather of the reduced chunks, run as
  one pipeline of 2(p-1) steps (the gather lap starts on a rank's chunk the
  moment its last segment is reduced).

Each rank sends (p-1)/p of the buffer per pass whatever p is, which is why the
ring is bandwidth-optimal; it pays for that with p-1 sequential steps per pass.

Within a step a chunk may be cut into segments (`segment_bytes`): the reduction
of segment j then overlaps the arrival of segment j+1, and a reduced segment
is forwarded at once rather than after the whole chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dt.collectives.ops import ReduceOp, combine, finish, op_name
from dt.collectives.registry import algorithm
from dt.collectives.scratch import scratch as scratch_buffer
from dt.layout import ring_received, split_sizes
from dt.transport import RECV, SEND, Comm, Handle, resolve_group

# Segments no larger than this overlap reduction with transfer. Gloo uses at
# most 1 MiB; here, where every message costs a handshake and a wake-up of
# 100 us to a few ms (more on a loaded machine), 4 MiB measured faster than
# 256 KiB and 1 MiB at 4 and 32 MB, world 2 to 4 (dt bench collectives).
DEFAULT_SEGMENT_BYTES = 4 << 20


def _segments(t: torch.Tensor, segment_elems: int) -> list[torch.Tensor]:
    if t.numel() == 0:
        return []
    if segment_elems <= 0 or segment_elems >= t.numel():
        return [t]
    return list(t.split(segment_elems))


def ring_pass(
    comm: Comm,
    chunks: list[torch.Tensor],
    *,
    first: int,
    op: str | None = None,
    sources: list[torch.Tensor] | None = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    laps: int = 1,
) -> None:
    """Move every chunk `laps` times (p-1 steps each) around the ring, in place.

    At step s rank r sends chunk (r - s + first) mod p to the right and receives
    chunk (r - s - 1 + first) mod p from the left; from step 1 on, what it
    sends is what it received the step before. first=0 starts each rank on
    its own chunk (all-gather); first=-1 makes rank r *finish* the lap on its
    own chunk (reduce-scatter).

    With `op`, the first lap reduces: a received chunk is combined with
    `sources[i]` (default: the chunk itself) into `chunks[i]` (and divided by
    p for AVG at the lap's last step), and the first step sends from
    `sources`, so a reduce-scatter can read an input it must not modify. A
    second lap (laps=2, all-reduce) then just carries the reduced chunks on
    round: all-reduce = reduce-scatter + all-gather as one pipeline of 2(p-1)
    steps, rank r's reduced chunk forwarded segment by segment as it is
    finished.

    Receives are posted ahead of need: gloo moves a message only once the
    receiver has asked for it (a handshake per message), so a receive posted
    early lets the data flow the moment the left neighbour sends. Reducing
    steps land in two scratch buffers used alternately (step s+2's receive is
    posted once step s is reduced); the other steps land in their final chunk,
    so they are all posted as soon as every earlier receive has been (gloo
    matches receives from one peer in posting order). Each segment is
    forwarded as soon as it is reduced.

    Where receives may not be posted ahead (NCCL), `_ring_stepwise` runs the
    same schedule one batch per step instead.

    Cost: laps * (p-1) steps; bytes sent = sum of the chunks this rank forwards
    (dt.cost.ring_reduce_scatter / ring_all_gather give the exact figure).
    """
    p, r = comm.size, comm.rank
    if p == 1 or not chunks:
        return
    right, left = (r + 1) % p, (r - 1) % p
    seg = max(1, segment_bytes // chunks[0].element_size()) if segment_bytes else 0
    src = sources if sources is not None else chunks
    steps = laps * (p - 1)
    reducing = p - 1 if op is not None else 0  # the first lap reduces

    def received(step: int) -> int:
        return ring_received(r, p, step, first)

    if not comm.ahead:
        _ring_stepwise(comm, chunks, src, received, steps, reducing, op, seg)
        return

    scratch: list[torch.Tensor] = []
    if reducing:
        biggest = max(chunks[received(s)].numel() for s in range(reducing))
        scratch = [scratch_buffer(biggest, chunks[0].dtype, chunks[0].device, slot)
                   for slot in range(min(2, reducing))]

    posted: dict[int, list[tuple[Handle, torch.Tensor]]] = {}

    def post_until(last: int) -> None:
        """Post the receives of every step up to `last`, in step order."""
        for step in range(len(posted) + done[0], min(last, steps - 1) + 1):
            comm.step = step
            target = chunks[received(step)]
            landing = scratch[step % 2][: target.numel()] if step < reducing else target
            posted[step] = [(comm.irecv(s, left), s) for s in _segments(landing, seg)]

    done = [0]  # steps whose receives have been consumed
    post_until(1 if reducing else steps - 1)
    comm.step = 0
    sends = [comm.isend(s, right) for s in _segments(src[(r + first) % p], seg)]
    for step in range(steps):
        comm.step = step
        ri = received(step)
        target, offset = chunks[ri], 0
        last_reduce = step == reducing - 1
        for handle, landed in posted.pop(step):
            handle.wait()
            k = landed.numel()
            out = target[offset:offset + k]
            if step < reducing:
                combine(out, src[ri][offset:offset + k], landed, op)  # type: ignore[arg-type]
                if last_reduce:
                    finish(out, op, p)  # type: ignore[arg-type]
            if step < steps - 1:
                sends.append(comm.isend(out, right))  # forward this segment now
            offset += k
        done[0] += 1
        # scratch[step % 2] is free again: post step+2's receive, and once the
        # reducing receives are all posted, every later one.
        post_until(step + 2 if step + 2 < reducing else steps - 1)
    for h in sends:
        h.wait()


def _ring_stepwise(comm: Comm, chunks: list[torch.Tensor], src: list[torch.Tensor],
                   received: Callable[[int], int], steps: int, reducing: int, op: str | None,
                   seg: int) -> None:
    """ring_pass's schedule as NCCL wants it: each step's sends and receives as one batch.

    Step s sends what step s-1 received (step 0: this rank's first chunk, from
    `src`) and receives the next chunk; nothing is posted ahead, so every
    rank's operations with each neighbour stay in one order on its stream.
    """
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    landing = None
    if reducing:
        biggest = max(chunks[received(s)].numel() for s in range(reducing))
        landing = scratch_buffer(biggest, chunks[0].dtype, chunks[0].device, 0)
    outgoing = src[received(-1)]
    for step in range(steps):
        comm.step = step
        ri = received(step)
        target = chunks[ri]
        into = landing[: target.numel()] if step < reducing else target  # type: ignore[index]
        ops = [(RECV, s, left) for s in _segments(into, seg)]
        ops += [(SEND, s, right) for s in _segments(outgoing.reshape(-1), seg)]
        handles = comm.batch(ops)
        for h in handles:
            h.wait()
        if step < reducing:
            combine(target, src[ri], into, op)  # type: ignore[arg-type]
            if step == reducing - 1:
                finish(target, op, p)  # type: ignore[arg-type]
        outgoing = target


def _flat_chunks(flat: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(flat.split(sizes))


@algorithm("all_reduce", "ring")
def ring_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: object = None,
                    *, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
    """Ring all-reduce in place: reduce-scatter then all-gather, one ring_pass of two laps.

    Cost (dt.cost.ring_all_reduce): 2(p-1) steps; 2(p-1)/p * n bytes sent per rank; (p-1)/p * n reduced.
    """
    comm = Comm(resolve_group(group), "all_reduce", "ring")
    flat = tensor.view(-1)
    chunks = _flat_chunks(flat, split_sizes(flat.numel(), comm.size))
    ring_pass(comm, chunks, first=-1, op=op_name(op), segment_bytes=segment_bytes, laps=2)


@algorithm("reduce_scatter", "ring")
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


@algorithm("all_gather", "ring")
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


@algorithm("broadcast", "ring")
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
    segs = _segments(flat, seg)
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


@algorithm("all_gather_into_tensor", "ring")
def ring_all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor,
                                group: object = None) -> None:
    """Ring all-gather of equal shards into one flat output (see ring_all_gather)."""
    p = resolve_group(group).size
    ring_all_gather(list(output.view(-1).split(input.numel())) if input.numel() else
                    [output.view(-1)[:0]] * p, input, group)


@algorithm("reduce_scatter_tensor", "ring")
def ring_reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor,
                               op: object = ReduceOp.SUM, group: object = None) -> None:
    """Ring reduce-scatter of p equal slices of `input` (see ring_reduce_scatter)."""
    p = resolve_group(group).size
    n = output.numel()
    ring_reduce_scatter(output, list(input.view(-1).split(n)) if n else [input.view(-1)[:0]] * p,
                        op, group)
