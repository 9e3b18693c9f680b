"""The plain models of dt/models/: no parallelism inside, today's GPT reproduced, a Llama-style decoder.

The plain GPT must be the model ParallelGPT trains: same names, shapes and
weights from the same seed, and in float64 the same logits, loss and gradients
as its single-process run. The Llama pieces are each checked against an
independent statement of what they compute (torch's RMSNorm, rotation as
complex multiplication, GQA as MHA with its key/value heads repeated).
"""

from __future__ import annotations

import pytest
import torch

from dt.models.llama import Llama, LlamaConfig, RMSNorm, apply_rotary, rotary_tables
from dt.models.lm import lm_loss
from dt.models.nanogpt import GPT, GPTConfig
from tests.test_architecture import EDGES, MODULES

# Modules of dt/models that still hold parallelism inside; the next session removes it.
NOT_YET_PLAIN = {"dt.models.gpt"}
FORBIDDEN = ("dt.parallel", "dt.transport", "dt.collectives", "dt.backend", "dt.launcher")


def _reachable(module: str) -> set[str]:
    """Every dt module `module` imports, directly or through other dt modules."""
    seen, todo = set(), [module]
    while todo:
        for target, _, _ in EDGES.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_plain_models_import_no_parallelism():
    plain = [m for m in MODULES if m.startswith("dt.models") and m not in NOT_YET_PLAIN]
    assert {"dt.models.nanogpt", "dt.models.llama", "dt.models.lm", "dt.models.moe"} <= set(plain)
    wrong = {m: sorted(t for t in _reachable(m) if t.startswith(FORBIDDEN)) for m in plain}
    assert not {m: t for m, t in wrong.items() if t}, f"plain models reaching parallel code: {wrong}"


def _parallel_twin(cfg_dict: dict, ids: torch.Tensor, targets: torch.Tensor) -> dict:
    """Today's ParallelGPT on a world of 1: its weights, logits, loss and gradients."""
    import dt
    from dt.models.gpt import GPTConfig as ParallelConfig
    from dt.models.gpt import ParallelGPT

    gpt = ParallelGPT(ParallelConfig(**cfg_dict), dt.mesh())
    for block in gpt.moe_blocks:  # what train_step sets: the balance loss per sequence of the batch
        block.aux_weight = cfg_dict["aux_loss_coef"] / ids.shape[0]
    logits = gpt.stage(ids)
    loss = gpt.loss_fn(logits, targets)
    loss.backward()
    named = dict(gpt.stage.named_parameters(remove_duplicate=False))
    return {"state": {k: v.detach().clone() for k, v in gpt.stage.state_dict().items()},
            "logits": logits.detach(), "loss": loss.detach(),
            "grads": {k: p.grad.clone() for k, p in named.items() if p.grad is not None}}


@pytest.mark.parametrize("tied, experts", [(True, {}), (False, {}),
                                           (True, {"n_experts": 4, "top_k": 2, "capacity_factor": 1.0}),
                                           (False, {"n_experts": 3, "aux_loss_coef": 0.5})])
def test_plain_gpt_is_todays_gpt_in_float64(run, tied, experts):
    cfg = GPTConfig(vocab_size=23, block_size=12, n_layer=2, n_head=4, n_embd=16, tied=tied, seed=3,
                    dtype="float64", **experts)
    ids = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(ids, -1, dims=1)
    twin = run(1, _parallel_twin, cfg.as_dict(), ids, targets)[0]
    model = GPT(cfg)
    state = model.state_dict()
    assert sorted(state) == sorted(f"layers.{k}" for k in twin["state"])
    for k, v in twin["state"].items():
        assert torch.equal(state[f"layers.{k}"], v), k  # same seed, same weights, bit for bit
    logits, loss = model(ids, targets)
    loss.backward()
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, twin["logits"], rtol=0, atol=1e-12)
    torch.testing.assert_close(loss, twin["loss"], rtol=0, atol=1e-12)
    grads = {n: p.grad for n, p in model.named_parameters()}
    for k, g in twin["grads"].items():
        if f"layers.{k}" in grads:
            torch.testing.assert_close(grads[f"layers.{k}"], g, rtol=0, atol=1e-12)
    assert len(grads) == len(list(model.parameters()))
    assert (model.layers[-1].weight is model.layers[0].wte.weight) == tied
    if experts:  # the balance loss reached the router (its gradient equal to ParallelGPT's, above)
        assert model.layers[1].mlp.counted["assignments"] == 3 * 12 * cfg.top_k
        if cfg.capacity_factor:
            assert model.layers[1].mlp.counted["dropped"] > 0  # capacity bit, and matched


