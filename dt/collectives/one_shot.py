"""One-shot reductions through shared memory: publish, one sync, read every peer's buffer.

Only for a group whose ranks all share one host segment (the group's board,
dt.transport.shm.board); nothing here sends a message. Each rank publishes
its input (a copy in its staging area, or the tensor itself when it lives in
a shared allocation), synchronises once, then loads what it needs straight
from its peers' memory and reduces it with one kernel:

- all_reduce: every rank reduces all p buffers into its own output (vLLM's
  and SGLang's one-shot all-reduce, DeepSpeed's "symmetric naive"): one
  synchronisation, but each rank reads all p n bytes: for small messages;
- reduce: only the root reads;
- reduce_scatter: rank r reduces block r of every buffer (the first half of
  the two-shot all-reduce, dt.collectives.two_shot);
- barrier: the synchronisation alone.

Every rank reduces in rank order (0, 1, ..., p-1), so all ranks compute the
same bits. A buffer larger than the staging area goes in rounds
(dt.layout.rounds); staging is double-buffered (board.py), so a staged call
needs no closing sync, and a call that read a peer's own tensor ends with
one (`finish`), because that tensor is the caller's again once it returns.

Cost (dt.cost.one_shot_all_reduce ...): 1 sync per round; bytes: what a rank
reads from peers ("received") and peers read from it ("sent").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dt import transport
from dt.collectives.ops import ReduceOp, finish, op_name, reduce_rows
from dt.collectives.registry import algorithm, joined, tensor_forms
from dt.collectives.scratch import scratch
from dt.cost import loadstore
from dt.layout import edges, rounds
from dt.transport import resolve_group
from dt.transport.shm.board import memmove

_torch_threads = torch.get_num_threads  # 1: copies by memmove (board.py)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte address a (possibly strided) tensor touches."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 if t.numel() else 0
    return t.data_ptr(), t.data_ptr() + last * t.element_size()


def _overlaps(a: torch.Tensor, rows: torch.Tensor | list[torch.Tensor]) -> bool:
    """Whether writing `a` could clobber memory the rows still read."""
    lo, hi = _span(a)
    for row in ([rows] if isinstance(rows, torch.Tensor) else rows):
        start, end = _span(row)
        if start < hi and lo < end:
            return True
    return False


def _reduce(out: torch.Tensor, rows: torch.Tensor | list[torch.Tensor], op: str, p: int) -> None:
    """out = the reduction of rows, through scratch when out is one of them."""
    if out.numel() == 0:
        return
    if _overlaps(out, rows):
        tmp = scratch(out.numel(), out.dtype, out.device, slot=3)
        reduce_rows(tmp, rows, op)
        out.copy_(tmp)
    else:
        reduce_rows(out, rows, op)
    finish(out, op, p)


def prepare_all_reduce(g: Any, n: int, dtype: torch.dtype, op: str) -> Callable[[torch.Tensor], None] | None:
    """The one-round one-shot all-reduce of n elements with its views made once (dt.collectives.plan):
    per call one copy into staging, four descriptor stores, one sync and one reduction.
    None where it would take more than one round."""
    board, p = g.links.board, g.size
    isz = dtype.itemsize
    if board is None or p == 1 or n == 0 or n * isz > board.capacity or (2 * board.capacity) % isz:
        return None
    call = board.call("all_reduce", "one_shot")  # what a failed sync's error names
    stage = [board.staging(g.rank, q)[:n * isz].view(dtype) for q in (0, 1)]
    stage_at = [t.data_ptr() for t in stage]  # memmove's (board.py): torch on one thread
    # Two ranks: the pair as two views made now (indexing a (2, n) view per call makes two);
    # more: one strided (p, n) view, one kernel.
    rows = [board.staged_rows(q, dtype, 0, n) for q in (0, 1)]
    rows = [list(r.unbind(0)) if p == 2 else r for r in rows]
    avg = op == "AVG"

    def run(flat: torch.Tensor) -> None:
        q = board.publish_staged(n * isz)
        if _torch_threads() == 1:
            memmove(stage_at[q], flat.data_ptr(), n * isz)
        else:
            stage[q].copy_(flat)
        call.syncs = 0
        call.sync()
        reduce_rows(flat, rows[q], op)
        if avg:
            finish(flat, op, p)

    return run


@algorithm("all_reduce", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_all_reduce_traffic, formula=loadstore.one_shot_all_reduce,
           prepare=prepare_all_reduce)
def one_shot_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: object = None) -> None:
    """Every rank copies its tensor into staging, syncs, and reduces all p copies into its own.

    Cost (dt.cost.one_shot_all_reduce): 1 sync per round; each rank reads (p-1) n bytes
    from its peers and copies n in. Always staged: reducing into its own tensor while
    peers read it would need a second sync, which costs more than the copy at these sizes.
    """
    g = resolve_group(group)
    name, p, flat = op_name(op), g.size, tensor.view(-1)
    if p == 1 or flat.numel() == 0:
        return
    call = transport.board(g, "all_reduce", "one_shot")
    isz = flat.element_size()
    for lo, hi in rounds(flat.numel(), call.board.capacity // isz):
        rnd = call.round()
        rnd.publish(flat[lo:hi], in_place=False)
        rnd.sync()
        reduce_rows(flat[lo:hi], rnd.rows(flat.dtype, 0, hi - lo), name)  # staged: never `flat`
        finish(flat[lo:hi], name, p)
        for j in range(p):
            if j != g.rank:
                call.count(j, sent=(hi - lo) * isz, received=(hi - lo) * isz)


@algorithm("reduce", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_reduce_traffic, formula=loadstore.one_shot_reduce)
def one_shot_reduce(tensor: torch.Tensor, dst: int, op: object = ReduceOp.SUM,
                    group: object = None) -> None:
    """Every rank publishes its tensor; the root reduces all p into its own after one sync.

    Cost: 1 sync per round; the root reads (p-1) n bytes, every other rank is read n.
    """
    g = resolve_group(group)
    name, p, flat = op_name(op), g.size, tensor.view(-1)
    root = g.group_rank(dst)
    if p == 1 or flat.numel() == 0:
        return
    call = transport.board(g, "reduce", "one_shot")
    isz = flat.element_size()
    for lo, hi in rounds(flat.numel(), call.board.capacity // isz):
        rnd = call.round()
        rnd.publish(flat[lo:hi], in_place=g.rank != root)
        rnd.sync()
        k = (hi - lo) * isz
        if g.rank == root:
            _reduce(flat[lo:hi], rnd.rows(flat.dtype, 0, hi - lo), name, p)
            for j in range(p):
                if j != root:
                    call.count(j, sent=0, received=k)
        else:
            call.count(root, sent=k, received=0)
    call.finish()


def _rs_rounds(sizes: list[int], per_round: int) -> list[tuple[int, int]]:
    """Rounds of a reduce-scatter: [lo, hi) of every block at once (p pieces per round)."""
    return rounds(max(sizes), max(1, per_round // len(sizes)))


def reduce_scatter_blocks(call: Any, output: torch.Tensor, blocks: list[torch.Tensor],
                          whole: torch.Tensor | None, op: str, rank: int) -> None:
    """Reduce-scatter over the board: output = reduction over ranks of block `rank`.

    Each round publishes elements [lo, hi) of every block: in place when `whole`
    (the blocks as one tensor) lives in a shared allocation, else copied into
    staging piece after piece. Readers find a peer's piece from its descriptor.
    """
    p = len(blocks)
    sizes = [b.numel() for b in blocks]
    dtype, isz = output.dtype, output.element_size()
    start = edges(sizes)
    out = output.view(-1)
    for lo, hi in _rs_rounds(sizes, call.board.capacity // isz):
        rnd = call.round()
        pieces = [(min(lo, s), min(hi, s)) for s in sizes]
        offsets = edges([b - a for a, b in pieces])
        if whole is not None and call.board.find(whole) is not None:
            rnd.publish(whole)  # zero-copy: peers read the blocks where they are
        else:
            stage = rnd.staging().view(dtype)
            for j, (a, b) in enumerate(pieces):
                if b > a:
                    stage[offsets[j]:offsets[j + 1]].copy_(blocks[j].view(-1)[a:b])
            rnd.publish(None, nbytes=offsets[-1] * isz)
        rnd.sync()
        a, b = pieces[rank]
        if b > a:
            # Where block `rank`'s piece sits in rank j's region: in its whole input
            # (published in place) or among the staged pieces.
            at = [start[rank] + a if rnd.in_place(j) else offsets[rank] for j in range(p)]
            rows = (rnd.rows(dtype, at[0], at[0] + b - a) if len(set(at)) == 1
                    else [rnd.view(j, dtype)[at[j]:at[j] + b - a] for j in range(p)])
            _reduce(out[a:b], rows, op, p)
        for j in range(p):
            if j != rank:
                aj, bj = pieces[j]
                call.count(j, sent=(bj - aj) * isz, received=(b - a) * isz)
    call.finish()


@algorithm("reduce_scatter", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_reduce_scatter_traffic, formula=loadstore.one_shot_reduce_scatter)
def one_shot_reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor],
                            op: object = ReduceOp.SUM, group: object = None) -> None:
    """Rank r reduces block r of every rank's input_list (blocks may differ in length).

    Cost (dt.cost.one_shot_reduce_scatter): 1 sync per round; rank r reads its block from
    p-1 peers and is read every other block: (p-1)/p n each way for even blocks.
    """
    g = resolve_group(group)
    name = op_name(op)
    if g.size == 1:
        output.view(-1).copy_(input_list[0].reshape(-1))
        finish(output, name, 1)
        return
    call = transport.board(g, "reduce_scatter", "one_shot")
    blocks = [t.reshape(-1) for t in input_list]
    reduce_scatter_blocks(call, output, blocks, joined(blocks), name, g.rank)


tensor_forms("one_shot", reduce_scatter=one_shot_reduce_scatter, shared_memory=True)


@algorithm("barrier", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_barrier_traffic, formula=loadstore.one_shot_barrier)
def one_shot_barrier(group: object = None) -> None:
    """Every rank arrives and waits for all: one sync, no data. Cost: 1 sync."""
    g = resolve_group(group)
    if g.size > 1:
        transport.board(g, "barrier", "one_shot").sync()
