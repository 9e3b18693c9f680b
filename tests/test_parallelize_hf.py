"""Plans for Hugging Face transformers' GPT-2 and Llama, built from a config (no weights downloaded).

At world 2 the parallelized GPT2LMHeadModel (Conv1D layers, a fused q|k|v
projection, the head tied to the embedding) and LlamaForCausalLM (grouped-query
attention) compute the unsplit model's logits and loss, and each rank's
gradients are its slices of the unsplit ones, in float64.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from dt.parallel.grid import Grid
from dt.parallel.plan import hf_gpt2_plan, hf_llama_plan, parallelize
from tests.test_parallelize import TOL, _shard_of

transformers = pytest.importorskip("transformers")


def _build(kind: str) -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config).double(), config
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=16, bos_token_id=0, eos_token_id=0)
    return transformers.LlamaForCausalLM(config).double(), config


def _expected(plain: nn.Module, name: str, full: torch.Tensor, owner: nn.Module, rank: int) -> torch.Tensor:
    """What rank `rank` must hold of the unsplit tensor `full` (a weight or its gradient)."""
    owner_name, _, pname = name.rpartition(".")
    if type(plain.get_submodule(owner_name)).__name__ == "Conv1D" and full.dim() == 2:
        full = full.t()  # Conv1D's [in, out] as the [out, in] of the linear layer it became
    if owner_name.endswith("attn.c_attn"):  # fused q | k | v: this rank's slice of each block
        block, width = full.shape[0] // 3, full.shape[0] // 3 // 2
        return torch.cat([full[b * block + rank * width:b * block + (rank + 1) * width] for b in range(3)])
    return _shard_of(full, owner, pname, rank)


def _against_unsplit(kinds: list[str], ids: torch.Tensor) -> list[str]:
    rank = torch.distributed.get_rank()
    bad = []
    for kind in kinds:
        plain, config = _build(kind)
        model = copy.deepcopy(plain)
        plan = hf_gpt2_plan(config, 2) if kind == "gpt2" else hf_llama_plan(config, 2)
        parallelize(model, Grid({"tp": 2}), plan)
        want = plain(input_ids=ids, labels=ids)
        want.loss.backward()
        got = model(input_ids=ids, labels=ids)
        got.loss.backward()
        for what in ("logits", "loss"):
            if not torch.allclose(getattr(got, what), getattr(want, what), **TOL):
                bad.append(f"{kind} {what}: off by {(getattr(got, what) - getattr(want, what)).abs().max()}")
        plain_params = dict(plain.named_parameters())
        if sorted(dict(model.named_parameters())) != sorted(plain_params):
            bad.append(f"{kind}: parameter names changed")
        for name, p in model.named_parameters():
            owner = model.get_submodule(name.rpartition(".")[0])
            w = _expected(plain, name, plain_params[name].detach(), owner, rank)
            g = _expected(plain, name, plain_params[name].grad, owner, rank)
            if p.shape != w.shape or not torch.equal(p.detach(), w):
                bad.append(f"{kind} {name}: weights are not the unsplit model's slice")
            elif not torch.allclose(p.grad, g, **TOL):
                bad.append(f"{kind} {name}: gradient is not the unsplit model's slice")
        if sum(p.numel() for p in model.parameters()) >= sum(p.numel() for p in plain.parameters()):
            bad.append(f"{kind}: nothing was split")
    return [f"rank {rank}: {b}" for b in bad]


@pytest.mark.timeout(300)
def test_hf_gpt2_and_llama_plans_match_the_unsplit_models_at_world_2(run):
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    assert [b for r in run(2, _against_unsplit, ["gpt2", "llama"], ids, timeout=240) for b in r] == []


def test_hf_plans_refuse_heads_that_do_not_split():
    _, gpt2 = _build("gpt2")
    _, llama = _build("llama")
    with pytest.raises(ValueError, match="n_head 4 is not divisible by tp 3"):
        hf_gpt2_plan(gpt2, 3)
    with pytest.raises(ValueError, match="n_kv_head 2 is not divisible by tp 4"):
        hf_llama_plan(llama, 4)