def test_gpt_config_refuses_bad_values_in_one_line():
    for bad, words in (({"n_embd": 10, "n_head": 4}, "not divisible by n_head"),
                       ({"n_layer": 0}, "n_layer must be at least 1"),
                       ({"dtype": "float77"}, "not a torch dtype")):
        with pytest.raises(ValueError, match=words) as e:
            GPTConfig(**bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="longer than block_size"):
        GPT(GPTConfig(block_size=4))(torch.zeros(1, 5, dtype=torch.long))


def test_plain_gpt_learns_and_samples():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16))
    seq = torch.arange(9) % 11
    ids, targets = seq[:-1].unsqueeze(0), seq[1:].unsqueeze(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(60):
        loss = model(ids, targets)[1]
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 4
    out = model.generate(ids[:, :1], max_new_tokens=7, temperature=0)
    assert out.tolist() == seq[:-1].unsqueeze(0).tolist()  # it learnt to count


def test_rmsnorm_is_torchs():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    mine, ref = RMSNorm(8, eps=1e-6).double(), torch.nn.RMSNorm(8, eps=1e-6).double()
    with torch.no_grad():
        mine.weight.copy_(torch.linspace(0.5, 2, 8))
        ref.weight.copy_(mine.weight)
    torch.testing.assert_close(mine(x), ref(x))


def test_rotary_is_complex_rotation_and_relative():
    d, s = 8, 6
    cos, sin = rotary_tables(d, s, theta=100.0, dtype=torch.float64)
    x = torch.randn(2, 3, s, d, dtype=torch.float64)
    # Pair (i, i + d/2) as the complex number x_i + j x_{i+d/2}, times e^{j p theta^(-2i/d)}.
    z = torch.complex(x[..., : d // 2], x[..., d // 2:])
    angle = torch.arange(s, dtype=torch.float64)[:, None] * 100.0 ** (-torch.arange(0, d, 2) / d)
    turned = z * torch.polar(torch.ones_like(angle), angle)
    want = torch.cat([turned.real, turned.imag], dim=-1)
    torch.testing.assert_close(apply_rotary(x, cos, sin), want)
    # q . k depends only on the positions' difference: shifting both changes nothing.
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    rq = apply_rotary(q.expand(s, d), cos, sin)
    rk = apply_rotary(k.expand(s, d), cos, sin)
    torch.testing.assert_close(rq[3] @ rk[1], rq[5] @ rk[3])
    assert not torch.allclose(rq[3] @ rk[1], rq[3] @ rk[2])


def test_grouped_query_attention_is_mha_with_shared_heads():
    gqa = Llama(LlamaConfig(n_head=4, n_kv_head=2, n_embd=32, dtype="float64"))
    mha = Llama(LlamaConfig(n_head=4, n_kv_head=4, n_embd=32, dtype="float64"))
    state = gqa.state_dict()
    hd = 8
    for name, t in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):  # kv head g serves queries 2g, 2g+1
            state[name] = t.view(2, hd, 32).repeat_interleave(2, dim=0).reshape(4 * hd, 32)
    mha.load_state_dict(state)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gqa(ids)[0], mha(ids)[0])
    assert gqa.num_params() < mha.num_params()


def test_llama_is_causal_learns_and_refuses_bad_configs():
    cfg = LlamaConfig(vocab_size=13, block_size=10, n_layer=2, n_head=4, n_kv_head=1, n_embd=32)
    model = Llama(cfg)
    assert model.cfg.ffn_hidden % cfg.ffn_multiple_of == 0 and model.cfg.ffn_hidden >= 8 * 32 // 3
    ids = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 13
    torch.testing.assert_close(model(ids)[0][:, :6], model(changed)[0][:, :6])  # no peeking ahead
    assert not torch.allclose(model(ids)[0][:, 6:], model(changed)[0][:, 6:])
    seq = torch.arange(11) % 13
    x, y = seq[:-1].unsqueeze(0), seq[1:].unsqueeze(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = model(x, y)[1]
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < losses[0] / 4
    assert model.generate(x[:, :1], 9, temperature=0).tolist() == x.tolist()
    for bad, words in (({"n_head": 4, "n_kv_head": 3}, "not a multiple of n_kv_head"),
                       ({"n_embd": 12, "n_head": 4}, "even head size")):
        with pytest.raises(ValueError, match=words):
            LlamaConfig(**bad)


def test_lm_loss_upcasts_half_precision_only():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3))
    assert lm_loss(logits, targets).dtype == torch.float64
    assert lm_loss(logits.bfloat16(), targets).dtype == torch.float32
