"""Ulysses and ring attention against plain attention over the whole sequence, at cp 1 to 4.

The twin is textbook attention, softmax(q k^T / sqrt(d)) v with a triangular
mask, on the full [b, H, S, d] tensors in position order, built from the same
seed on every rank. Each rank takes its tokens as dt.layout.SequenceLayout
places them (zig-zag and contiguous; lengths that do not divide by cp or
2 cp; fewer tokens than 2 cp, so some chunks are empty), runs context-parallel
attention and backward, and compares its output and its q, k, v gradients,
in float64, with the twin's rows at its positions. The traffic equals
dt.cost's per-rank count, forward and backward; and the layers, like the
collectives in test_nccl_rules.py, run as on NCCL and their posted batches
replay without deadlock.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost
from dt.layout import SequenceLayout
from dt.parallel.context import attention, ring_attention, ulysses_attention
from dt.parallel.expert import ShardedMoE
from dt.transport import rules, set_validation, validation_enabled
from tests.twins import whole_attention

F64 = torch.float64
B, HEADS, D = 2, 12, 3  # 12 heads divide by 1, 2, 3 and 4


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _counts(t) -> tuple[int, int, int, int]:
    return (t.bytes_sent, t.bytes_received, t.messages_sent, t.messages_received)


def _model(m) -> tuple[int, int, int, int]:
    return (m.bytes_sent, m.bytes_received, m.messages_sent, m.messages_received)


KINDS = {"ring": (ring_attention, "ring_attention", cost.ring_attention_traffic),
         "ulysses": (ulysses_attention, "ulysses", cost.ulysses_traffic)}


def _check_attention(lengths: list[int]) -> list[str]:
    r, p = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    validating = validation_enabled()
    set_validation(False)  # the layers' own traffic only
    for n, S in enumerate(lengths):
        q, k, v, g = (_randn(B, HEADS, S, D, seed=4 * n + i) for i in range(4))
        for causal in (True, False):
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            want = whole_attention(*leaves, causal)
            (want * g).sum().backward()
            for zigzag in (True, False):
                layout = SequenceLayout(S, p, zigzag)
                pos = torch.tensor(layout.positions(r), dtype=torch.int64)
                for kind, (fn, collective, model) in KINDS.items():
                    tag = f"{kind} S={S} cp={p} causal={causal} zigzag={zigzag}"
                    mine = [t[:, :, pos].clone().requires_grad_(True) for t in (q, k, v)]
                    with dt.traffic() as fwd:
                        out = fn(*mine, layout=layout, causal=causal)
                    with dt.traffic() as bwd:
                        (out * g[:, :, pos]).sum().backward()
                    for name, got, ref in (("out", out, want[:, :, pos]),
                                           *((f"d{x}", m.grad, leaf.grad[:, :, pos])
                                             for x, m, leaf in zip("qkv", mine, leaves))):
                        if not torch.allclose(got, ref, atol=1e-12, rtol=1e-10):
                            bad.append(f"rank {r} {tag} {name}: {(got - ref).abs().max().item()}")
                    model_f, model_b = model(layout.sizes(), B, HEADS, D, 8, r)
                    for what, t, m in (("forward", fwd, model_f), ("backward", bwd, model_b)):
                        if _counts(t.by_collective[collective]) != _model(m) or \
                                t.bytes_sent != m.bytes_sent:
                            bad.append(f"rank {r} {tag} {what} traffic "
                                       f"{_counts(t.by_collective[collective])} != model {_model(m)}")
    set_validation(validating)
    return bad


@pytest.mark.parametrize("world, lengths", [(1, [5]), (2, [8, 7, 3]), (3, [12, 7, 4]), (4, [16, 11, 5])])
def test_context_parallel_attention_matches_whole_sequence_attention(run, world, lengths):
    failures = [f for res in run(world, _check_attention, lengths) for f in res]
    assert not failures, "\n".join(failures[:20])


def _ulysses_refuses_heads() -> str:
    q = torch.zeros(1, 5, 4, 2, dtype=F64)
    try:
        ulysses_attention(q, q, q)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("world", [2, 3])
def test_ulysses_refuses_heads_that_do_not_divide(run, world):
    for rank, msg in enumerate(run(world, _ulysses_refuses_heads)):
        assert f"rank {rank}" in msg and "5 heads do not divide" in msg and "ring attention" in msg


def test_block_attention_on_one_rank_matches_thewhole_attention():
    """The block arithmetic alone: chunked masks out of position order, online merge."""
    S = 9
    q, k, v, g = (_randn(B, 2, S, D, seed=i) for i in range(4))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = whole_attention(*leaves, True)
    (want * g).sum().backward()
    chunks = [(6, 9), (0, 2), (2, 6)]  # any order of consecutive-position chunks
    pos = torch.tensor([i for a, z in chunks for i in range(a, z)])
    mine = [t[:, :, pos].clone().requires_grad_(True) for t in (q, k, v)]
    out = attention(*mine, chunks, chunks, causal=True)
    (out * g[:, :, pos]).sum().backward()
    assert torch.allclose(out, want[:, :, pos], atol=1e-12)
    for m, leaf in zip(mine, leaves):
        assert torch.allclose(m.grad, leaf.grad[:, :, pos], atol=1e-12)


def test_ring_and_ulysses_cost_closed_forms():
    """Even split: Ulysses 4 (cp-1)/cp n each way; ring 2 (cp-1) n forward, 4 (cp-1) n backward."""
    for cp in (2, 3, 4, 8):
        S = 4 * cp
        n = B * (S // cp) * HEADS * D * 4 if HEADS % cp == 0 else None
        sizes = SequenceLayout(S, cp).sizes()
        ring_f, ring_b = cost.ring_attention_traffic(sizes, B, HEADS, D, 4, 0)
        nr = B * (S // cp) * HEADS * D * 4
        assert (ring_f.bytes_sent, ring_b.bytes_sent) == (2 * (cp - 1) * nr, 4 * (cp - 1) * nr)
        assert (ring_f.messages_sent, ring_b.messages_sent) == (cp - 1, cp)
        if n is not None:
            uly_f, uly_b = cost.ulysses_traffic(sizes, B, HEADS, D, 4, 0)
            assert uly_f.bytes_sent == uly_b.bytes_sent == 4 * (cp - 1) * n // cp


# ---------------------------------------------------------------------------
# NCCL's rules: the layers' posted batches replay on one in-order stream per group.
# ---------------------------------------------------------------------------


def _layers_under_nccl_rules() -> dict[str, tuple[bool, dict]]:
    """On the torch wire: NCCL's all-to-all is point-to-point, not the shared-memory board's
    loads and stores, and the rules are about its sends and receives."""
    from dt.bench.harness import wire_group

    r, p = dist.get_rank(), dist.get_world_size()
    g = wire_group("torch")
    out = {}
    layout = SequenceLayout(4 * p + 1, p, zigzag=True)
    pos = torch.tensor(layout.positions(r), dtype=torch.int64)
    q, k, v = (_randn(1, 2 * p, 4 * p + 1, 2, seed=i)[:, :, pos].requires_grad_(True) for i in range(3))
    for name, fn in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        with rules.recording() as rec:
            fn(q, k, v, group=g, layout=layout).sum().backward()
        out[name] = (bool(torch.isfinite(q.grad).all()), rec.take())
    torch.manual_seed(0)
    moe = ShardedMoE(4, 6, num_experts=p + 1, top_k=2, capacity_factor=1.0, group=g, dtype=F64)
    x = _randn(2, 5, 4, seed=r).requires_grad_(True)
    with rules.recording() as rec:
        moe(x).sum().backward()
    out["moe"] = (bool(torch.isfinite(x.grad).all()), rec.take())
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_layers_are_deadlock_free_under_nccl_rules(run, world):
    results = run(world, _layers_under_nccl_rules)
    failures = []
    for name in results[0]:
        if not all(res[name][0] for res in results):
            failures.append(f"{name}: non-finite gradients")
        traces = [res[name][1] for res in results]
        if not any(t["batches"] for t in traces):
            failures.append(f"{name}: recorded nothing")
        failures += [f"{name}: {problem}" for problem in rules.simulate(traces)]
    assert not failures, "\n".join(failures[:20])


def _layer_against_whole_sequence(S: int) -> list[str]:
    """ContextParallelSelfAttention (cp = world, tp = 1) against ParallelSelfAttention on whole sequences."""
    from dt.parallel.context import ContextParallelSelfAttention
    from dt.parallel.grid import Grid
    from dt.parallel.tensor import ParallelSelfAttention

    grid = Grid({"cp": dist.get_world_size(), "tp": 1})
    tp_group, cp_group = grid.group("tp"), grid.group("cp")
    layout = SequenceLayout(S, grid.size("cp"), zigzag=True)
    pos = torch.tensor(layout.positions(grid.coords()["cp"]), dtype=torch.int64)
    x = _randn(B, S, 4 * HEADS, seed=7)
    torch.manual_seed(0)
    whole = ParallelSelfAttention(4 * HEADS, HEADS, tp_group, dtype=F64)
    whole(x).sum().backward()
    bad = []
    for kind in ("ring", "ulysses"):
        torch.manual_seed(0)  # the same seed: the same weights as the whole-sequence layer
        layer = ContextParallelSelfAttention(4 * HEADS, HEADS, tp_group, cp_group, layout, kind, dtype=F64)
        out = layer(x[:, pos])
        out.sum().backward()
        want = whole(x)[:, pos]
        if not torch.allclose(out, want, atol=1e-12, rtol=1e-10):
            bad.append(f"{kind} out: {(out - want).abs().max().item()}")
        for (name, p), ref in zip(layer.named_parameters(), whole.parameters()):
            g = p.grad.clone()
            dt.all_reduce(g, group=cp_group)  # every rank's tokens' share of the gradient
            if not torch.allclose(g, ref.grad, atol=1e-12, rtol=1e-10):
                bad.append(f"{kind} d{name}: {(g - ref.grad).abs().max().item()}")
    return [f"rank {dist.get_rank()} S={S} {b}" for b in bad]


@pytest.mark.parametrize("world", [2, 3])
def test_context_parallel_layer_is_the_whole_sequence_layer(run, world):
    failures = [f for res in run(world, _layer_against_whole_sequence, 13) for f in res]
    assert not failures, "\n".join(failures[:20])
