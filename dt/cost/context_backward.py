"""Context parallel's backward working set: the bytes one attention call's backward holds at once.

    per = context_backward_peak_bytes(decoder, sequences=8, itemsize=4, tp=1, cp=2, kind="ring")

Ring attention and Ulysses keep no s^2 term for backward (dt.cost.activations), but their
backward itself holds many buffers at once, none of them kept from the forward; dt.plan.memory
adds them at the moment they peak. The figure is the most bytes live at once during one attention call's
backward above what it found (the forward's saved tensors), from its incoming gradient (the
output projection's input gradient, counted) until its q, k, v gradients are whole. Per cp
rank, Q = e b (a/t) s_r d bytes (one q of the rank's s_r tokens), L = Q / d (its lse), and a
block of scores e b (a/t) n_q n_k (n_q queries by the n_k keys they see):

ring (dt.parallel.context.ring_attention, hop by hop):
    incoming   the output's gradient, Q, which autograd holds until the backward returns
    dout       its contiguous copy, Q: dt's layers hand it back transposed (with one head the
               transpose moves nothing and there is no copy)
    delta      rowsum(dout * out), L, after a Q product
    dq dk dv   the running gradients, 3Q; the last hop's block gradients dq_b dk_b dv_b stay
               bound while the next hop's block_backward makes its own (3 blocks each)
    kv         k and v stacked, 2Q; from hop 0 on, the receive buffer they are read from
    send       a hop's one message: the held k/v block and, from hop 1, its dk/dv so far (2 or
               4 blocks), concatenated; the last hop's is freed only as the next is made
    recv       the next message, the same size, made while the last one is still read
    dkv        the stacked dk/dv of the block just processed, 2 blocks
    scores     per chunk of queries in each block_backward: q k^T, its scaled and masked copies,
               less the lse and exp (3 blocks of scores at once), then dout v^T less delta and ds
               (3 again, the probabilities kept), dq's and dk's products and their scaled
               copies, k and v concatenated when the chunk sees keys of two chunks (zig-zag),
               and the last chunk's probabilities, ds, dv_c and dk_c until their names are bound
               again
    masks      each hop's causal masks, one byte per query-key pair of a chunk pair the diagonal
               cuts, compared from int64 positions
    home       the last hop: dk + home[0] and dv + home[1], 2Q, before the old ones go
With cp = 2 and score blocks no bigger than q (s_r up to about d) the peak is the last hop:
incoming, dout, delta, dq dk dv, hop 0's receive buffer, its dq_b dk_b dv_b, dkv, the send and
receive buffers and home, 18 Q + L. From cp = 3 it is mostly a middle hop's block_backward: with
even blocks 21 Q + L before its scores, which grow as s_r / d; 20 to 34 Q in the tests' shapes.

Ulysses (dt.parallel.context.ulysses, node by node as torch's autograd engine runs them), F =
e b (a/t/cp) S d the gathered tensors (Q when the sequence splits evenly):
    output back  the incoming Q, each rank's heads of it flattened (copies, Q: the incoming goes
                 with its last view), concatenated (Q), exchanged (F), joined along the sequence
                 into dout (F)
    attention    delta and blocks.block_backward over the whole sequence on the rank's heads:
                 dq dk dv (3F) and the scores as above, a query chunk seeing up to S keys
    saved        the gathered q, k, v, the output and lse (4F + lse) go as the attention's node ends
    selects      dq, dk and dv each put into a zeroed [3, b, a/t/cp, S, d] (3F) and summed out of
                 place: 10F at once
    q, k, v back each rank's piece flattened (3F), concatenated (3F), exchanged (3Q), each rank's
                 heads put into a zeroed [3, b, a/t, s_r, d] (3Q) and summed out of place: up to
                 12 Q from cp = 3
The attention's scores, growing as s_r / d, usually hold the peak: 10 to 16 Q in the tests' shapes.

Both are replayed in the code's order, with Python's lifetimes (a temporary lives until its
expression ends, a name's value until the name is bound again, autograd's inputs until its node
returns): the figure is LiveBytes' measurement to the byte for any sequence of two or more tokens
(tests/test_context_memory.py). It is dt's own implementation's: fused ring-flash kernels hold
blocks of tiles, not of scores (dt.plan.memory prices it only where dt's own layers run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dt.cost.flops import Decoder
from dt.layout import SequenceLayout, ring_hop, visible

__all__ = ["CP_KINDS", "AttentionShape", "context_backward_peak_bytes", "context_backward_rank_bytes"]

CP_KINDS = ("ring", "ulysses")
MASK_INDEX_BYTES = 8  # the int64 positions a partial causal mask is compared from


class _Live:
    """Bytes a replayed backward holds now (above what it found) and at most, buffer by buffer."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def make(self, *sizes: int) -> None:
        for size in sizes:
            self.now += size
            self.peak = max(self.peak, self.now)

    def free(self, *sizes: int) -> None:
        self.now -= sum(sizes)


