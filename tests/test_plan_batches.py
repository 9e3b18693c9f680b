"""Micro-batches priced as dt train cuts them: uneven ones, gradient accumulation, and the step and MFU
they give (dt.plan.stage.micro_batch_sizes, dt.plan.layouts.micro_batch_counts)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dt.plan.cluster import catalogue_cluster
from dt.plan.compute import StageShape, catalogue_stage
from dt.plan.layouts import Layout, micro_batch_counts
from dt.plan.model import PRESETS, ModelShape, preset
from dt.plan.search import rank_layouts
from dt.plan.stage import micro_batch_sizes, stage_work
from dt.plan.step_model import predict, stage_groups

MFU_CEILING = 0.75  # no layout on any catalogue GPU is priced past this fraction of the dense peak
SPLITS = [(16, 2, 1), (16, 2, 3), (60, 4, 8), (60, 4, 15), (48, 8, 4), (30, 2, 4), (7, 1, 7), (9, 1, 2)]


def _pipeline_split(cases: list[tuple[int, int, int]]) -> list[list[int]]:
    """The sequences each micro-batch of dt train's pipeline step gets on one rank (TrainStep runs
    every layout, pp 1's gradient accumulation included, through Pipeline.train_step)."""
    import torch
    from torch import nn

    from dt.parallel.pipeline import Pipeline

    class Seen(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear, self.sizes = nn.Linear(1, 1), []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.sizes.append(x.shape[0])
            return self.linear(x)

    out = []
    for batch, dp, m in cases:
        stage = Seen()
        pipe = Pipeline(stage)
        x = torch.zeros(batch // dp, 1)
        pipe.train_step(x, x, lambda y, t: (y - t).pow(2).mean(), micro_batches=m)
        out.append(stage.sizes)
    return out


@pytest.mark.timeout(120)
def test_the_planners_micro_batches_are_dt_trains_split(run):
    """Per rank batch / dp sequences cut into m micro-batches by dt train's own step, uneven ones
    included: the planner prices each of those sizes, not batch // dp // m of them."""
    seen = run(1, _pipeline_split, SPLITS)[0]
    for (batch, dp, m), sizes in zip(SPLITS, seen):
        assert micro_batch_sizes(batch, dp, m) == sizes, (batch, dp, m)
        assert sum(sizes) == batch // dp


def test_every_count_that_cuts_micro_batches_of_a_power_of_two_is_enumerated():
    """Gradient accumulation at pp 1 too: 15 sequences a rank in micro-batches of 1, 2, 4, 8 or 15
    (15, 8, 4, 2, 1 of them); at pp 4 also the pipeline's fill counts 4 and 8 (16 and 32 exceed 15)."""
    assert micro_batch_counts(1, 15) == [1, 2, 4, 8, 15]
    assert micro_batch_counts(4, 15) == [1, 2, 4, 8, 15]
    assert micro_batch_counts(2, 60) == [1, 2, 4, 8, 15, 16, 30, 60]


GPT_7B = ModelShape(32, 32, 4096, 50257, name="gpt-7b")
H100X8 = catalogue_cluster("h100", 1, 8)


def test_a_stage_prices_the_mean_of_its_micro_batches():
    """60 sequences over dp 4 in 8 micro-batches: 7 of 2 and one of 1; the stage's compute per
    micro-batch is the mean of those, each priced kernel by kernel."""
    lay = Layout(dp=4, pp=2, micro_batches=8)
    assert micro_batch_sizes(60, 4, 8) == [2] * 7 + [1]
    w = stage_work(H100X8, GPT_7B, lay, stage_groups(lay)[0], 60, 2048, 0)

    def priced(size: int) -> tuple[float, float]:
        shape = StageShape(size, 2048, blocks=w.blocks, head=w.head, embed=w.embed)
        return catalogue_stage(H100X8, GPT_7B, shape)

    two, one = priced(2), priced(1)
    assert w.fwd["compute"] == pytest.approx((7 * two[0] + one[0]) / 8)
    assert w.bwd["compute"] == pytest.approx((7 * two[1] + one[1]) / 8)


@pytest.mark.parametrize("lay", [Layout(dp=4, pp=2, micro_batches=8),  # once priced alike at 32, 48 and 60
                                 Layout(dp=8, zero=1, micro_batches=4),  # gradient accumulation at pp 1
                                 Layout(dp=2, tp=2, pp=2, micro_batches=16, sequence_parallel=True)],
                         ids=lambda lay: lay.name())
def test_a_fixed_layouts_step_grows_strictly_with_the_global_batch(lay):
    batches = [lay.dp * per_rank for per_rank in range(16, 31)]  # every multiple of dp, 16 to 30 a rank
    steps = [predict(H100X8, GPT_7B, lay, batch, 2048).step for batch in batches]
    assert all(a < b for a, b in zip(steps, steps[1:])), dict(zip(batches, steps))


def _highest_mfu(cluster, model: ModelShape, batch: int, seq: int) -> float:
    """The highest MFU among the ranked rows (the first row's group: every row within the ties)."""
    ranking = rank_layouts(cluster, model, batch, seq, ("none", "selective", "full"), top=1)
    assert ranking.rows, (model.name, batch)
    return max(r.mfu for r in ranking.rows)


@pytest.mark.parametrize("model,seq", [(preset("llama-7b"), 4096), (GPT_7B, 2048)],
                         ids=["llama-7b", "gpt-7b"])
def test_uneven_micro_batches_rank_no_layout_past_the_ceiling(model, seq):
    """The floored-micro-batch bug: 60 sequences over dp 4 or 8 ranks priced as 60 // dp // m
    per micro-batch while tokens/s counted all 60 ranked layouts at 88-118% MFU."""
    for batch in (48, 60):
        assert _highest_mfu(H100X8, model, batch, seq) <= MFU_CEILING


def _fits_eight(model: ModelShape) -> ModelShape:
    """The preset's layers, as many as 8 GPUs hold (each layer's shape, what sets the kernels' rate)."""
    most = max(2, int(12e9 // model.block_params()))
    return replace(model, n_layer=min(model.n_layer, most))


GPUS = ("a100", "h100", "h200")


@pytest.mark.parametrize("name,gpu", [(name, GPUS[i % len(GPUS)]) for i, name in enumerate(sorted(PRESETS))])
def test_no_preset_on_any_catalogue_gpu_is_priced_past_the_ceiling(name, gpu):
    """Every preset, each on one of the catalogue's GPUs in turn (all three GPUs covered)."""
    model = _fits_eight(PRESETS[name])
    cluster = catalogue_cluster(gpu, 1, 8)
    for batch in (16, 40):  # 40: 5 sequences a rank at dp 8, uneven micro-batches
        mfu = _highest_mfu(cluster, model, batch, 2048)
        assert 0 < mfu <= MFU_CEILING, (name, gpu, batch, mfu)
