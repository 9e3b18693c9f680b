"""The plain models of dt/models/: no parallelism inside, the GPT dt trains, a Llama-style decoder.

Each is checked against an independent statement of what it computes: the GPT
against GPT-2 written out from its state_dict in a few lines (float64 logits,
loss and every gradient), the Llama pieces against torch's RMSNorm, rotation as
complex multiplication, GQA as MHA with its key/value heads repeated. The plans
applied to these models are held to them elsewhere: tensor parallel in
test_parallelize.py, context, expert, loss and recompute styles in
test_styles_*.py, every layout of dt train in test_step.py and test_mesh_train.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig, RMSNorm, apply_rotary, rotary_tables
from dt.models.lm import lm_loss
from tests.test_architecture import EDGES, MODULES

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
    plain = [m for m in MODULES if m.startswith("dt.models")]  # every one, no exception
    assert {"dt.models.gpt", "dt.models.llama", "dt.models.lm", "dt.models.moe"} <= set(plain)
    wrong = {m: sorted(t for t in _reachable(m) if t.startswith(FORBIDDEN)) for m in plain}
    assert not {m: t for m, t in wrong.items() if t}, f"plain models reaching parallel code: {wrong}"


def gpt2_written_out(w: dict[str, torch.Tensor], cfg: GPTConfig, ids: torch.Tensor,
                     targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-2 pre-norm from the weights `w` (the model's parameter names), every step by hand."""
    b, s = ids.shape
    n, heads = cfg.n_embd, cfg.n_head
    d = n // heads
    x = w["layers.0.wte.weight"][ids] + w["layers.0.wpe.weight"][:s]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(1, cfg.n_layer + 1):
        p = f"layers.{i}."
        h = F.layer_norm(x, (n,), w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attn.query_key_value.weight"].T + w[p + "attn.query_key_value.bias"]
        q, k, v = qkv.view(b, s, heads, 3, d).permute(3, 0, 2, 1, 4)  # rows per head: q_h, k_h, v_h
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, n)
        x = x + y @ w[p + "attn.dense.weight"].T + w[p + "attn.dense.bias"]
        h = F.layer_norm(x, (n,), w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        h = F.gelu(h @ w[p + "mlp.dense_h_to_4h.weight"].T + w[p + "mlp.dense_h_to_4h.bias"])
        x = x + h @ w[p + "mlp.dense_4h_to_h.weight"].T + w[p + "mlp.dense_4h_to_h.bias"]
    head = f"layers.{cfg.n_layer + 1}."
    x = F.layer_norm(x, (n,), w[head + "ln_f.weight"], w[head + "ln_f.bias"])
    logits = x @ (w["layers.0.wte.weight"] if cfg.tied else w[head + "lm_head.weight"]).T
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("tied", [True, False])
def test_plain_gpt_is_gpt2_written_out_in_float64(tied):
    cfg = GPTConfig(vocab_size=23, block_size=12, n_layer=2, n_head=4, n_embd=16, tied=tied, seed=3,
                    dtype="float64")
    ids = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(ids, -1, dims=1)
    model = GPT(cfg)
    # the leaves the written-out pass differentiates: one per parameter (a tied head reads the embedding's)
    w = {k: p.detach().clone().requires_grad_() for k, p in model.named_parameters()}
    want_logits, want_loss = gpt2_written_out(w, cfg, ids, targets)
    want_loss.backward()
    logits, loss = model(ids, targets)
    loss.backward()
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert sorted(grads) == sorted(w) and all(g is not None for g in grads.values())
    for k, leaf in w.items():
        torch.testing.assert_close(grads[k], leaf.grad, rtol=0, atol=1e-12, msg=k)
    assert (model.layers[-1].weight is model.layers[0].wte.weight) == tied
    assert all(k.startswith("layers.") for k in model.state_dict())  # every checkpoint's names
    again = GPT(cfg).state_dict()  # the seed alone decides the weights
    assert all(torch.equal(again[k], v) for k, v in model.state_dict().items())


def test_plain_moe_gpt_routes_every_token_and_its_balance_loss_reaches_only_the_gradients():
    common = {"vocab_size": 23, "block_size": 12, "n_layer": 2, "n_head": 4, "n_embd": 16, "seed": 3,
              "dtype": "float64", "n_experts": 4, "top_k": 2, "capacity_factor": 1.0}
    ids = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(ids, -1, dims=1)
    runs = []
    for coef in (0.0, 0.5):
        model = GPT(GPTConfig(**common, aux_loss_coef=coef))
        loss = model(ids, targets)[1]
        loss.backward()
        runs.append((loss.detach(), model.layers[1].mlp.router.weight.grad, model.layers[1].mlp.counted))
    (loss0, router0, counted), (loss1, router1, _) = runs
    assert torch.equal(loss0, loss1)  # the returned loss is the task's cross-entropy alone
    assert not torch.allclose(router0, router1)  # the balance loss reached the router's gradient
    assert counted["assignments"] == 3 * 12 * 2
    assert counted["dropped"] > 0  # capacity factor 1.0 bit


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
