"""Mixed precision (dt/train/precision.py): 16-bit autocast, float32 master weights, loss scaling.

The tolerance. bfloat16 keeps 8 significant bits (7 stored), so rounding a
matmul's input is off by at most u = 2^-8 of it (round to nearest: 2^-9; we
take the looser). At the same weights the loss moves by O(u |logits|), far
below u x loss. Along a trajectory every gradient is off by O(u) relative, so
Adam's steps are too, and the weights drift from float32's by O(u) of the
distance they travelled: the loss by O(u x (L_0 - L_t)) < u x L_t. So each
step's loss must be within u x L of float32's: 2^-8 (0.39%) for bfloat16,
2^-11 (0.05%) for float16 (11 significant bits). Measured over these 40 steps
(1 thread): at most 0.053% and 0.012%.
"""

from __future__ import annotations

import math

import pytest
import torch

from dt.models.data import CharData
from dt.models.gpt import GPT, GPTConfig
from dt.train.optim import Adam
from dt.train.precision import Precision

STEPS = 40
SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11}


def _trajectory(kind: str, steps: int = STEPS) -> tuple[list[float], GPT, Adam, Precision]:
    torch.set_num_threads(1)
    data = CharData()
    model = GPT(GPTConfig(vocab_size=data.vocab_size, block_size=16, n_layer=2, n_head=4, n_embd=32))
    opt, prec, losses = Adam(model.parameters(), lr=3e-3), Precision(kind), []
    for step in range(steps):
        x, y = data.batch(step, 8, 16)
        opt.zero_grad()
        with prec.autocast():
            logits, loss = model(x, y)
        assert logits.dtype == (torch.float32 if kind == "float32" else getattr(torch, kind))
        prec.scale(loss).backward()
        if prec.unscale_and_check([p.grad for p in model.parameters()]):
            opt.step()
        losses.append(loss.item())
    return losses, model, opt, prec


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["bfloat16", "float16"])
def test_16_bit_follows_the_float32_trajectory_within_its_rounding(kind):
    ref, _, _, _ = _trajectory("float32")
    mine, model, opt, prec = _trajectory(kind)
    u = 2.0 ** -SIGNIFICAND_BITS[kind]
    worst = max(abs(a - b) / a for a, b in zip(ref, mine))
    assert worst <= u, f"{kind} left float32's trajectory by {worst:.2e} of the loss (bound u = {u:.2e})"
    assert mine != ref  # it did run in 16 bits
    assert mine[-1] < mine[0] - 0.5  # and it learnt
    # master weights and Adam's moments stay float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(t.dtype == torch.float32 for st in opt.state.values() for k, t in st.items() if k != "step")
    assert prec.skipped == 0 and prec.loss_scale == (2.0 ** 16 if kind == "float16" else 1.0)


def test_float16_overflow_skips_the_step_and_halves_the_scale_then_grows_it():
    prec = Precision("float16", init_scale=8.0, growth_interval=2)
    good = [torch.full((3,), 16.0)]
    assert prec.unscale_and_check(good) and good[0].tolist() == [2.0, 2.0, 2.0]  # divided by the scale
    bad = [torch.tensor([1.0, math.inf]), torch.ones(2)]
    assert not prec.unscale_and_check(bad) and prec.loss_scale == 4.0 and prec.skipped == 1
    assert not prec.unscale_and_check([torch.tensor([math.nan])]) and prec.loss_scale == 2.0
    assert prec.unscale_and_check([torch.ones(1)]) and prec.loss_scale == 2.0  # one good step
    assert prec.unscale_and_check([torch.ones(1)]) and prec.loss_scale == 4.0  # growth_interval: doubled
    assert prec.scale(torch.tensor(1.5)).item() == 6.0
    again = Precision("float16")
    again.load_state_dict(prec.state_dict())
    assert again.loss_scale == 4.0 and again.good_steps == 0


def test_bfloat16_and_float32_need_no_scale_and_unknown_kinds_are_refused():
    for kind in ("float32", "bfloat16"):
        prec = Precision(kind)
        g = [torch.tensor([math.inf])]
        assert prec.unscale_and_check(g) and prec.scale(torch.tensor(2.0)).item() == 2.0
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        Precision("int8")


def _one_rank_overflows() -> tuple[bool, float]:
    import torch.distributed as dist

    prec = Precision("float16", init_scale=4.0)
    grad = torch.tensor([math.inf if dist.get_rank() == 1 else 1.0])
    return prec.unscale_and_check([grad]), prec.loss_scale


@pytest.mark.timeout(120)
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(run):
    assert run(2, _one_rank_overflows) == [(False, 2.0), (False, 2.0)]


EXPERT_ARGV = ["--dp", "2", "--ep", "2", "--experts", "4", "--top-k", "2", "--aux-loss-coef", "0.05"]


def _16_bit_experts(precision: str) -> tuple[list[float], float]:
    from tests.test_trainer_loop import _train

    out = _train([*EXPERT_ARGV, "--precision", precision, "--steps", "10", "--eval-every", "0"])
    return out["losses"], out["grad_norm"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["bfloat16", "float16"])
def test_16_bit_with_experts_follows_float32(run, kind):
    """A mixture of experts under autocast (dp 2 x ep 2): the router in float32, the experts' matmuls
    in 16 bits, float16's loss scale on the balance loss's gradient too (dt.models.moe.set_loss_scale:
    without it the balance loss reaches the weights divided by 2^16, and float16 leaves float32's
    trajectory by 9.9e-3 of the loss here, 20 u). Bound: u x L, as above, which holds while the
    top-k choices are float32's (a flipped near-tie is a jump: with --aux-loss-coef 0.1, 3.9e-3)."""
    ref, _ = run(2, _16_bit_experts, "float32")[0]
    mine, _ = run(2, _16_bit_experts, kind)[0]
    u = 2.0 ** -SIGNIFICAND_BITS[kind]
    worst = max(abs(a - b) / a for a, b in zip(ref, mine))
    assert mine != ref and worst <= u, f"{kind} with experts left float32's by {worst:.2e} (u {u:.2e})"
