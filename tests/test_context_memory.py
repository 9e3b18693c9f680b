"""Context parallel's backward working set (dt.cost.context_backward) against dt.device_memory.LiveBytes,
and where dt plan adds it (dt.plan.memory)."""

from __future__ import annotations

import pytest
import torch

from dt.cost.activations import layer_activation_bytes, stage_activation_bytes
from dt.cost.context_backward import AttentionShape, context_backward_rank_bytes
from dt.layout import SequenceLayout
from dt.plan.cluster import catalogue_cluster, local_cluster
from dt.plan.layouts import Layout
from dt.plan.memory import peak_bytes
from dt.plan.model import ModelShape
from dt.plan.stage import stage_tensors

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float64": 8}
# (kind, sequences, heads, tokens per sequence, head_dim, zig-zag, dtype): even and uneven splits
# (37, 41 tokens), one head (its gradient arrives contiguous), one-token chunks (8 over 4 ranks)
CASES = {
    2: [("ring", 8, 4, 32, 16, False, "float32"), ("ring", 8, 4, 32, 16, True, "float64"),
        ("ring", 2, 8, 37, 4, True, "bfloat16"), ("ring", 4, 1, 32, 16, False, "float32"),
        ("ulysses", 8, 4, 32, 16, False, "float64"), ("ulysses", 2, 8, 37, 4, True, "float32"),
        ("ulysses", 3, 4, 24, 8, False, "bfloat16")],
    3: [("ring", 2, 6, 30, 8, True, "float32"), ("ring", 3, 12, 41, 4, False, "float64"),
        ("ulysses", 2, 6, 30, 8, False, "float32"), ("ulysses", 3, 12, 41, 4, True, "float64")],
    4: [("ring", 8, 4, 32, 16, True, "float32"), ("ring", 2, 8, 37, 4, False, "float64"),
        ("ring", 1, 4, 8, 16, True, "float32"), ("ulysses", 4, 4, 64, 16, False, "float32"),
        ("ulysses", 2, 8, 37, 4, True, "float64")],
}


def measured_backward(cases: list[tuple]) -> list[int]:
    """Each case's attention call as dt's GPT makes it (q, k, v views of one fused projection; the
    output transposed into a projection, whose backward makes the incoming gradient): the peak of
    live bytes in its backward above what the forward left, until q, k and v have gradients."""
    from dt.device_memory import LiveBytes
    from dt.parallel.context.layer import KINDS
    from dt.transport import resolve_group

    group = resolve_group(None)
    out = []
    for kind, sequences, heads, length, head_dim, zigzag, dtype in cases:
        layout = SequenceLayout(length, group.size, zigzag=zigzag)
        tokens, dtype_ = layout.size(group.rank), getattr(torch, dtype)
        gen = torch.Generator().manual_seed(group.rank)
        qkv = torch.randn(sequences, tokens, 3 * heads * head_dim, generator=gen, dtype=dtype_,
                          requires_grad=True)
        q, k, v = qkv.view(sequences, tokens, heads, 3 * head_dim).transpose(1, 2).chunk(3, dim=-1)
        projection = torch.randn(heads * head_dim, heads * head_dim, generator=gen, dtype=dtype_)
        grad = torch.randn(sequences, tokens, heads * head_dim, generator=gen, dtype=dtype_)
        with LiveBytes() as live:
            attended = KINDS[kind](q, k, v, group, layout, True)
            result = attended.transpose(1, 2).reshape(sequences, tokens, -1) @ projection
            del attended
            held = live.current
            live.reset_peak()
            torch.autograd.grad(result, (q, k, v), grad)
            out.append(live.peak - held)
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_working_set_is_the_measurement(run, world):
    cases = CASES[world]
    measured = run(world, measured_backward, cases, timeout=170)
    for i, (kind, sequences, heads, length, head_dim, zigzag, dtype) in enumerate(cases):
        shape = AttentionShape(sequences, heads, head_dim, ITEMSIZE[dtype])
        layout = SequenceLayout(length, world, zigzag=zigzag)
        predicted = [context_backward_rank_bytes(shape, layout, rank, kind) for rank in range(world)]
        assert predicted == [rank[i] for rank in measured], cases[i]  # to the byte, every rank


