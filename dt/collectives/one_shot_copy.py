"""One-shot data movement through shared memory: publish, one sync, copy from the peers.

The moving counterparts of dt.collectives.one_shot (same board, same rules:
only for a group on one host segment; staged rounds need no closing sync,
zero-copy ones end with one):

- all_gather: every rank publishes its block (in place when it lives in a
  shared allocation) and copies every peer's into its output;
- broadcast: the root publishes, every other rank copies;
- all_to_all, gather, scatter: every rank publishes, in its staging area, a
  table of how many elements it has for each peer this round, then the
  pieces themselves; each rank copies its piece out of each peer's area.
  Blocks larger than a round's share go in more rounds, for as long as any
  rank says (its descriptor's `more`) it has more: a rank cannot know its
  peers' block sizes, so the round count is agreed at every sync.

Cost: 1 sync per round; a rank reads exactly the bytes it receives, and is
read exactly the bytes it sends (dt.cost.one_shot_all_gather ...).
"""

from __future__ import annotations

from typing import Any

import torch

from dt import transport
from dt.collectives.registry import algorithm, tensor_forms
from dt.cost import loadstore
from dt.layout import TABLE_BYTES, rounds, table_elems
from dt.transport import resolve_group


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.numel() == b.numel()


def gather_blocks(call: Any, outputs: list[torch.Tensor], mine: torch.Tensor, me: int) -> None:
    """outputs[j] = rank j's `mine` for every j (blocks may differ in length)."""
    sizes = [o.numel() for o in outputs]
    dtype, isz = mine.dtype, mine.element_size()
    if not _same(outputs[me], mine):
        outputs[me].copy_(mine)
    for lo, hi in rounds(max(sizes), call.board.capacity // isz):
        rnd = call.round()
        a, b = min(lo, sizes[me]), min(hi, sizes[me])
        rnd.publish(mine[a:b])
        rnd.sync()
        for j, out in enumerate(outputs):
            if j != me:
                aj, bj = min(lo, sizes[j]), min(hi, sizes[j])
                if bj > aj:
                    out[aj:bj].copy_(rnd.view(j, dtype))
                call.count(j, sent=(b - a) * isz, received=(bj - aj) * isz)
    call.finish()


@algorithm("all_gather", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_all_gather_traffic, formula=loadstore.one_shot_all_gather)
def one_shot_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                        group: object = None) -> None:
    """tensor_list[j] = rank j's tensor, copied straight out of rank j's published buffer.

    Cost (dt.cost.one_shot_all_gather): 1 sync per round; (p-1)/p n read per rank (n = all).
    """
    g = resolve_group(group)
    outputs = [t.view(-1) for t in tensor_list]
    if g.size == 1:
        outputs[0].copy_(tensor.reshape(-1))
        return
    gather_blocks(transport.board(g, "all_gather", "one_shot"), outputs, tensor.reshape(-1), g.rank)


tensor_forms("one_shot", all_gather=one_shot_all_gather, shared_memory=True)


