"""Loss parallel, sequence-parallel RMSNorm, and Llama under context parallelism, against the plain models.

loss_parallel=True: the head keeps this rank's vocabulary slice of the logits
and the loss is vocab_parallel_cross_entropy on it (never gathered); the
loss and every gradient slice must be the gathered plain model's (float64).
Llama's sequence parallel runs its RMSNorms on block/tp tokens, their
weights' gradients summed over tp. Recompute rides along in some cases, so
its recomputed collectives are checked under tp too.
(tests/test_styles_expert.py's against_plain.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dt.parallel.grid import Grid
from dt.parallel.plan import parallelize
from dt.parallel.tensor.loss import SequenceParallelRMSNorm, VocabParallelLoss
from tests.test_styles_expert import BASE, _batch, against_plain

LLAMA = {"vocab_size": 21, "block_size": 10, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
         "seed": 6, "dtype": "float64"}
CASES_2 = [("gpt", BASE, {"tp": 2}, {"loss_parallel": True}),
           ("gpt", {**BASE, "tied": False}, {"tp": 2}, {"loss_parallel": True, "sequence_parallel": True}),
           ("llama", LLAMA, {"tp": 2}, {"sequence_parallel": True}),
           ("llama", {**LLAMA, "tied": True}, {"tp": 2},
            {"sequence_parallel": True, "loss_parallel": True, "recompute": True})]
CASES_4 = [("llama", LLAMA, {"cp": 2, "tp": 2}, {"cp": 2, "loss_parallel": True}),
           ("llama", LLAMA, {"cp": 4}, {"cp": 4, "cp_attention": "ring", "recompute": True}),
           ("gpt", BASE, {"dp": 2, "tp": 2}, {"sequence_parallel": True, "loss_parallel": True,
                                              "recompute": True})]


def _cases(cases: list, ids: torch.Tensor, targets: torch.Tensor) -> list[str]:
    return [b for kind, cfg, sizes, kw in cases
            for b in against_plain(cfg, sizes, 1, kw, ids, targets, (), kind)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, cases", [(2, CASES_2), (4, CASES_4)])
def test_loss_parallel_and_sequence_parallel_norms_are_the_plain_model(run, world, cases):
    ids, targets = _batch(2, 4, BASE["block_size"], BASE["vocab_size"])
    assert [b for r in run(world, _cases, cases, ids, targets, timeout=260) for b in r] == []


def _refusals() -> list[str]:
    grid, out = Grid({"tp": 2}), []
    for module, style in ((nn.Sequential(nn.Linear(4, 4)), VocabParallelLoss(4)),
                          (nn.Sequential(nn.LayerNorm(4)), SequenceParallelRMSNorm())):
        try:
            parallelize(module, grid, {"0": style})
            out.append("accepted")
        except ValueError as e:
            out.append(str(e))
    return out


def test_loss_styles_refuse_what_they_cannot_take(run):
    assert run(2, _refusals)[0] == [
        "0: VocabParallelLoss swaps a per-token cross-entropy (dt.models.lm.CrossEntropy), found Linear",
        "0: SequenceParallelRMSNorm takes an RMSNorm with a weight and no bias, found LayerNorm with "
        "['bias', 'weight']"]
