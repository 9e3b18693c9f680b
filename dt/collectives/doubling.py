"""Recursive doubling and halving: lg p steps instead of the ring's p-1.

Ranks pair up across distance d = 1, 2, 4, ...: rank v talks to v XOR d. After
the step at distance d every rank holds what its aligned group of 2d ranks
holds, so lg p steps cover the group.

- recursive doubling all-reduce: every step exchanges the whole buffer and
  reduces it. lg p steps, but n bytes per step: n lg p in all. Latency-optimal,
  for small messages.
- recursive doubling all-gather: every step exchanges everything gathered so
  far (a contiguous run of blocks), doubling it. lg p steps, (p-1)/p n bytes.
- Rabenseifner all-reduce: recursive *halving* reduce-scatter (distance p/2,
  p/4, ..., 1; each step sends the half of the current range the partner
  keeps and reduces the half it keeps itself), then recursive doubling
  all-gather of the reduced pieces. 2 lg p steps and 2(p-1)/p n bytes: the
  ring's bytes with the doubling's step count.

Group sizes that are not a power of two use MPICH's fold. With
p' = 2^floor(lg p) and e = p - p' extra ranks, the first 2e ranks pair up
(0,1), (2,3), ...: the even one sends its data to the odd one and sits out;
the p' remaining ranks run the power-of-two algorithm as virtual ranks
0..p'-1; at the end each odd rank sends the result back to its even partner.
That costs 2 more steps and about 2n more bytes on the critical path.

Virtual rank v stands for the original ranks [lo(v), lo(v+1)): two of them
for v < e, one otherwise. Those runs are contiguous, so in the all-gather
every exchange is one contiguous slice of the output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dt import cost
from dt.collectives.ops import ReduceOp, combine, finish, op_name
from dt.collectives.registry import algorithm, joined, tensor_forms
from dt.collectives.scratch import scratch
from dt.cost import levels, textbook
from dt.layout import Fold, doubling_gather, edges, halving_doubling, split_sizes
from dt.transport import RECV, SEND, Comm, Group, Handle, resolve_group, topology_of


def _send_or_none(t: torch.Tensor) -> torch.Tensor | None:
    return t if t.numel() else None


class Lookahead:
    """A step schedule's receives, posted before they are needed.

    gloo moves a message only once the receiver has asked for it: a send
    posted before the peer's receive waits until the peer's notice arrives and
    the sender's network thread wakes to act on it, which costs a scheduler
    wake-up (milliseconds on a loaded machine). Posting step k's receive
    while step k-1 or k-2 is still running lets every send go out at once.

    plan[k] = (peer, landing, scratch): `landing()` gives step k's receive
    buffer (None or empty: nothing to receive). A scratch landing reuses one of
    two buffers, so it is posted at most 2 steps ahead, after step k-2 was
    `release`d; other landings are final and are posted as soon as every
    earlier receive has been (gloo matches one peer's messages in posting order).

    Where receives may not be posted ahead (NCCL: comm.ahead is False), nothing
    is: `step` posts the step's send and receive as one batch instead.
    """

    def __init__(self, comm: Comm, plan: list[tuple[int, Callable[[], torch.Tensor | None], bool]]):
        self.comm, self.plan = comm, plan
        self.handles: dict[int, Handle | None] = {}
        self.posted = self.released = 0
        self._fill()

    def step(self, k: int, send: torch.Tensor | None, to: int) -> Handle | None:
        """Send `send` to `to` as step k and wait until step k's receive has landed.

        Returns the send's handle (None if nothing was sent): wait on it before
        changing what was sent.
        """
        send = send if send is not None and send.numel() else None
        if self.comm.ahead:
            sent = self.comm.isend(send, to) if send is not None else None
            self.wait(k)
            return sent
        peer, landing, _ = self.plan[k]
        t = landing()
        ops = ([(RECV, t, peer)] if t is not None and t.numel() else []) + \
              ([(SEND, send, to)] if send is not None else [])
        handles = self.comm.batch(ops)
        if t is not None and t.numel():
            handles.pop(0).wait()
        return handles[0] if handles else None

    def _fill(self) -> None:
        if not self.comm.ahead:
            return
        while self.posted < len(self.plan):
            peer, landing, uses_scratch = self.plan[self.posted]
            if uses_scratch and self.posted >= self.released + 2:
                break
            t = landing()
            self.handles[self.posted] = self.comm.irecv(t, peer) if t is not None and t.numel() else None
            self.posted += 1

    def wait(self, k: int) -> None:
        h = self.handles.pop(k, None)
        if h is not None:
            h.wait()

    def release(self, k: int) -> None:
        """Step k's landing has been consumed: its buffer may take step k+2's message."""
        self.released = k + 1
        self._fill()


# ---------------------------------------------------------------------------
# All-reduce
# ---------------------------------------------------------------------------


def _fold_in(comm: Comm, fold: Fold, flat: torch.Tensor, op: str) -> None:
    """Step 0 when p is not a power of two: even ranks of the first 2e hand their data over."""
    comm.step = 0
    if fold.vrank is None:
        comm.send(flat, fold.partner)
    else:
        landing = scratch(flat.numel(), flat.dtype, flat.device, slot=2)
        comm.recv(landing, fold.partner)
        combine(flat, flat, landing, op)


def _fold_out(comm: Comm, fold: Fold, flat: torch.Tensor, step: int) -> None:
    """Last step when p is not a power of two: odd ranks hand the result back."""
    comm.step = step
    if fold.vrank is None:
        comm.recv(flat, fold.partner)
    else:
        comm.send(flat, fold.partner)


@algorithm("all_reduce", "recursive_doubling", formula=textbook.recursive_doubling_all_reduce,
           levels=levels.recursive_doubling_all_reduce,
           traffic=lambda c: cost.recursive_doubling_all_reduce(c.n, c.itemsize, c.p, c.rank))
def recursive_doubling_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM,
                                  group: object = None) -> None:
    """All-reduce in place by recursive doubling (whole buffer exchanged each step).

    Cost (dt.cost.recursive_doubling_all_reduce): lg p' steps (+2 when p is
    not a power of two, p' = 2^floor(lg p)); n bytes sent per step, n lg p' in
    all, and n lg p' reduced. Every pair reduces the same two operands (in
    either order: the ops are commutative), so all ranks end bit-identical.
    """
    comm = Comm(resolve_group(group), "all_reduce", "recursive_doubling")
    name = op_name(op)
    flat = tensor.view(-1)
    p = comm.size
    if p == 1 or flat.numel() == 0:
        return
    fold = Fold(p, comm.rank, reverse=spans_hosts(comm.group))
    step = 1 if fold.extra else 0
    ahead = None
    if fold.vrank is not None:
        v, n = fold.vrank, flat.numel()
        slots = [scratch(n, flat.dtype, flat.device, slot=k) for k in range(min(2, fold.rounds))]
        partners = [fold.real(v ^ (1 << k)) for k in range(fold.rounds)]
        ahead = Lookahead(comm, [(partners[k], lambda k=k: slots[k % 2], True)
                                 for k in range(fold.rounds)])
    if fold.folded:
        _fold_in(comm, fold, flat, name)
    if ahead is not None:
        for k in range(fold.rounds):
            comm.step = step
            sent = ahead.step(k, flat, partners[k])
            if sent is not None:
                sent.wait()  # flat is about to change
            combine(flat, flat, slots[k % 2], name)
            ahead.release(k)
            step += 1
        finish(flat, name, p)
    else:
        step += fold.rounds
    if fold.folded:
        _fold_out(comm, fold, flat, step)


def spans_hosts(g: Group) -> bool:
    """Whether the group's ranks sit on more than one host (the all-reduces then reverse their
    partner order, dt.layout.Fold: the big steps inside a host)."""
    return g.size > 1 and topology_of(g).host_count > 1


@algorithm("all_reduce", "rabenseifner", formula=textbook.rabenseifner_all_reduce,
           levels=levels.rabenseifner_all_reduce,
           traffic=lambda c: cost.rabenseifner_all_reduce(c.n, c.itemsize, c.p, c.rank, c.spans_hosts))
def rabenseifner_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM,
                            group: object = None) -> None:
    """All-reduce in place: recursive-halving reduce-scatter + recursive-doubling all-gather.

    The buffer is cut into p' pieces (split_sizes(n, p')); virtual rank v ends
    the halving holding piece v reduced over all ranks, then the doubling
    hands every piece to everyone.

    Cost (dt.cost.rabenseifner_all_reduce): 2 lg p' steps (+2 when p is not
    a power of two); 2(p'-1)/p' n bytes sent per rank (+n for the fold), and
    (p'-1)/p' n reduced. On a group spanning hosts the partner order is
    reversed (dt.layout.Fold): the n/2 step inside a host, the n/p' one across.
    """
    comm = Comm(resolve_group(group), "all_reduce", "rabenseifner")
    name = op_name(op)
    flat = tensor.view(-1)
    p = comm.size
    if p == 1 or flat.numel() == 0:
        return
    fold = Fold(p, comm.rank, reverse=spans_hosts(comm.group))
    step = 1 if fold.extra else 0
    if fold.vrank is None:
        _fold_in(comm, fold, flat, name)  # hand the data over and wait for the result
        step += 2 * fold.rounds
    else:
        v, p2 = fold.vrank, fold.p2
        e = edges(split_sizes(flat.numel(), p2))

        def piece(a: int, b: int) -> torch.Tensor:  # pieces [a, b) as one slice
            return flat[e[a]:e[b]]

        # The first half kept is the largest piece of work (split_sizes puts the
        # longer pieces first), so buffers of that size serve every step.
        halves = [scratch(e[p2 // 2], flat.dtype, flat.device, slot=k) for k in range(2)]
        # The schedule (dt.layout.halving_doubling): halving steps (distance p'/2 .. 1)
        # keep the half holding piece v and receive the partner's copy of it into a
        # scratch buffer; doubling steps (distance 1 .. p'/2) receive the partner's
        # pieces in place.
        sched_halving, sched_doubling = halving_doubling(v, p2)
        halving = [(fold.real(s.peer), s.theirs, s.mine) for s in sched_halving]
        doubling = [(fold.real(s.peer), s.mine, s.theirs) for s in sched_doubling]
        plan = [(peer, lambda k=k, keep=keep: halves[k % 2][: e[keep[1]] - e[keep[0]]], True)
                for k, (peer, keep, _) in enumerate(halving)]
        plan += [(peer, lambda theirs=theirs: piece(*theirs), False) for peer, _, theirs in doubling]
        ahead = Lookahead(comm, plan)
        if fold.folded:
            _fold_in(comm, fold, flat, name)
        for k, (peer, keep, give) in enumerate(halving):  # recursive halving
            comm.step = step
            sent = ahead.step(k, piece(*give), peer)
            kept = piece(*keep)
            combine(kept, kept, halves[k % 2][: kept.numel()], name)
            if sent is not None:
                sent.wait()
            ahead.release(k)
            step += 1
        finish(piece(v, v + 1), name, p)
        for k, (peer, mine, _) in enumerate(doubling, start=len(halving)):  # recursive doubling
            comm.step = step
            sent = ahead.step(k, piece(*mine), peer)
            if sent is not None:
                sent.wait()
            step += 1
    if fold.folded:
        _fold_out(comm, fold, flat, step)


# ---------------------------------------------------------------------------
# All-gather
# ---------------------------------------------------------------------------


def doubling_all_gather_flat(comm: Comm, out: torch.Tensor, sizes: list[int]) -> None:
    """Recursive doubling all-gather into `out`, rank r's block (sizes[r] elements) in place.

    `out` is the concatenation of every rank's block in rank order; this rank's
    block must already be there. Blocks may differ in length.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    offsets = edges(sizes)
    fold = Fold(p, r)

    def span(first_rank: int, end_rank: int) -> torch.Tensor:
        return out[offsets[first_rank]:offsets[end_rank]]

    # Every step receives a part of `out` no one reads before it lands: post
    # all of them first (see Lookahead), then run the steps.
    steps = []
    if fold.vrank is not None:
        steps = [(fold.real(s.peer), span(fold.lo(s.mine[0]), fold.lo(s.mine[1])),
                  span(fold.lo(s.theirs[0]), fold.lo(s.theirs[1])))
                 for s in doubling_gather(fold.vrank, fold.p2)]
        ahead = Lookahead(comm, [(peer, lambda t=theirs: t, False) for peer, _, theirs in steps])
    step = 0
    if fold.extra:
        step = 1
        if fold.folded:
            comm.step = 0
            even = r if fold.vrank is None else fold.partner
            block = span(even, even + 1)
            if block.numel():
                if fold.vrank is None:
                    comm.send(block, fold.partner)
                else:
                    comm.recv(block, fold.partner)
    if fold.vrank is not None:
        for k, (peer, mine, _) in enumerate(steps):
            comm.step = step
            sent = ahead.step(k, mine, peer)
            if sent is not None:
                sent.wait()
            step += 1
    else:
        step += fold.rounds
    if fold.folded and out.numel():
        _fold_out(comm, fold, out, step)


@algorithm("all_gather", "recursive_doubling", formula=textbook.recursive_doubling_all_gather,
           levels=levels.recursive_doubling_all_gather,
           traffic=lambda c: cost.recursive_doubling_all_gather(c.blocks, c.itemsize, c.rank))
def recursive_doubling_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                                  group: object = None) -> None:
    """tensor_list[i] = rank i's tensor (entries may differ), by recursive doubling.

    The blocks are gathered in one flat buffer (so each step is one message):
    the entries themselves when they lie back to back (the tensor form's), else
    a buffer copied out. Cost (dt.cost.recursive_doubling_all_gather): lg p' steps
    (+2 when p is not a power of two); (p-1)/p n bytes sent per rank for a power
    of two, n = the sum of the entries.
    """
    comm = Comm(resolve_group(group), "all_gather", "recursive_doubling")
    sizes = [t.numel() for t in tensor_list]
    flat = joined([t.view(-1) for t in tensor_list])
    out = torch.empty(sum(sizes), dtype=tensor.dtype, device=tensor.device) if flat is None else flat
    parts = list(out.split(sizes))
    parts[comm.rank].copy_(tensor.reshape(-1))
    doubling_all_gather_flat(comm, out, sizes)
    if flat is None:
        for t, part in zip(tensor_list, parts):
            t.view(-1).copy_(part)


(recursive_doubling_all_gather_into_tensor,) = tensor_forms("recursive_doubling",
                                                            all_gather=recursive_doubling_all_gather)
