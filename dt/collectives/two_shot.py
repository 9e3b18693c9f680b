"""Two-shot all-reduce through shared memory: reduce-scatter by loads, then all-gather by loads.

Only for a group whose ranks all share one host segment (dt.transport.shm).
The buffer is cut into p slices (dt.layout.split_sizes, as the ring cuts it):

1. every rank publishes its buffer (zero-copy when it lives in a shared
   allocation, dt.shm_empty; else copied into staging, all but its own slice,
   which it reads from its own tensor) and synchronises (sync A);
2. rank r reduces slice r of every rank's buffer into its own tensor, and
   publishes the result (in place, or copied into its staging slice r);
   sync B;
3. rank r copies slice j of rank j's buffer (the reduced slice j) into its
   tensor, for every j.

Each rank reads 2(p-1)/p n bytes from its peers, as the ring sends, but in
two synchronisations instead of 2(p-1) message steps, and reduces only its
1/p: bandwidth-optimal, where one-shot reads (p-1) n. vLLM and SGLang use
it above a few hundred KB on GPUs, DeepSpeed's CPU all-reduce ("distributed
naive") for large messages. A zero-copy call ends with a third sync: a
peer may still be copying this rank's reduced slice when it returns.

With p > 2 and every rank staged, the staging copy includes the rank's own
slice, so step 2 is one kernel over a strided (p, n/p) view of all buffers
instead of p-1 pairwise ones.

Cost (dt.cost.two_shot_all_reduce): 2 syncs per round (3 zero-copy);
2(p-1)/p n bytes read from peers per rank; (p-1)/p n reduced.

Memory traffic, what bounds it on large messages (dt.cost.loadstore, reads + writes per rank in
units of n): a plain tensor needs at least 4n at p = 2 (all_reduce_memory_floor: read it, stage
the peer's half, read the peer's half of mine, write my reduced half into the tensor and into
staging, read and write the peer's reduced half), so busbw can reach at most 0.5x the memcpy
bandwidth (memcpy moves 2n); this staged round moves 4.5n (two_shot_memory_traffic: the reduced
half is copied into staging after it is written, n/2 more): 0.44x. Writing the reduced half to
both places in one pass would need a kernel with two outputs (torch has none; chunking the
copy to stay in cache measured no faster here: the 105 MiB L3 already holds it). 0.7x is
above the plain-tensor floor; only a tensor of dt.shm_empty's (zero-copy, floor 2.5n: 0.8x)
can reach it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dt import transport
from dt.collectives.ops import ReduceOp, finish, op_name, reduce_rows
from dt.collectives.registry import algorithm
from dt.collectives.scratch import scratch
from dt.cost import loadstore
from dt.layout import edges, rounds, split_sizes
from dt.transport import resolve_group
from dt.transport.shm.board import Round, memmove

_torch_threads = torch.get_num_threads  # 1: copies by memmove (board.py)


def _stage(stage: torch.Tensor, chunk: torch.Tensor, e: list[int], me: int, uniform: bool) -> None:
    """Copy what peers will read of `chunk` into this rank's staging (`stage`, in its dtype)."""
    if uniform:
        stage[:chunk.numel()].copy_(chunk)
    else:  # peers never read my own slice before it is reduced: skip it
        stage[:e[me]].copy_(chunk[:e[me]])
        stage[e[me + 1]:chunk.numel()].copy_(chunk[e[me + 1]:])


def _reduce_and_gather(call: Any, rnd: Any, chunk: torch.Tensor, e: list[int], me: int, name: str,
                       zero: bool, stage: torch.Tensor | None) -> None:
    """Steps 2 and 3 of a round, after sync A: reduce my slice, publish it, sync B, gather."""
    p, dtype, isz = len(e) - 1, chunk.dtype, chunk.element_size()
    uniform = p > 2
    mine = chunk[e[me]:e[me + 1]]
    if mine.numel():
        rows = rnd.rows(dtype, e[me], e[me + 1]) if uniform else None
        if isinstance(rows, torch.Tensor) and not zero:
            reduce_rows(mine, rows, name)
        elif isinstance(rows, torch.Tensor):  # my own row is my tensor: reduce aside
            tmp = scratch(mine.numel(), dtype, mine.device, slot=3)
            reduce_rows(tmp, rows, name)
            mine.copy_(tmp)
        else:  # my slice first (it is the output), then the others in rank order
            reduce_rows(mine, [mine] + [rnd.view(j, dtype)[e[me]:e[me + 1]]
                                        for j in range(p) if j != me], name)
        finish(mine, name, p)
        if stage is not None:
            stage[e[me]:e[me + 1]].copy_(mine)
    rnd.sync()  # B: every slice is reduced
    for j in range(p):
        if j != me:
            if e[j + 1] > e[j]:
                chunk[e[j]:e[j + 1]].copy_(rnd.view(j, dtype)[e[j]:e[j + 1]])
            call.count(j, sent=(e[j + 1] - e[j]) * isz, received=(e[me + 1] - e[me]) * isz)
            call.count(j, sent=(e[me + 1] - e[me]) * isz, received=(e[j + 1] - e[j]) * isz)