@dataclass(frozen=True)
class AttentionShape:
    """One rank's attention tensors [sequences, heads, tokens, head_dim] of itemsize bytes."""

    sequences: int
    heads: int
    head_dim: int
    itemsize: int

    def tokens(self, count: int) -> int:
        """Bytes of q, k, v, the output or a gradient over `count` tokens."""
        return self.itemsize * self.sequences * self.heads * count * self.head_dim

    def per_token(self, count: int) -> int:
        """Bytes of one number per head and token: the log-sum-exp, delta."""
        return self.itemsize * self.sequences * self.heads * count

    def scores(self, queries: int, keys: int) -> int:
        """Bytes of one block of scores: `queries` queries by the `keys` keys they see, every head."""
        return self.itemsize * self.sequences * self.heads * queries * keys

    def with_heads(self, heads: int) -> AttentionShape:
        """The same tensors with `heads` heads (Ulysses' rank, after its all-to-all: heads / cp)."""
        return AttentionShape(self.sequences, heads, self.head_dim, self.itemsize)


def _contiguous(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch's rule: each dim longer than one steps over everything after it (an empty tensor is)."""
    if 0 in sizes:
        return True
    expected = 1
    for size, stride in reversed(list(zip(sizes, strides))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _transposed_is_contiguous(shape: AttentionShape, heads: int, tokens: int) -> bool:
    """Is `heads` of the [b, tokens, H, d] gradient dt's layers hand back, seen as [b, heads,
    tokens, d] (attention's output layout), contiguous? Only when the transpose moves nothing."""
    d, total = shape.head_dim, shape.heads
    return _contiguous((shape.sequences, heads, tokens, d), (tokens * total * d, d, total * d, 1))


@dataclass(frozen=True)
class _QueryChunk:
    """A chunk of queries with something to see: its length, and each key chunk it sees
    (the key chunk's length and 'all' or 'some', dt.layout.visible)."""

    queries: int
    keys: tuple[tuple[int, str], ...]

    @property
    def seen(self) -> int:
        return sum(length for length, _ in self.keys)

    @property
    def masked(self) -> bool:
        return any(kind == "some" for _, kind in self.keys)

    @property
    def gathered(self) -> bool:
        """Keys of several chunks are concatenated (copied); one chunk's are a view."""
        return len(self.keys) > 1


def _block_plan(q_chunks: list[tuple[int, int]], k_chunks: list[tuple[int, int]],
                causal: bool) -> list[_QueryChunk]:
    """dt.parallel.context.blocks.plan's query chunks, by size."""
    out = []
    for q in q_chunks:
        seen = tuple((k[1] - k[0], kind) for k in k_chunks if (kind := visible(q, k, causal)) != "none")
        if seen:
            out.append(_QueryChunk(q[1] - q[0], seen))
    return out


def _make_masks(live: _Live, q_chunks: list[tuple[int, int]], k_chunks: list[tuple[int, int]],
                causal: bool) -> int:
    """blocks.plan's masks (one byte per query-key pair): per query chunk each visible key chunk's
    (compared from two int64 position ranges where the diagonal cuts it) and, where any is partial,
    their concatenation, which the plan keeps. The bytes kept."""
    kept = listed = 0
    for qa, qz in q_chunks:
        live.free(listed)  # the previous query chunk's list of masks
        listed, partial = 0, False
        for ka, kz in k_chunks:
            kind, pairs = visible((qa, qz), (ka, kz), causal), (qz - qa) * (kz - ka)
            if kind == "some":
                positions = MASK_INDEX_BYTES * (kz - ka), MASK_INDEX_BYTES * (qz - qa)
                live.make(*positions, pairs)
                live.free(*positions)
                partial = True
            elif kind == "all":
                live.make(pairs)
            listed += pairs if kind != "none" else 0
        if partial:
            live.make(listed)
            kept += listed
    live.free(listed)
    return kept


@dataclass(frozen=True)
class _ChunkBuffers:
    """What one query chunk of block_backward leaves bound until the next chunk binds its names again."""

    keys_copied: int  # kc and vc, each, when gathered from several key chunks
    scores: int  # probs and ds, each
    key_grads: int  # dv_c and dk_c, each


def _block_backward(live: _Live, shape: AttentionShape, queries: int, keys: int,
                    chunks: list[_QueryChunk]) -> int:
    """blocks.block_backward: the bytes of the dq, dk, dv it returns (left live)."""
    grads = shape.tokens(queries) + 2 * shape.tokens(keys)
    live.make(shape.tokens(queries), shape.tokens(keys), shape.tokens(keys))
    last = _ChunkBuffers(0, 0, 0)
    for chunk in chunks:
        scores, rows = shape.scores(chunk.queries, chunk.seen), shape.tokens(chunk.queries)
        key_rows = shape.tokens(chunk.seen)
        copied = key_rows if chunk.gathered else 0
        live.make(copied, copied)  # kc, vc
        live.free(last.keys_copied, last.keys_copied)
        _probabilities(live, shape, chunk, scores)
        live.free(last.scores)  # the last chunk's probs
        live.make(key_rows)  # dv_c = probs^T dout
        live.free(last.key_grads)
        live.make(scores, scores)  # dout v^T, less delta
        live.free(scores)
        live.make(scores)  # ds = probs * that
        live.free(scores, last.scores)  # the difference; the last chunk's ds
        live.make(rows, rows)  # dq's product ds k, scaled (added in place)
        live.free(rows, rows)
        live.make(key_rows, key_rows)  # dk_c: ds^T q, scaled
        live.free(key_rows, last.key_grads)
        last = _ChunkBuffers(copied, scores, key_rows)
    live.free(2 * last.keys_copied, 2 * last.scores, 2 * last.key_grads)
    return grads


def _probabilities(live: _Live, shape: AttentionShape, chunk: _QueryChunk, scores: int) -> None:
    """blocks._probs with the final lse: q k^T, scaled, masked, less the (finite) lse, exp. Leaves
    the probabilities live."""
    lse = shape.per_token(chunk.queries)
    live.make(scores, scores)  # q k^T, then / sqrt(d)
    live.free(scores)
    if chunk.masked:
        live.make(scores)
        live.free(scores)
    flags = lse // shape.itemsize  # isinf(lse): one byte each
    live.make(flags, lse, lse)  # _finite: the flags, zeros, the where
    live.free(flags, lse)
    live.make(scores)  # s - lse
    live.free(lse)
    live.make(scores)  # exp
    live.free(scores, scores)  # the difference, then s as _probs returns


def _ring_backward(live: _Live, shape: AttentionShape, layout: SequenceLayout, rank: int,
                   causal: bool) -> None:
    """ring_attention._RingAttention.backward, hop by hop."""
    parts, mine = layout.parts, layout.chunks(rank)
    tokens = layout.size(rank)
    block = shape.tokens(tokens)
    live.make(block)  # the incoming gradient, held by autograd's call until backward returns
    if not _transposed_is_contiguous(shape, shape.heads, tokens):
        live.make(block)  # dout.contiguous()
    live.make(block, shape.per_token(tokens))  # dout * out, then delta = its rowsum
    live.free(block)
    masks = _make_masks(live, mine, mine, causal)
    _block_backward(live, shape, tokens, tokens, _block_plan(mine, mine, causal))  # dq, dk, dv
    live.free(masks)
    kv = held = 2 * block  # k and v stacked, then read from the receive buffer `held` (+ dk/dv)
    live.make(held)
    send = dkv = hop_grads = 0  # the last hop's message, stacked dk/dv, and dq_b + dk_b + dv_b
    for hop in range(parts if parts > 1 else 0):
        carries_kv, carries_grad = hop <= parts - 2, hop >= 1
        _, incoming = ring_hop(rank, parts, hop)
        live.make(kv * carries_kv + dkv * carries_grad)  # send: the held block, its dk/dv so far
        live.free(send)
        send = kv * carries_kv + dkv * carries_grad
        one = 2 * shape.tokens(layout.size(incoming))
        recv = one * (int(carries_kv) + int(carries_grad))
        live.make(recv)
        if carries_kv:
            live.free(held)  # kv bound to the new buffer: the stack, or the last hop's buffer, goes
            kv, held = one, recv
            masks = _make_masks(live, mine, layout.chunks(incoming), causal)
            grads = _block_backward(live, shape, tokens, layout.size(incoming),
                                    _block_plan(mine, layout.chunks(incoming), causal))
            live.free(masks, hop_grads)  # the last hop's dq_b, dk_b, dv_b as the names are bound again
            hop_grads = grads
            live.make(one)  # dkv = stack(dk_b, dv_b), the others' added in place
            live.free(dkv)
            dkv = one
        else:  # home: dk + home[0], dv + home[1] before the old dk, dv go
            live.make(block, block)
            live.free(block, block)


def _ulysses_backward(live: _Live, shape: AttentionShape, layout: SequenceLayout, rank: int,
                      causal: bool) -> None:
    """ulysses_attention's backward, node by node as torch's autograd engine runs them; the
    forward's gathered q, k, v, output and lse go when the attention's node ends."""
    parts, tokens, length = layout.parts, layout.size(rank), layout.seq_len
    gathered = shape.with_heads(shape.heads // parts)  # [b, H / cp, S, d]
    mine, whole = shape.tokens(tokens), gathered.tokens(length)
    # the output's all-to-all: each rank's heads of the incoming (transposed) gradient flattened
    # (copies: the incoming goes with its last view), concatenated, exchanged back, and joined
    # along the sequence: the attention's dout
    live.make(mine)  # the incoming gradient
    if not _transposed_is_contiguous(shape, gathered.heads, tokens):
        live.make(mine)  # the flattened copies
        live.free(mine)  # the incoming, its last view copied
    live.make(mine)  # concatenated
    live.free(mine)  # the copies (or the incoming, when its views were flat already)
    live.make(whole)  # exchanged
    live.free(mine)  # the concatenation
    live.make(whole)  # dout: joined along the sequence
    live.free(whole)  # the exchanged
    # blocks._Attention.backward over the whole sequence on this rank's heads
    live.make(whole, gathered.per_token(length))  # dout * out, then delta
    live.free(whole)
    order = [chunk for r in range(parts) for chunk in layout.chunks(r)]
    _block_backward(live, gathered, length, length, _block_plan(order, order, causal))
    live.free(gathered.per_token(length), whole)  # delta, dout
    live.free(3 * whole, whole, gathered.per_token(length))  # saved: the gathered q, k, v, out, lse
    # dq, dk, dv each into a zeroed [3, b, H / cp, S, d] (select_backward), summed out of place
    for select in range(3):
        live.make(3 * whole)
        live.free(whole)  # its dq, dk or dv
        if select:
            live.make(3 * whole)  # the sum so far plus this one
            live.free(6 * whole)
    _qkv_all_to_all_backward(live, shape, gathered, layout, rank)


def _qkv_all_to_all_backward(live: _Live, shape: AttentionShape, gathered: AttentionShape,
                             layout: SequenceLayout, rank: int) -> None:
    """The gradient of the gathered q, k, v (3 whole, live) back to this rank's tokens: each rank's
    piece flattened (a copy: a slice along the sequence), concatenated, exchanged, and each rank's
    slice of heads put into a zeroed [3, b, H, s_r, d] (slice_backward), summed out of place."""
    parts, whole = layout.parts, gathered.tokens(layout.seq_len)
    mine = shape.tokens(layout.size(rank))
    live.make(*(3 * gathered.tokens(size) for size in layout.sizes()))  # each rank's piece, flat
    live.free(3 * whole)  # the gathered gradient, its last piece copied
    live.make(3 * whole)  # concatenated
    live.free(3 * whole)  # the pieces
    live.make(3 * mine)  # exchanged
    live.free(3 * whole)  # the concatenation
    live.make(3 * mine)  # the first rank's heads, zeroed around
    for peer in range(1, parts):
        live.make(3 * mine)
        if peer == parts - 1:
            live.free(3 * mine)  # the exchanged buffer, its last slice read
        live.make(3 * mine)  # the sum so far plus this one
        live.free(6 * mine)


def context_backward_rank_bytes(shape: AttentionShape, layout: SequenceLayout, rank: int, kind: str,
                                causal: bool = True) -> int:
    """The most bytes one context-parallel attention call's backward holds at once on cp rank
    `rank`, above what it found live (its forward's saved tensors, the incoming gradient): the
    module doc's terms, replayed in the code's order. `shape`: the rank's q [b, heads, s_r, d]
    with heads its tensor-parallel share (Ulysses splits them again over cp)."""
    if kind not in CP_KINDS:
        raise ValueError(f"context-parallel attention is one of {', '.join(CP_KINDS)}, got {kind!r}")
    if kind == "ulysses" and shape.heads % layout.parts:
        raise ValueError(f"Ulysses gives each of the {layout.parts} ranks whole heads: {shape.heads} "
                         "do not divide")
    live = _Live()
    replay = _ring_backward if kind == "ring" else _ulysses_backward
    replay(live, shape, layout, rank, causal)
    return live.peak


@functools.lru_cache(maxsize=1024)  # the planner asks for a few shapes over and over; cp 64 takes 0.5 s
def context_backward_peak_bytes(a: Decoder, sequences: int, itemsize: int, tp: int = 1, cp: int = 2,
                                kind: str = "ring") -> int:
    """context_backward_rank_bytes of dt's layers (each tensor-parallel rank's heads, dt train's
    zig-zag split of a.seq_len tokens) on the busiest cp rank."""
    shape = AttentionShape(sequences, a.n_head // tp, a.head_dim, itemsize)
    layout = SequenceLayout(a.seq_len, cp, zigzag=True)
    return max(context_backward_rank_bytes(shape, layout, rank, kind) for rank in range(cp))
