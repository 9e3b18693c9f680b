"""dt.cost.flops against the published counts and against torch's own FLOP counter."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dt.cost.flops import (
    KINDS,
    Decoder,
    forward_flops_per_token,
    layer_forward,
    matmul_params,
    step_flops,
    train_flops_per_token,
)
from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig

pytestmark = pytest.mark.timeout(120)


def gpt_arch(V: int, s: int, L: int, h: int, a: int) -> Decoder:
    return Decoder.of(GPTConfig(vocab_size=V, block_size=s, n_layer=L, n_head=a, n_embd=h))


@pytest.mark.parametrize("V,s,L,h,a,B", [(51200, 2048, 96, 12288, 96, 1536),  # GPT-3 175B, Table 1
                                         (50257, 1024, 12, 768, 12, 8), (256, 64, 2, 64, 4, 3)])
def test_megatron_full_recompute_count(V, s, L, h, a, B):
    """Narayanan et al. 2021, eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration."""
    megatron = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    ours = step_flops(gpt_arch(V, s, L, h, a), sequences=B, recompute="full").hardware
    assert ours == pytest.approx(megatron, rel=1e-12)


@pytest.mark.parametrize("V,s,L,h,a", [(51200, 2048, 96, 12288, 96), (256, 64, 3, 96, 4)])
def test_palm_six_n_plus_attention(V, s, L, h, a):
    """PaLM appendix B: 6N + 12 l h s per token, N the matmul weights (tied embedding once)."""
    arch = gpt_arch(V, s, L, h, a)
    assert train_flops_per_token(arch) == pytest.approx(6 * matmul_params(arch) + 12 * L * h * s, rel=1e-12)


def test_matmul_params_are_the_models_matrices():
    for model in (GPT(GPTConfig(vocab_size=96, block_size=16, n_layer=2, n_head=4, n_embd=32)),
                  Llama(LlamaConfig(vocab_size=96, block_size=16, n_layer=2, n_head=4, n_kv_head=2,
                                    n_embd=32))):
        seen, matrices = set(), 0
        for name, p in model.named_parameters():
            if p.ndim == 2 and "wpe" not in name and id(p) not in seen:
                seen.add(id(p))
                matrices += p.numel()
        tied = model.cfg.tied
        extra = 0 if tied or isinstance(model, GPT) else model.cfg.vocab_size * model.cfg.n_embd
        assert matmul_params(Decoder.of(model.cfg)) + extra == matrices  # untied Llama: embed_tokens


def counted(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) FLOPs torch's counter sees; the math kernel makes attention matmuls."""
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fc:
            _, loss = model(ids, ids)
        forward = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc:
            loss.backward()
    return forward, fc.get_total_flops()


@pytest.mark.parametrize("cfg", [
    GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32),
    GPTConfig(vocab_size=80, block_size=24, n_layer=3, n_head=2, n_embd=48, tied=False),
    LlamaConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32),
    LlamaConfig(vocab_size=72, block_size=20, n_layer=1, n_head=6, n_kv_head=6, n_embd=48, tied=True),
])
def test_torch_flop_counter_agrees_exactly(cfg):
    torch.manual_seed(0)
    model = (GPT if isinstance(cfg, GPTConfig) else Llama)(cfg)
    b, s = 3, cfg.block_size - 4  # a shorter sequence than the table: seq_len is an argument
    forward, backward = counted(model, torch.randint(0, cfg.vocab_size, (b, s)))
    ours = step_flops(Decoder.of(cfg, s), sequences=b)
    assert forward == ours.forward
    # torch's counter skips the first block's input gradient only where nothing needs it; the
    # embedding's output does, so every matmul's two gradients are there: exactly 2x.
    assert backward == ours.backward


def test_splits_add_up_to_the_whole():
    arch = gpt_arch(512, 128, 4, 256, 8)
    whole = {k: sum(layer_forward(arch, i)[k] for i in range(arch.n_layer + 2)) for k in KINDS}
    for tp, cp in ((2, 1), (4, 2), (1, 4)):
        one_rank = {k: sum(layer_forward(arch, i, tp, cp)[k] for i in range(arch.n_layer + 2)) for k in KINDS}
        for k in KINDS:
            assert one_rank[k] * tp * cp == pytest.approx(whole[k])
    # pp: the stages' sums are the model's
    stages = [range(0, 3), range(3, 6)]
    assert sum(step_flops(arch, 2, r).model for r in stages) == pytest.approx(step_flops(arch, 2).model)


def test_moe_router_and_top_k_experts_not_split_by_tp():
    dense = gpt_arch(256, 64, 2, 64, 4)
    moe = Decoder(**{**dense.__dict__, "n_experts": 8, "top_k": 2})
    per = forward_flops_per_token(moe)
    assert per["router"] == 2 * 64 * 8
    assert per["mlp"] == 2 * forward_flops_per_token(dense)["mlp"]
    one = layer_forward(moe, 1, tp=2)
    assert one["mlp"] == per["mlp"] * 64 and one["qkv"] == per["qkv"] * 64 / 2


def moe_counted(hidden: int, experts: int, top_k: int, tokens: int) -> tuple[int, int]:
    from dt.parallel.expert import ShardedMoE
    torch.manual_seed(0)
    moe = ShardedMoE(hidden, 4 * hidden, experts, top_k)
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    with FlopCounterMode(display=False) as fc:
        y = moe(x)
    forward = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        y.sum().backward()
    return forward, fc.get_total_flops()


def test_moe_layer_against_torch_counter(run):
    hidden, experts, top_k, tokens = 16, 4, 2, 24
    forward, backward = run(1, moe_counted, hidden, experts, top_k, tokens)[0]
    arch = Decoder(vocab_size=8, seq_len=tokens, n_layer=1, n_embd=hidden, n_head=1, n_kv_head=1,
                   ffn_hidden=4 * hidden, n_experts=experts, top_k=top_k)
    per = forward_flops_per_token(arch)
    assert forward == (per["router"] + per["mlp"]) * tokens
    assert backward == 2 * forward


def test_recompute_and_bad_input():
    arch = gpt_arch(256, 64, 2, 64, 4)
    none, sel, full = (step_flops(arch, recompute=r) for r in ("none", "selective", "full"))
    per = forward_flops_per_token(arch)
    assert sel.recompute == 2 * (per["scores"] + per["attend"]) * 64
    assert full.recompute == 2 * sum(per.values()) * 64 and none.recompute == 0
    assert full.model == none.model
    with pytest.raises(ValueError, match="recompute must be one of"):
        step_flops(arch, recompute="some")
    with pytest.raises(ValueError, match="layer 9 is not one of"):
        layer_forward(arch, 9)


def test_a_plan_model_shape_reads_like_the_config():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Shape:  # dt.plan.model.ModelShape's fields (the planner's model description)
        n_layer: int = 2
        n_head: int = 4
        n_embd: int = 64
        vocab: int = 256
        ffn: int = 0
        gated: bool = False
        tied: bool = True
        experts: int = 0
        top_k: int = 1

    assert Decoder.of(Shape(), 64) == gpt_arch(256, 64, 2, 64, 4)
    with pytest.raises(ValueError, match="needs seq_len"):
        Decoder.of(Shape())
