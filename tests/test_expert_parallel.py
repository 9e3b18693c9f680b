"""The expert-parallel MoE layer against an unsharded dense twin, at ep 1 to 4.

The twin (MoETwin) is written independently and plainly: it runs every
expert on every token and picks the outputs with masks, and places each
assignment in its sequence's priority order with Python loops. Both are
built right after the same seed; each rank of the group holds some of the
batch's sequences (uneven: ranks alternate 1 and 2 sequences), and the twin
holds them all. Checked on every rank, in float64: the output, the balance
loss of every sequence, the dropped-assignment count, the input gradient, the
router gradient (summed over ranks, as data parallel would) and every local
expert's gradient; and the bytes and messages the layer moves ("moe" in
dt.traffic()), forward and backward, equal dt.cost.moe_layer_traffic.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dt
from dt import cost
from dt.layout import SequenceLayout
from dt.parallel.expert import ShardedMoE
from dt.parallel.tensor import collective_bytes
from dt.transport import set_validation, validation_enabled
from tests.twins import MoETwin

F64 = torch.float64
H, FFN = 6, 10


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _counts(t) -> tuple[int, int, int, int]:
    return (t.bytes_sent, t.bytes_received, t.messages_sent, t.messages_received)


def _model(m) -> tuple[int, int, int, int]:
    return (m.bytes_sent, m.bytes_received, m.messages_sent, m.messages_received)


CASES = [  # (experts, top_k, capacity_factor)
    (5, 1, None), (5, 2, 1.0), (3, 2, 0.75), (4, 1, 0.5), (7, 2, None),
]


def _check_moe(cases: list[tuple[int, int, float | None]]) -> list[str]:
    """Every case on this rank; the group is the world (ep = world size)."""
    r, p = dist.get_rank(), dist.get_world_size()
    seqs = [1 + q % 2 for q in range(p)]  # uneven: 1, 2, 1, 2 sequences per rank
    lo, B, S = sum(seqs[:r]), sum(seqs), 7
    bad: list[str] = []
    validating = validation_enabled()
    set_validation(False)  # the layer's own traffic only (validation is checked elsewhere)

    def close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.shape != want.shape or not torch.allclose(got, want, atol=1e-10, rtol=1e-9):
            err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
            bad.append(f"rank {r} {name}: {err}")

    for n, (E, k, cf) in enumerate(cases):
        tag = f"E={E} k={k} cf={cf} ep={p}"
        torch.manual_seed(n)
        layer = ShardedMoE(H, FFN, E, k, cf, dtype=F64)
        torch.manual_seed(n)
        twin = MoETwin(H, FFN, E, k, cf)
        x, gy = _randn(B, S, H, seed=10 + n), _randn(B, S, H, seed=20 + n)
        c = 0.37  # weight of the balance loss
        xr = x[lo:lo + seqs[r]].clone().requires_grad_(True)
        with dt.traffic() as fwd:
            y = layer(xr)
        routing = layer.routing
        with dt.traffic() as bwd:
            ((y * gy[lo:lo + seqs[r]]).sum() + c * routing.aux_per_sequence.sum()).backward()
        xt = x.clone().requires_grad_(True)
        yt, aux_t, dropped_t = twin(xt)
        ((yt * gy).sum() + c * aux_t.sum()).backward()

        close(f"{tag} output", y, yt[lo:lo + seqs[r]])
        close(f"{tag} aux", routing.aux_per_sequence, aux_t[lo:lo + seqs[r]])
        close(f"{tag} input grad", xr.grad, xt.grad[lo:lo + seqs[r]])
        router_grad = layer.router.weight.grad.clone()
        dt.all_reduce(router_grad)  # the router is replicated: data parallel sums its gradient
        close(f"{tag} router grad", router_grad, twin.router.weight.grad)
        for i, expert in enumerate(layer.experts):
            ref = twin.experts[layer.first + i]
            for mine, want in ((expert.fc_in, ref[0]), (expert.fc_out, ref[2])):
                close(f"{tag} expert {layer.first + i} weight grad", mine.weight.grad, want.weight.grad)
                close(f"{tag} expert {layer.first + i} bias grad", mine.bias.grad, want.bias.grad)
        dropped = torch.tensor([routing.stats["dropped"]])
        dt.all_reduce(dropped)
        if int(dropped) != dropped_t or (cf is None) != (dropped_t == 0):
            bad.append(f"{tag}: {int(dropped)} assignments dropped over the group, twin {dropped_t}")
        plan = layer.plan
        model_f, model_b = cost.moe_layer_traffic(plan.send_rows, plan.recv_rows, plan.experts, H, 8, r)
        for name, t, m in (("forward", fwd, model_f), ("backward", bwd, model_b)):
            if _counts(t.by_collective["moe"]) != _model(m) or t.bytes_sent != m.bytes_sent:
                bad.append(f"{tag} {name} traffic {_counts(t.by_collective['moe'])} != model "
                           f"{_model(m)}")
    set_validation(validating)
    return bad


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_moe_matches_its_unsharded_twin(run, world):
    failures = [f for res in run(world, _check_moe, CASES) for f in res]
    assert not failures, "\n".join(failures[:20])


def _check_moe_context_parallel(cp: int, E: int, k: int, cf: float | None, S: int) -> list[str]:
    """ep = the world, tokens of each sequence spread (zig-zag) over cp ranks."""
    r, p = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group(list(range(i, i + cp))) for i in range(0, p, cp)]
    cp_group, c_rank, pair = groups[r // cp], r % cp, r // cp
    layout = SequenceLayout(S, cp, zigzag=True)
    pos = torch.tensor(layout.positions(c_rank), dtype=torch.int64)
    B = 2 * (p // cp)  # two sequences per cp group
    seq = slice(2 * pair, 2 * pair + 2)
    bad: list[str] = []
    torch.manual_seed(5)
    layer = ShardedMoE(H, FFN, E, k, cf, dtype=F64)
    torch.manual_seed(5)
    twin = MoETwin(H, FFN, E, k, cf)
    x, gy = _randn(B, S, H, seed=1), _randn(B, S, H, seed=2)
    xr = x[seq][:, pos].clone().requires_grad_(True)
    validating = validation_enabled()
    set_validation(False)
    with dt.traffic() as fwd:
        y = layer(xr, cp_group, layout)
    routing = layer.routing
    with dt.traffic() as bwd:
        ((y * gy[seq][:, pos]).sum() + routing.aux_per_sequence.sum()).backward()
    set_validation(validating)
    # the all-to-alls, plus the router's per-sequence statistics over the cp group:
    # an all-gather of the [2, E, k, 2 chunks] counts and an all-reduce of [2, E] probability sums
    plan = layer.plan
    model_f, model_b = cost.moe_layer_traffic(plan.send_rows, plan.recv_rows, plan.experts, H, 8, r)
    stats_f = collective_bytes("all_gather", 2 * E * k * 2, 8, cp_group) + \
        collective_bytes("all_reduce", 2 * E, 8, cp_group)
    stats_b = collective_bytes("all_reduce", 2 * E, 8, cp_group)
    if (fwd.by_collective["moe"].bytes_sent, bwd.by_collective["moe"].bytes_sent) != \
            (model_f.bytes_sent + stats_f, model_b.bytes_sent + stats_b):
        bad.append(f"rank {r} cp={cp}: moe bytes {fwd.by_collective['moe'].bytes_sent}, "
                   f"{bwd.by_collective['moe'].bytes_sent} != model {model_f.bytes_sent + stats_f}, "
                   f"{model_b.bytes_sent + stats_b}")
    xt = x.clone().requires_grad_(True)
    yt, aux_t, dropped_t = twin(xt)
    ((yt * gy).sum() + cp * aux_t.sum()).backward()  # every cp rank adds its sequences' loss
    checks = [("output", y, yt[seq][:, pos]), ("aux", routing.aux_per_sequence, aux_t[seq]),
              ("input grad", xr.grad, xt.grad[seq][:, pos])]
    router_grad = layer.router.weight.grad.clone()
    dt.all_reduce(router_grad)
    checks.append(("router grad", router_grad, twin.router.weight.grad))
    for i, expert in enumerate(layer.experts):
        checks.append((f"expert {layer.first + i}", expert.fc_in.weight.grad,
                       twin.experts[layer.first + i][0].weight.grad))
    for name, got, want in checks:
        if not torch.allclose(got, want, atol=1e-10, rtol=1e-9):
            bad.append(f"rank {r} cp={cp} E={E} k={k} cf={cf} S={S} {name}: "
                       f"{(got - want).abs().max().item()}")
    dropped = torch.tensor([routing.stats["dropped"]])
    dt.all_reduce(dropped)
    if int(dropped) != dropped_t:
        bad.append(f"cp={cp}: {int(dropped)} dropped over the group, twin {dropped_t}")
    return bad


@pytest.mark.parametrize("cp, E, k, cf, S", [(2, 3, 2, 0.75, 9), (4, 5, 1, 1.0, 11), (2, 4, 2, None, 6)])
def test_moe_with_sequences_split_over_a_context_parallel_group(run, cp, E, k, cf, S):
    """Capacity and the balance loss follow each whole sequence, wherever its chunks are."""
    failures = [f for res in run(4, _check_moe_context_parallel, cp, E, k, cf, S) for f in res]
    assert not failures, "\n".join(failures[:20])


def test_moe_cost_model_uniform_routing():
    """The closed form is the exact count when routing is even and nothing is dropped."""
    for ep, tokens, k, E in ((2, 8, 1, 4), (4, 12, 2, 8), (3, 9, 2, 6)):
        per_expert = tokens * k // E  # each rank sends per_expert rows to every expert
        held = [E // ep] * ep
        rows = [per_expert * n for n in held]
        for rank in range(ep):
            fwd, bwd = cost.moe_layer_traffic(rows, rows, held, H, 4, rank)
            token_a2a = cost.moe_all_to_all_bytes(tokens, H, k, ep, 4)
            counts = (E - E // ep) * cost.COUNT_ITEMSIZE
            assert fwd.bytes_sent == 2 * token_a2a + counts
            assert bwd.bytes_sent == 2 * token_a2a
            assert fwd.steps == 3 * (ep - 1) and bwd.steps == 2 * (ep - 1)
