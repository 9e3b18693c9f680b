"""ContextParallel: the plain GPT on a cp group (ring attention, Ulysses), alone and with tp and experts.

Each rank keeps its zig-zag share of whole sequences (shard_sequence); its
logits must be the plain model's at those positions, the losses averaged
over dp x cp the plain model's, and every gradient averaged over dp x cp
(experts: summed over edp / dp x cp) the plain model's, in float64
(tests/test_styles_expert.py's against_plain). Block 10 over cp 4 splits
unevenly (3, 3, 2, 2 tokens), so the loss's rescaling is exercised.
"""

from __future__ import annotations

import pytest
import torch

from dt.models.gpt import GPT, GPTConfig
from dt.parallel.context.style import shard_sequence
from dt.parallel.grid import Grid
from dt.parallel.plan import gpt_plan, parallelize
from tests.test_styles_expert import BASE, _batch, against_plain

CASES_2 = [(BASE, {"cp": 2}, 1, {"cp": 2}, ("ring_attention",)),
           ({**BASE, "tied": False}, {"cp": 2}, 1, {"cp": 2, "cp_attention": "ulysses"}, ("ulysses",))]
CASES_4 = [(BASE, {"cp": 4}, 1, {"cp": 4}, ("ring_attention",)),
           (BASE, {"cp": 2, "tp": 2}, 1, {"cp": 2, "cp_attention": "ulysses"}, ("ulysses",)),
           ({**BASE, "n_experts": 4, "top_k": 2, "capacity_factor": 1.0}, {"dp": 2, "cp": 2}, 2,
            {"cp": 2}, ("ring_attention", "moe"))]


def _cases(cases: list, ids: torch.Tensor, targets: torch.Tensor) -> list[str]:
    return [b for cfg, sizes, ep, kw, labels in cases
            for b in against_plain(cfg, sizes, ep, kw, ids, targets, labels)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, cases", [(2, CASES_2), (4, CASES_4)])
def test_context_parallel_gpt_is_the_plain_one(run, world, cases):
    ids, targets = _batch(1, 4, BASE["block_size"], BASE["vocab_size"])
    assert [b for r in run(world, _cases, cases, ids, targets, timeout=260) for b in r] == []


def _sequence_parallel_inside_cp(ids: torch.Tensor, targets: torch.Tensor) -> list[str]:
    cfg = {**BASE, "block_size": 12}  # 6 tokens per cp rank, 3 per tp rank between blocks
    return against_plain(cfg, {"cp": 2, "tp": 2}, 1, {"cp": 2, "sequence_parallel": True}, ids, targets,
                         ("ring_attention",))


@pytest.mark.timeout(200)
def test_sequence_parallel_composes_with_context_parallel(run):
    ids, targets = _batch(3, 4, 12, BASE["vocab_size"])
    assert [b for r in run(4, _sequence_parallel_inside_cp, ids, targets, timeout=160) for b in r] == []


def _wrong_length(ids: torch.Tensor) -> str:
    model = GPT(GPTConfig(**BASE))
    grid = Grid({"cp": 2})
    parallelize(model, grid, gpt_plan(model.cfg, 1, cp=2))
    try:
        model(shard_sequence(ids, grid))  # 8 tokens where the model's sequences are 10
    except ValueError as e:
        return str(e)
    return "accepted"


def _wrong_grid() -> str:
    model = GPT(GPTConfig(**BASE))
    try:
        parallelize(model, Grid({"dp": 2, "cp": 1}), gpt_plan(model.cfg, 1, cp=2))
    except ValueError as e:
        return str(e)
    return "accepted"


def test_context_parallel_refuses_another_length_or_grid(run):
    assert run(2, _wrong_grid)[0] == ("a context-parallel plan for cp = 2 on Grid({'dp': 2, 'cp': 1}), whose "
                                      "cp group holds 1 rank(s): make the plan with the grid's cp")
    got = run(2, _wrong_length, torch.zeros(1, 8, dtype=torch.long))
    assert got[0] == ("layers.0.wpe: cp rank 0 of 2 holds 5 tokens of a sequence of 10, got 4: give every "
                      "cp rank whole sequences of seq_len tokens and keep its share with shard_sequence")
    with pytest.raises(ValueError, match="n_head must divide by tp \\* cp"):
        gpt_plan(GPTConfig(n_head=4), 2, cp=4, cp_attention="ulysses")
    with pytest.raises(ValueError, match="one of \\['ring', 'ulysses'\\]"):
        gpt_plan(GPTConfig(), 1, cp=2, cp_attention="rign")
