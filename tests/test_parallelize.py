"""dt.parallelize: a plain model's modules swapped for tensor-parallel styles by a plan.

At world 2 the parallelized GPT and Llama (tied and untied heads) must compute
the plain model's logits and loss, and every rank's gradient must be its slice
of the plain model's, in float64; every rank holds fewer parameters than the
plain model and the tensor-parallel all-reduces ran. Bad plans are refused
in one line before anything is swapped.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dt.layout import edges
from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig
from dt.parallel.grid import Grid
from dt.parallel.plan import gpt_plan, llama_plan, parallelize
from dt.parallel.tensor import ColwiseParallel, RowwiseParallel, VocabParallel

TOL = {"rtol": 0, "atol": 1e-12}


def _build(kind: str, cfg: dict) -> tuple[nn.Module, object]:
    if kind == "gpt":
        c = GPTConfig(**cfg)
        return GPT(c), c
    c = LlamaConfig(**cfg)
    return Llama(c), c


def _shard_of(full: torch.Tensor, owner: nn.Module, pname: str, rank: int) -> torch.Tensor:
    """The slice of a plain tensor that a parallel layer's parameter holds on `rank`."""
    dim = getattr(owner, "shard_dims", {}).get(pname)
    if dim is None:
        return full
    e = edges(owner.sizes)
    return full.narrow(dim, e[rank], e[rank + 1] - e[rank])


def _against_plain(kind: str, cfg: dict, sp: bool, ids: torch.Tensor, targets: torch.Tensor) -> list[str]:
    import dt

    rank = torch.distributed.get_rank()
    plain, c = _build(kind, cfg)
    model, _ = _build(kind, cfg)
    grid = Grid({"tp": 2})
    plan = gpt_plan(c, 2, sequence_parallel=sp) if kind == "gpt" else llama_plan(c, 2)
    names = sorted(model.state_dict())
    parallelize(model, grid, plan)
    bad = []
    if sorted(model.state_dict()) != names:
        bad.append(f"names changed: {sorted(set(model.state_dict()) ^ set(names))}")
    if not sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in plain.parameters()):
        bad.append("no parameter was split")
    want_logits, want_loss = plain(ids, targets)
    want_loss.backward()
    with dt.traffic() as t:
        logits, loss = model(ids, targets)
        loss.backward()
    if t.bytes_sent == 0:
        bad.append("no tensor-parallel communication ran")
    for what, got, want in (("logits", logits, want_logits), ("loss", loss, want_loss)):
        if not torch.allclose(got, want, **TOL):
            bad.append(f"{what}: off by {(got - want).abs().max().item():.3g}")
    plain_params = dict(plain.named_parameters())
    for name, p in model.named_parameters():
        owner_name, _, pname = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        want_w = _shard_of(plain_params[name].detach(), owner, pname, rank)
        want_g = _shard_of(plain_params[name].grad, owner, pname, rank)
        if p.shape != want_w.shape or not torch.equal(p.detach(), want_w):
            bad.append(f"{name}: weights are not the plain model's slice")
        elif p.grad is None or not torch.allclose(p.grad, want_g, **TOL):
            bad.append(f"{name}: gradient is not the plain model's slice")
    if getattr(c, "tied", False):
        head = model.layers[-1].weight if kind == "gpt" else model.lm_head.weight
        embedding = model.layers[0].wte.weight if kind == "gpt" else model.embed_tokens.weight
        if head is not embedding:
            bad.append("the tied head's weight is no longer the embedding's")
    if sp and not any(type(m).__name__ == "SequenceParallelLayerNorm" for m in model.modules()):
        bad.append("sequence parallel left the layer norms whole")
    return [f"rank {rank} {kind} sp={sp} {cfg}: {b}" for b in bad]


TIED = {"vocab_size": 23, "block_size": 8, "n_layer": 2, "n_head": 4, "n_embd": 16, "tied": True,
        "seed": 1, "dtype": "float64"}
UNTIED = {"vocab_size": 24, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16, "tied": False,
          "seed": 2, "dtype": "float64"}
