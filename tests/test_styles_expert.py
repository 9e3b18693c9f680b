"""ExpertParallel: the plain GPT's mixtures of experts swapped for dt.parallel.expert.ShardedMoE on ep.

Every rank builds the plain model and its parallelized twin from the same
seed (float64). The plain model runs the whole global batch; each rank of
the grid runs its dp slice of the sequences (and, under cp, its zig-zag
share of their tokens), then gradients are synchronised by the rule
dt.parallel.expert.style exports: dense ones averaged over dp x cp, experts
summed over "edp" and divided by dp x cp. The averaged loss, this rank's
logits, and every parameter and gradient (its slice, by name) must be the
plain model's. `against_plain` is shared with tests/test_styles_context.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dt.layout import edges, split_sizes
from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig
from dt.parallel.context.style import sequence_layout, shard_sequence
from dt.parallel.expert.style import EXPERT_GROUP, ExpertParallelMoE, dense_axes, split_parameters
from dt.parallel.grid import Grid
from dt.parallel.plan import gpt_plan, llama_plan, parallelize
from tests.test_parallelize import _shard_of

TOL = {"rtol": 0, "atol": 1e-12}
BASE = {"vocab_size": 21, "block_size": 10, "n_layer": 2, "n_head": 4, "n_embd": 16, "seed": 5,
        "dtype": "float64"}


def _sync(model: torch.nn.Module, grid: Grid, loss: torch.Tensor) -> torch.Tensor:
    """The step's rule: dense gradients averaged over dp x cp, experts summed over edp / (dp x cp)."""
    import dt

    dense, experts = split_parameters(model)
    plane = dense_axes(grid)
    if plane:
        for p in dense:
            dt.all_reduce(p.grad, op=dt.ReduceOp.AVG, group=grid.group(*plane))
        loss = loss.detach().clone()
        dt.all_reduce(loss, op=dt.ReduceOp.AVG, group=grid.group(*plane))
    for p in experts:
        dt.all_reduce(p.grad, op=dt.ReduceOp.SUM, group=grid.group(EXPERT_GROUP))
        p.grad.div_(grid.plane)
    return loss


MODELS = {"gpt": (GPT, GPTConfig, gpt_plan), "llama": (Llama, LlamaConfig, llama_plan)}


