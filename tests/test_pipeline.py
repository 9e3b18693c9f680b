"""Pipeline parallel: GPipe and 1F1B against the unpipelined model (same seed, float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dt import pipeline
from dt.pipeline import Pipeline, bubble_fraction, partition, schedule, stage_module

BATCH = 8


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 7), nn.Tanh(),
                         nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=g, dtype=torch.float64))


def _pipeline_vs_reference(micro_batches: list[int], sizes: list[int] | None) -> list[str]:
    """Every (schedule, m): loss, every stage gradient and peak stash against the reference."""
    x, y = _data()
    ref = _model()
    ref_loss = nn.functional.mse_loss(ref(x), y)
    ref_loss.backward()
    ref_grads = [p.grad for p in ref.parameters()]
    failures = []
    for name in ("gpipe", "1f1b"):
        for m in micro_batches:
            model = _model()
            stage = stage_module(model, None, sizes)
            mine = {id(p) for p in stage.parameters()}
            pipe = Pipeline(stage)
            p, s = pipe.stages, pipe.stage
            loss = pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None,
                                   nn.functional.mse_loss, micro_batches=m, schedule_name=name)
            tag = f"{name} p={p} m={m} stage={s}"
            if pipe.is_last and abs(loss - ref_loss.item()) > 1e-12:
                failures.append(f"{tag}: loss {loss} != {ref_loss.item()}")
            for prm, ref_g in zip(model.parameters(), ref_grads):
                if id(prm) in mine and not torch.allclose(prm.grad, ref_g, atol=1e-12, rtol=0):
                    failures.append(f"{tag}: gradient differs by {(prm.grad - ref_g).abs().max()}")
            want = m if name == "gpipe" else min(p - s, m)
            if pipe.stats.peak_stash != want:
                failures.append(f"{tag}: peak stash {pipe.stats.peak_stash}, expected {want}")
            if not 0.0 <= pipe.stats.bubble <= 1.0:
                failures.append(f"{tag}: bubble {pipe.stats.bubble}")
    # Forward-only inference.
    model = _model()
    pipe = Pipeline(stage_module(model, None, sizes))
    out = pipe.forward(x if pipe.is_first else None, micro_batches=3)
    if pipe.is_last and not torch.allclose(out, ref(x), atol=1e-12, rtol=0):
        failures.append("forward-only output differs")
    return failures


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_schedules_match_unpipelined(run, world):
    results = run(world, _pipeline_vs_reference, list(range(1, 9)), None)
    assert [f for r in results for f in r] == []


def test_uneven_user_sizes_and_five_stages(run):
    # 7 layers over 5 stages with a user split, m < p and m > p.
    results = run(5, _pipeline_vs_reference, [1, 2, 7], [1, 1, 2, 2, 1])
    assert [f for r in results for f in r] == []


def test_bubble_arithmetic():
    assert bubble_fraction(4, 1) == pytest.approx(0.75)
    assert bubble_fraction(4, 16) == pytest.approx(3 / 19)  # about 16%
    assert bubble_fraction(1, 5) == 0.0
    assert bubble_fraction(4, 8, virtual=2) == pytest.approx(3 / 19)
    with pytest.raises(ValueError):
        bubble_fraction(0, 1)


def test_partition_and_schedule_shapes():
    assert [len(r) for r in partition(7, 3)] == [3, 2, 2]
    assert [list(r) for r in partition(5, 2, [1, 4])] == [[0], [1, 2, 3, 4]]
    with pytest.raises(ValueError):
        partition(3, 4)
    with pytest.raises(ValueError):
        partition(5, 2, [2, 2])
    for p in range(1, 6):
        for m in range(1, 9):
            for s in range(p):
                for name in ("gpipe", "1f1b"):
                    acts = schedule(name, p, s, m)
                    assert sorted(acts) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
                    # Every backward after its forward; forwards and backwards each in order.
                    assert all(acts.index(("F", i)) < acts.index(("B", i)) for i in range(m))
    assert schedule("1f1b", 4, 0, 8)[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    with pytest.raises(ValueError):
        pipeline.schedule("zigzag", 2, 0, 2)