@pytest.mark.parametrize("sequences,heads,length,head_dim", [(8, 4, 32, 16), (3, 2, 16, 8), (1, 4, 4, 16)])
@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_at_two_ranks_peaks_at_its_last_hop(sequences, heads, length, head_dim, zigzag):
    """s_r no longer than d: the incoming gradient, its contiguous copy, delta, dq dk dv, hop 0's
    receive buffer, its block gradients, dkv, the last send and receive, and home: 18 q + lse."""
    layout = SequenceLayout(length, 2, zigzag=zigzag)
    for shape, blocks in ((AttentionShape(sequences, heads, head_dim, 4), 18),
                          (AttentionShape(sequences, 1, head_dim, 4), 17)):  # one head: no copy
        q, lse = shape.tokens(length // 2), shape.per_token(length // 2)
        assert [context_backward_rank_bytes(shape, layout, rank, "ring") for rank in (0, 1)] == \
            [blocks * q + lse] * 2


def test_ulysses_needs_whole_heads_per_rank():
    with pytest.raises(ValueError, match="whole heads"):
        context_backward_rank_bytes(AttentionShape(2, 6, 8, 4), SequenceLayout(16, 4), 0, "ulysses")
    with pytest.raises(ValueError, match="one of ring, ulysses"):
        context_backward_rank_bytes(AttentionShape(2, 4, 8, 4), SequenceLayout(16, 2), 0, "flash")


TINY = ModelShape(4, 4, 64, 44)


def test_the_plan_adds_it_at_the_top_blocks_attention_backward():
    """dp1.cp2ring, 16 x 32 tokens in 2 micro-batches: 8 sequences of 16 tokens a rank. At the top
    block's attention backward the head and the block's parts above the core are freed (the second
    norm's input, statistics and output, the MLP's two 4h tensors, the projection's input), the
    residual stream's gradient is in flight, and the working set is 18 q + lse; the second
    micro-batch's backward runs beside the first one's summed gradients (DDP over dp x cp's 2)."""
    e, b, s, h, heads = 4, 8, 16, 64, 4
    sbh, bs, f = e * s * b * h, b * s, 4 * h
    decoder = TINY.decoder(32)
    stash = stage_activation_bytes(decoder, range(TINY.n_layer + 2), b, e, cp=2)
    head = layer_activation_bytes(decoder, TINY.n_layer + 1, b, e, cp=2)
    above_core = sbh + 2 * e * bs + sbh + 2 * e * s * b * f + sbh
    working = 18 * sbh + e * b * heads * s
    layout = Layout(cp=2, micro_batches=2)
    accumulated = e * sum(stage_tensors(TINY, layout, 32, 0).dense)
    memory = peak_bytes(local_cluster(2), TINY, layout, 16, 32)[0]
    assert memory["activations"] == stash + accumulated - head - above_core + sbh + working


def test_only_a_stack_running_dt_s_own_layers_pays_it(monkeypatch):
    """Fused ring-flash kernels (Megatron's) hold tiles, not score blocks: dt's working set is priced
    for a stack whose context-parallel attention is dt's, on this machine or dt train on a GPU."""
    import dt.plan.memory as memory

    def refused(*args: object) -> int:
        raise AssertionError("priced")

    monkeypatch.setattr(memory, "context_backward_peak_bytes", refused)
    layout = Layout(dp=2, cp=2, micro_batches=2)
    peak_bytes(catalogue_cluster("h100", 1, 4, stack_name="megatron"), TINY, layout, 16, 32)
    for cluster in (local_cluster(4), catalogue_cluster("h100", 1, 4)):
        with pytest.raises(AssertionError, match="priced"):
            peak_bytes(cluster, TINY, layout, 16, 32)


def test_only_dt_s_ddp_holds_an_accumulated_gradient_twice():
    """dt's DDP keeps its buckets apart from .grad (gradient accumulation sums in .grad beside them);
    Megatron's accumulates in its contiguous gradient buffer, once."""
    from dt.plan.memory import _accumulated

    tensors = stage_tensors(TINY, Layout(dp=2, micro_batches=2), 32, 0)
    for cluster, twice in ((local_cluster(2), True), (catalogue_cluster("h100", 1, 2), True),
                           (catalogue_cluster("h100", 1, 2, stack_name="megatron"), False)):
        held = _accumulated(cluster, TINY, Layout(dp=2, micro_batches=2), 2, tensors)
        assert held == ((sum(tensors.dense) * cluster.grad_itemsize,) if twice else None), cluster.stack_name
        for nothing_twice in (Layout(dp=2, micro_batches=1), Layout(dp=2, micro_batches=2, zero=1)):
            assert _accumulated(cluster, TINY, nothing_twice, 2, tensors) is None  # nothing summed; no DDP