def against_plain(cfg: dict, sizes: dict, ep: int, plan_kw: dict, ids: torch.Tensor,
                  targets: torch.Tensor, labels: tuple[str, ...], kind: str = "gpt") -> list[str]:
    """What differs, on this rank, between the parallelized plain model and the plain one."""
    import dt

    rank, grid = dist.get_rank(), Grid(sizes, ep=ep)
    build, config, make_plan = MODELS[kind]
    plain, model = build(config(**cfg)), build(config(**cfg))
    names = set(model.state_dict())
    rng = torch.random.get_rng_state()
    parallelize(model, grid, make_plan(model.cfg, sizes.get("tp", 1), **plan_kw))
    bad = [] if torch.equal(rng, torch.random.get_rng_state()) else ["parallelize drew random numbers"]
    if not set(model.state_dict()) <= names:
        bad.append(f"new names: {sorted(set(model.state_dict()) - names)}")
    want_logits, want_loss = plain(ids, targets)
    want_loss.backward()
    dp, cp, at = sizes.get("dp", 1), sizes.get("cp", 1), grid.coords()
    rows = slice(at.get("dp", 0) * ids.shape[0] // dp, (at.get("dp", 0) + 1) * ids.shape[0] // dp)
    with dt.traffic() as t:
        logits, loss = model(shard_sequence(ids[rows], grid), shard_sequence(targets[rows], grid))
        loss.backward()
    loss = _sync(model, grid, loss)
    missing = [name for name in labels if t.by_collective[name].bytes_sent == 0]
    if missing:
        bad.append(f"no traffic under {missing}")
    positions = sequence_layout(ids.shape[1], cp).positions(at.get("cp", 0)) if cp > 1 else slice(None)
    want_logits = want_logits[rows][:, positions]
    if plan_kw.get("loss_parallel"):  # this rank's vocabulary slice
        e = edges(split_sizes(cfg["vocab_size"], sizes.get("tp", 1)))
        want_logits = want_logits[..., e[at.get("tp", 0)]:e[at.get("tp", 0) + 1]]
    for what, got, want in (("loss", loss, want_loss), ("logits", logits, want_logits)):
        if not torch.allclose(got, want, **TOL):
            bad.append(f"{what}: off by {(got - want).abs().max().item():.3g}")
    plain_params = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        owner_name, _, pname = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        want_w = _shard_of(plain_params[name].detach(), owner, pname, at.get("tp", 0))
        want_g = _shard_of(plain_params[name].grad, owner, pname, at.get("tp", 0))
        if p.shape != want_w.shape or not torch.equal(p.detach(), want_w):
            bad.append(f"{name}: weights are not the plain model's")
        elif p.grad is None or not torch.allclose(p.grad, want_g, **TOL):
            off = "none" if p.grad is None else f"{(p.grad - want_g).abs().max().item():.3g}"
            bad.append(f"{name}: gradient is not the plain model's (off by {off})")
    return [f"rank {rank} {kind} {sizes} ep={ep} {plan_kw}: {b}" for b in bad]


def _moe_layers(cfg: dict, sizes: dict, ep: int) -> list[object]:
    model = GPT(GPTConfig(**cfg))
    parallelize(model, Grid(sizes, ep=ep), gpt_plan(model.cfg, sizes.get("tp", 1)))
    moe = model.layers[1].mlp
    held = [int(n.split(".")[4]) for n in model.state_dict() if n.startswith("layers.1.mlp.experts.")]
    return [type(moe) is ExpertParallelMoE, moe.group.size, sorted(set(held))]


def _batch(seed: int, b: int, s: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (b, s + 1), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


CASES_2 = [({**BASE, "n_experts": 4, "top_k": 2, "capacity_factor": 1.0}, {"dp": 2}, 2)]
CASES_4 = [({**BASE, "n_experts": 4, "top_k": 1}, {"dp": 4}, 4),
           ({**BASE, "n_experts": 3, "top_k": 2, "capacity_factor": 1.25, "tied": False},
            {"dp": 2, "tp": 2}, 2),
           ({**BASE, "n_experts": 4, "top_k": 2, "aux_loss_coef": 0.3}, {"dp": 4}, 2)]
RECOMPUTED = ({**BASE, "n_experts": 4, "top_k": 2, "capacity_factor": 1.0}, {"dp": 2, "tp": 2}, 2)


def _cases(cases: list, ids: torch.Tensor, targets: torch.Tensor) -> list[str]:
    out = [b for cfg, sizes, ep in cases for b in against_plain(cfg, sizes, ep, {}, ids, targets, ("moe",))]
    if dist.get_world_size() == 4:  # the all-to-alls run again when the blocks are recomputed
        out += against_plain(*RECOMPUTED, {"recompute": True}, ids, targets, ("moe",))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world, cases", [(2, CASES_2), (4, CASES_4)])
def test_expert_parallel_gpt_is_the_plain_one(run, world, cases):
    ids, targets = _batch(0, 8, BASE["block_size"], BASE["vocab_size"])
    assert [b for r in run(world, _cases, cases, ids, targets, timeout=200) for b in r] == []


def test_expert_parallel_keeps_each_ranks_experts_by_global_name(run):
    cfg = {**BASE, "n_experts": 5, "top_k": 2}
    got = run(2, _moe_layers, cfg, {"dp": 2}, 2)
    assert got == [[True, 2, [0, 1, 2]], [True, 2, [3, 4]]]  # split_sizes(5, 2): 3, 2


def _refusals() -> list[str]:
    from dt.parallel.expert.style import ExpertParallel

    out = []
    model = GPT(GPTConfig(**{**BASE, "n_experts": 2}))
    for plan, sizes in (({"layers.1.attn": ExpertParallel()}, {"dp": 2}),
                        ({"layers.*.mlp": ExpertParallel()}, {"cp": 2})):
        try:
            parallelize(model, Grid(sizes), plan)
            out.append("accepted")
        except ValueError as e:
            out.append(str(e))
    return out


def test_expert_parallel_refuses_what_it_cannot_swap(run):
    got = run(2, _refusals)[0]
    assert got[0] == "layers.1.attn: ExpertParallel swaps a plain mixture of experts (dt.models.moe.MoE), " \
                     "found CausalSelfAttention"
    assert got[1].startswith("ExpertParallel on a grid with cp = 2 needs seq_len")
    with pytest.raises(ValueError, match="use sequence_parallel=False with n_experts"):
        gpt_plan(GPTConfig(n_experts=2), 2, sequence_parallel=True)


def _plain_and_parallel_moe(seed: int) -> list[str]:
    from dt.models.moe import MoE as PlainMoE
    from dt.parallel.expert import ShardedMoE

    torch.manual_seed(seed)
    plain = PlainMoE(8, 16, 5, top_k=2, capacity_factor=1.0, aux_loss_coef=0.0).double()
    torch.manual_seed(seed)
    layer = ShardedMoE(8, 16, 5, top_k=2, capacity_factor=1.0, group=dist.group.WORLD).double()
    bad = [n for n, p in layer.state_dict().items() if not torch.equal(p, plain.state_dict()[n])]
    x = torch.randn(3, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    y_plain, y = plain(x), layer(x)
    if not torch.equal(y, y_plain):  # the same operations in the same order
        bad.append(f"outputs off by {(y - y_plain).abs().max().item():.3g}")
    if not torch.equal(plain.balance.last, layer.routing.aux_per_sequence.detach()):
        bad.append("balance losses differ")
    if plain.counted != layer.counted or plain.counted["dropped"] == 0:
        bad.append(f"routing stats {plain.counted} vs {layer.counted}")
    (y_plain * x).sum().backward()
    (y * x).sum().backward()
    theirs = dict(plain.named_parameters())
    bad += [f"{n}: gradient differs" for n, p in layer.named_parameters()
            if not torch.equal(p.grad, theirs[n].grad)]
    return bad


def test_plain_moe_is_the_expert_layer_at_ep_1(run):
    assert run(1, _plain_and_parallel_moe, 4)[0] == []
