"""A pipeline rank keeps only its stage's layers (dt.parallel.pipeline.cut.drop_other_stages).

dt train builds the whole plain model from the seed on every rank; once dt.parallelize has cut
it, the other stages' modules are replaced by an Elsewhere, so their weights are freed. Counted
two ways: the parameters the rank's model still holds are exactly its stage's, tensor for tensor
as the planner lists them (dt.plan.stage.stage_tensors), and the measured peak of live tensor
bytes (dt.plan.check.measure_worker's memory run) is lower, by the other stages' bytes exactly,
than a twin run that keeps the whole model.
"""

from __future__ import annotations

import pytest
import torch

from dt.launcher import launch
from dt.models.gpt import GPT, GPTConfig
from dt.plan.check import measure_worker, train_argv
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.stage import stage_tensors
from dt.train.cli import parse_args

VOCAB = 44  # dt train's default corpus (the characters of CharData)
SHAPE = ModelShape(4, 4, 64, VOCAB)
BATCH, SEQ = 8, 32


def _argv(lay: Layout, steps: int = 2) -> list[str]:
    return train_argv(lay, SHAPE, BATCH, SEQ, steps)


def _held(argv: list[str]) -> dict:
    """This rank's stage, the sizes of the parameters its model holds, and a whole-model forward's error."""
    from dt.train.build import build
    from dt.train.dataset import open_data

    args = parse_args(argv)
    built = build(args, open_data(args).vocab_size)
    model, par = built.parallel_model.model, built.parallel_model
    mine = {id(p) for c in par.stage.chunks for p in c.parameters()}
    try:
        model(torch.zeros(1, SEQ, dtype=torch.int64))
        error = ""
    except RuntimeError as e:
        error = str(e)
    return {"stage": built.coords[2], "sizes": sorted(p.numel() for p in model.parameters()),
            "outside": sum(1 for p in model.parameters() if id(p) not in mine), "error": error}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lay", [Layout(pp=2, micro_batches=4),
                                 Layout(pp=2, schedule="interleaved", virtual=2, micro_batches=4)],
                         ids=lambda lay: lay.name())
def test_each_rank_holds_exactly_its_stages_parameters(run, lay):
    for r in run(2, _held, _argv(lay), timeout=200):
        tensors = stage_tensors(SHAPE, lay, SEQ, r["stage"])
        dense = sorted(tensors.dense)
        assert r["sizes"] == dense and tensors.experts == 0, (r["stage"], r["sizes"], dense)
        assert r["outside"] == 0
        assert "belongs to another pipeline stage" in r["error"], r["error"]


def _peak_of(argv: list[str], keep_whole: bool) -> dict:
    """measure_worker's memory run; keep_whole: the twin that keeps every stage's layers (as before)."""
    from dt.parallel import plan

    drop = plan.drop_other_stages
    if keep_whole:
        plan.drop_other_stages = lambda *a: None
    try:
        out = measure_worker(parse_args(argv), 2, True)
    finally:
        plan.drop_other_stages = drop
    return {"stage": out["stage"], "peak": out["peak_bytes"]}


@pytest.mark.timeout(300)
def test_the_measured_peak_drops_by_the_other_stages_bytes():
    lay = Layout(pp=2, micro_batches=4)
    argv = _argv(lay)
    # fresh processes, as dt plan --check measures memory (a reused worker keeps earlier scratch)
    whole = launch(_peak_of, 2, argv, True, backend="gloo")
    split = launch(_peak_of, 2, argv, False, backend="gloo")
    total = GPT(GPTConfig(vocab_size=VOCAB, block_size=SEQ, n_layer=4, n_head=4, n_embd=64)).num_params()
    for w, s in zip(sorted(whole, key=lambda r: r["stage"]), sorted(split, key=lambda r: r["stage"])):
        own = sum(stage_tensors(SHAPE, lay, SEQ, s["stage"]).dense)
        others = (total - own) * 4  # float32: the other stage's parameters, less the shared word table
        assert w["peak"] - s["peak"] == others, (s["stage"], w["peak"], s["peak"], others)