@algorithm("broadcast", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_broadcast_traffic, formula=loadstore.one_shot_broadcast)
def one_shot_broadcast(tensor: torch.Tensor, src: int, group: object = None) -> None:
    """The root publishes its tensor; every other rank copies it after one sync.

    Cost: 1 sync per round; every non-root rank reads n, the root is read (p-1) n.
    """
    g = resolve_group(group)
    root, flat, p = g.group_rank(src), tensor.view(-1), g.size
    if p == 1 or flat.numel() == 0:
        return
    call = transport.board(g, "broadcast", "one_shot")
    isz = flat.element_size()
    for lo, hi in rounds(flat.numel(), call.board.capacity // isz):
        rnd = call.round()
        rnd.publish(flat[lo:hi] if g.rank == root else None)
        rnd.sync()
        k = (hi - lo) * isz
        if g.rank != root:
            flat[lo:hi].copy_(rnd.view(root, flat.dtype))
            call.count(root, sent=0, received=k)
        else:
            for j in range(p):
                if j != root:
                    call.count(j, sent=k, received=0)
    call.finish()


def exchange(call: Any, sends: list[torch.Tensor | None], recvs: list[torch.Tensor | None],
             me: int, dtype: torch.dtype) -> None:
    """recvs[j] = rank j's sends[me], for every pair that has something (None: nothing).

    Each round a rank's staging holds [elements per peer (int64)] [piece for peer 0] ...
    with pieces of at most `table_elems` elements; rounds go on while any rank has more.
    """
    p, isz = len(sends), torch.empty(0, dtype=dtype).element_size()  # host: a size
    own_in, own_out = sends[me], recvs[me]
    if own_in is not None and own_out is not None and own_out.numel():
        own_out.copy_(own_in)
    per = table_elems(call.board.capacity, p, isz)
    lo = 0
    while True:
        hi = lo + per
        rnd = call.round()
        stage = rnd.staging()
        lens = [0] * p
        pos = TABLE_BYTES
        more = 0
        for j, t in enumerate(sends):
            if j == me or t is None or t.numel() <= lo:
                continue
            piece = t[lo:hi]
            lens[j] = piece.numel()
            stage[pos:pos + lens[j] * isz].view(dtype).copy_(piece)
            pos += lens[j] * isz
            more |= t.numel() > hi
        stage[:8 * p].view(torch.int64).copy_(torch.tensor(lens, dtype=torch.int64))  # host: shm
        rnd.publish(None, nbytes=pos, more=more)
        rnd.sync()
        for j, out in enumerate(recvs):
            if j == me:
                continue
            got = 0
            if out is not None:
                region = rnd.region(j)
                theirs = region[:8 * p].view(torch.int64).tolist()
                got = theirs[me]
                if got:
                    at = TABLE_BYTES + sum(theirs[:me]) * isz
                    out[lo:lo + got].copy_(region[at:at + got * isz].view(dtype))
            call.count(j, sent=lens[j] * isz, received=got * isz)
        if not rnd.any_more():
            break
        lo = hi


def _flat(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.reshape(-1)


@algorithm("all_to_all", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_all_to_all_traffic, formula=loadstore.one_shot_all_to_all)
def one_shot_all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor],
                        group: object = None) -> None:
    """output_list[j] on rank r = input_list[r] of rank j, each copied once out of rank j's area.

    Cost (dt.cost.one_shot_all_to_all): 1 sync per round; a rank reads what it receives.
    """
    g = resolve_group(group)
    outs = [t.view(-1) for t in output_list]
    if g.size == 1:
        outs[0].copy_(input_list[0].reshape(-1))
        return
    call = transport.board(g, "all_to_all", "one_shot")
    exchange(call, [_flat(t) for t in input_list], outs, g.rank, outs[0].dtype)


@algorithm("gather", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_gather_traffic, formula=loadstore.one_shot_gather)
def one_shot_gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int,
                    group: object = None) -> None:
    """Every rank publishes its tensor; the root copies each out. Cost: 1 sync per round."""
    g = resolve_group(group)
    root, p, me = g.group_rank(dst), g.size, g.rank
    if p == 1:
        gather_list[0].view(-1).copy_(tensor.reshape(-1))  # type: ignore[index]
        return
    sends: list[torch.Tensor | None] = [tensor.reshape(-1) if j == root else None for j in range(p)]
    recvs: list[torch.Tensor | None] = ([t.view(-1) for t in gather_list]  # type: ignore[union-attr]
                                        if me == root else [None] * p)
    exchange(transport.board(g, "gather", "one_shot"), sends, recvs, me, tensor.dtype)


@algorithm("scatter", "one_shot", shared_memory=True,
           traffic=loadstore.one_shot_scatter_traffic, formula=loadstore.one_shot_gather)
def one_shot_scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int,
                     group: object = None) -> None:
    """The root publishes every rank's piece; each copies its own. Cost: 1 sync per round."""
    g = resolve_group(group)
    root, p, me = g.group_rank(src), g.size, g.rank
    if p == 1:
        tensor.view(-1).copy_(scatter_list[0].reshape(-1))  # type: ignore[index]
        return
    sends: list[torch.Tensor | None] = ([t.reshape(-1) for t in scatter_list]  # type: ignore[union-attr]
                                        if me == root else [None] * p)
    recvs: list[torch.Tensor | None] = [tensor.view(-1) if j == root else None for j in range(p)]
    exchange(transport.board(g, "scatter", "one_shot"), sends, recvs, me, tensor.dtype)