def prepare_all_reduce(g: Any, n: int, dtype: torch.dtype, op: str) -> Callable[[torch.Tensor], None] | None:
    """The one-round staged two-shot all-reduce of n elements with its views made once
    (dt.collectives.plan): per call the staging copies, four descriptor stores, two syncs, one
    reduction and the gather's copies. A tensor of dt.shm_empty's, this rank's or a peer's
    (published in place), sends the call down the general code. None where it takes rounds."""
    board, p, me = g.links.board, g.size, g.rank
    isz = dtype.itemsize
    if board is None or p == 1 or n == 0 or n * isz > board.capacity or (2 * board.capacity) % isz:
        return None
    call = board.call("all_reduce", "two_shot")
    e = edges(split_sizes(n, p))
    uniform = p > 2
    lo, hi = e[me], e[me + 1]
    stage = [board.staging(me, q).view(dtype) for q in (0, 1)]
    rows = [board.staged_rows(q, dtype, lo, hi) for q in (0, 1)]
    peers = [j for j in range(p) if j != me]
    theirs = [[(e[j], e[j + 1], board.staging(j, q).view(dtype)[e[j]:e[j + 1]])
               for j in peers if e[j + 1] > e[j]] for q in (0, 1)]  # slice j, reduced by rank j
    mine_of = [[board.staging(j, q).view(dtype)[lo:hi] for j in peers] for q in (0, 1)]
    # What peers read of this rank's buffer before the reduction: all of it (p > 2: the
    # uniform rows), else all but its own slice; the empty spans dropped (a copy is a call).
    spans = [(0, n)] if uniform else [(a, b) for a, b in ((0, lo), (hi, n)) if b > a]
    staged = [[(a, b, stage[q][a:b]) for a, b in spans] for q in (0, 1)]
    mine_staged = [stage[q][lo:hi] for q in (0, 1)]
    # memmove's (board.py, where torch runs one thread): (byte offset in the tensor, bytes,
    # staging address) of each copy, made once.
    staged_at = [[(a * isz, (b - a) * isz, to.data_ptr()) for a, b, to in staged[q]] for q in (0, 1)]
    theirs_at = [[(a * isz, (b - a) * isz, t.data_ptr()) for a, b, t in theirs[q]] for q in (0, 1)]
    mine_at = [t.data_ptr() for t in mine_staged]
    avg = op == "AVG"

    def run(flat: torch.Tensor) -> None:
        if board.allocations and board.find(flat) is not None:
            two_shot_all_reduce(flat, op, g)  # dt.shm_empty's: peers read it in place
            return
        q = board.publish_staged(n * isz)
        one, base = _torch_threads() == 1, flat.data_ptr()
        if one:
            for at, nbytes, to in staged_at[q]:
                memmove(to, base + at, nbytes)
        else:
            for a, b, to in staged[q]:
                to.copy_(flat[a:b])
        call.syncs, call.zero_copy = 0, False
        call.sync()  # A
        if not board.all_staged(q):  # a peer's tensor is read in place: the general round
            call.zero_copy = True
            _reduce_and_gather(call, Round(call, q), flat, e, me, op, False, stage[q])
            call.finish()
            return
        if hi > lo:
            mine = flat[lo:hi]
            reduce_rows(mine, rows[q] if uniform else [mine, *mine_of[q]], op)
            if avg:
                finish(mine, op, p)
            if one:
                memmove(mine_at[q], base + lo * isz, (hi - lo) * isz)
            else:
                mine_staged[q].copy_(mine)
        call.sync()  # B
        if one:
            for at, nbytes, theirs_j in theirs_at[q]:
                memmove(base + at, theirs_j, nbytes)
        else:
            for a, b, theirs_j in theirs[q]:
                flat[a:b].copy_(theirs_j)

    return run


@algorithm("all_reduce", "two_shot", shared_memory=True,
           traffic=loadstore.two_shot_all_reduce_traffic, formula=loadstore.two_shot_all_reduce,
           prepare=prepare_all_reduce)
def two_shot_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: object = None) -> None:
    """All-reduce in place: each rank reduces its 1/p slice from all buffers, then gathers."""
    g = resolve_group(group)
    name, p, me, flat = op_name(op), g.size, g.rank, tensor.view(-1)
    if p == 1 or flat.numel() == 0:
        return
    call = transport.board(g, "all_reduce", "two_shot")
    dtype, isz = flat.dtype, flat.element_size()
    zero = call.board.find(flat) is not None
    for lo, hi in rounds(flat.numel(), call.board.capacity // isz):
        rnd = call.round()
        chunk = flat[lo:hi]
        e = edges(split_sizes(hi - lo, p))
        stage = None
        if zero:
            rnd.publish(chunk)
        else:
            stage = rnd.staging().view(dtype)
            _stage(stage, chunk, e, me, p > 2)
            rnd.publish(None, nbytes=(hi - lo) * isz)
        rnd.sync()  # A: every buffer is published
        _reduce_and_gather(call, rnd, chunk, e, me, name, zero, stage)
    call.finish()  # C, when any rank's own tensor was read