CASES = [("gpt", TIED, False), ("gpt", UNTIED, False), ("gpt", TIED, True), ("gpt", UNTIED, True),
         ("llama", {"vocab_size": 29, "block_size": 8, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
                    "n_embd": 32, "seed": 3, "dtype": "float64"}, False),
         ("llama", {"vocab_size": 30, "block_size": 8, "n_layer": 1, "n_head": 4, "n_kv_head": 2,
                    "n_embd": 32, "tied": True, "seed": 4, "dtype": "float64"}, False)]


def _all_cases(cases: list[tuple[str, dict, bool]], ids: torch.Tensor, targets: torch.Tensor) -> list[str]:
    vocab = min(c["vocab_size"] for _, c, _ in cases)
    return [b for kind, cfg, sp in cases for b in _against_plain(kind, cfg, sp, ids % vocab, targets % vocab)]


@pytest.mark.timeout(240)
def test_parallelized_models_match_the_plain_ones_at_world_2(run):
    ids = torch.randint(0, 1000, (3, 8), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(ids, -1, dims=1)
    assert [b for r in run(2, _all_cases, CASES, ids, targets, timeout=200) for b in r] == []


def _odd_sequence(ids: torch.Tensor) -> str:
    model = GPT(GPTConfig(**TIED))
    parallelize(model, Grid({"tp": 2}), gpt_plan(model.cfg, 2, sequence_parallel=True))
    try:
        model(ids % 23)
    except ValueError as e:
        return str(e)
    return "accepted"


def test_sequence_parallel_refuses_a_sequence_that_does_not_split(run):
    ids = torch.zeros(1, 7, dtype=torch.long)
    assert run(2, _odd_sequence, ids) == ["layers.0: sequence parallelism splits the sequence evenly: "
                                          "7 tokens over 2 ranks"] * 2


def test_bad_plans_are_refused_in_one_line_before_any_swap():
    cfg = GPTConfig(n_layer=1)
    model = GPT(cfg)
    before = {n: type(m) for n, m in model.named_modules()}
    grid = Grid({"tp": 2}, rank=0)
    cases = [({"layers.*.attn.qkv": ColwiseParallel()}, "'layers.\\*.attn.qkv' matches no module"),
             ({"layers.1.attn.*": ColwiseParallel(), "layers.1.attn.dense": RowwiseParallel()},
              "matched by two plan entries"),
             ({"layers.1.attn": ColwiseParallel(), "layers.1.attn.dense": RowwiseParallel()},
              "inside it"),
             ({"layers.0.wte": VocabParallel()}, "layers.2.weight shares a weight the plan splits")]
    for plan, words in cases:
        with pytest.raises(ValueError, match=words) as e:
            parallelize(model, grid, plan)
        assert "\n" not in str(e.value)
    assert {n: type(m) for n, m in model.named_modules()} == before  # nothing swapped
    with pytest.raises(ValueError, match="n_head 4 is not divisible by tp 3"):
        gpt_plan(cfg, 3)
    with pytest.raises(ValueError, match="n_kv_head 2 is not divisible by tp 4"):
        llama_plan(LlamaConfig(n_head=4, n_kv_head=2), 4)


def _bad_styles() -> list[str]:
    """Errors a style can only find once it holds the module and the group."""
    from dt.parallel.tensor import SequenceParallelNorm

    grid, out = Grid({"tp": 2}), []
    twins = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    twins[1].weight = twins[0].weight
    cases = [(nn.Sequential(nn.Embedding(8, 4)), {"0": ColwiseParallel()}),
             (nn.Sequential(nn.RMSNorm(4)), {"0": SequenceParallelNorm()}),
             (twins, {"0": ColwiseParallel(), "1": RowwiseParallel()})]
    for model, plan in cases:
        try:
            parallelize(model, grid, plan)
            out.append("accepted")
        except ValueError as e:
            out.append(str(e))
    return out


def test_styles_refuse_what_they_cannot_split(run):
    got = run(2, _bad_styles)[0]
    assert got[0] == "0: ColwiseParallel splits a torch.nn.Linear, found Embedding"
    assert got[1] == "0: SequenceParallelNorm splits a torch.nn.LayerNorm, found RMSNorm"
    assert got[2] == "a tied weight is split two ways: (2, 4) on one side, (4, 2) on the other"
