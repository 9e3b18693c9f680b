"""Pipeline parallel: GPipe, 1F1B and interleaved 1F1B against the unpipelined model (same seed, float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dt.parallel import pipeline
from dt.parallel.pipeline import (
    Pipeline,
    bubble_fraction,
    neighbour,
    partition,
    schedule,
    stage_layers,
    stage_module,
)

BATCH = 8


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 7), nn.Tanh(),
                         nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 4), nn.Linear(4, 3)).double()


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=g, dtype=torch.float64))


SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]


def _pipeline_vs_reference(micro_batches: list[int], sizes: list[int] | None,
                           schedules: list[tuple[str, int]] = SCHEDULES) -> list[str]:
    """Every (schedule, m): loss, every stage gradient and peak stash against the reference."""
    x, y = _data()
    ref = _model()
    ref_loss = nn.functional.mse_loss(ref(x), y)
    ref_loss.backward()
    ref_grads = [p.grad for p in ref.parameters()]
    failures = []
    for name, v in schedules:
        for m in micro_batches:
            model = _model()
            stage = stage_module(model, None, sizes if v == 1 else None, virtual=v)
            mine = {id(p) for p in stage.parameters()}
            pipe = Pipeline(stage)
            p, s = pipe.stages, pipe.stage
            loss = pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None,
                                   nn.functional.mse_loss, micro_batches=m, schedule_name=name)
            tag = f"{name} v={v} p={p} m={m} stage={s}"
            if pipe.is_last and abs(loss - ref_loss.item()) > 1e-12:
                failures.append(f"{tag}: loss {loss} != {ref_loss.item()}")
            for prm, ref_g in zip(model.parameters(), ref_grads):
                if id(prm) in mine and not torch.allclose(prm.grad, ref_g, atol=1e-12, rtol=0):
                    failures.append(f"{tag}: gradient differs by {(prm.grad - ref_g).abs().max()}")
            want = {"gpipe": m, "1f1b": min(p - s, m),
                    "interleaved": pipeline.peak_stash(name, p, s, m, v)}[name]  # the replay's
            if pipe.stats.peak_stash != want:
                failures.append(f"{tag}: peak stash {pipe.stats.peak_stash}, expected {want}")
            if not 0.0 <= pipe.stats.bubble <= 1.0:
                failures.append(f"{tag}: bubble {pipe.stats.bubble}")
    # Forward-only inference, one chunk and (if it fits) two per stage.
    for v in (1, 2):
        model = _model()
        pipe = Pipeline(stage_module(model, None, sizes if v == 1 else None, virtual=v))
        out = pipe.forward(x if pipe.is_first else None, micro_batches=3)
        if pipe.is_last and not torch.allclose(out, ref(x), atol=1e-12, rtol=0):
            failures.append(f"forward-only output differs (v={v})")
        if 2 * pipe.stages > 8:
            break
    return failures


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_schedules_match_unpipelined(run, world):
    results = run(world, _pipeline_vs_reference, list(range(1, 9)), None)
    assert [f for r in results for f in r] == []


def test_uneven_user_sizes_and_five_stages(run):
    # 8 layers over 5 stages with a user split, m < p and m > p.
    results = run(5, _pipeline_vs_reference, [1, 2, 7], [1, 1, 2, 2, 2], SCHEDULES[:2])
    assert [f for r in results for f in r] == []


def test_eight_stages_one_layer_each(run):
    results = run(8, _pipeline_vs_reference, [1, 3, 8], None, SCHEDULES[:2])
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
                for name, v in SCHEDULES + [("interleaved", 3)]:
                    acts = schedule(name, p, s, m, v)
                    work = [(c, i) for c in range(v) for i in range(m)]
                    assert sorted(acts) == sorted([("F", *w) for w in work] + [("B", *w) for w in work])
                    # Every backward after its forward.
                    assert all(acts.index(("F", *w)) < acts.index(("B", *w)) for w in work)
    # 1F1B: 3 warm-up forwards on stage 0 of 4, then alternate; the last stage alternates at once.
    assert schedule("1f1b", 4, 0, 8)[:6] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3),
                                            ("B", 0, 0), ("F", 0, 4)]
    assert schedule("1f1b", 4, 3, 3) == [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1),
                                         ("F", 0, 2), ("B", 0, 2)]
    # Interleaved: forwards take groups of p micro-batches through chunk 0, then chunk 1; after
    # 2 (p-1) + (v-1) p of them on stage 0, one forward, one backward (test_pipeline_interleaved.py).
    assert schedule("interleaved", 2, 0, 4, 2)[:8] == [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1),
        ("F", 0, 2), ("B", 1, 0), ("F", 0, 3), ("B", 1, 1)]
    with pytest.raises(ValueError):
        pipeline.schedule("zigzag", 2, 0, 2)
    with pytest.raises(ValueError):
        pipeline.schedule("1f1b", 2, 0, 2, v=2)


def test_stage_layers_and_neighbours():
    # 10 layers, 2 stages x 2 chunks: parts [0,3) [3,6) [6,8) [8,10); stage 0 holds parts 0 and 2.
    assert stage_layers(10, 2, 0, virtual=2) == [range(0, 3), range(6, 8)]
    assert stage_layers(10, 2, 1, virtual=2) == [range(3, 6), range(8, 10)]
    assert stage_layers(5, 3, 2, sizes=[1, 1, 3]) == [range(2, 5)]
    for p, v, n in ((1, 1, 3), (1, 3, 3), (3, 1, 7), (4, 2, 8), (5, 3, 17)):
        chunks = {(s, c): r for s in range(p) for c, r in enumerate(stage_layers(n, p, s, virtual=v))}
        assert sorted(i for r in chunks.values() for i in r) == list(range(n))  # each layer once
        for (s, c), r in chunks.items():
            after, before = neighbour(p, v, s, c, +1), neighbour(p, v, s, c, -1)
            if r.stop == n:
                assert after is None
            else:  # the stage after holds the chunk that starts where this one stops
                assert any(q.start == r.stop for (t, _), q in chunks.items() if t == after)
            if r.start == 0:
                assert before is None
            else:
                assert any(q.stop == r.start for (t, _), q in chunks.items() if t == before)


def test_the_timeline_names_orders_that_cannot_finish():
    """Orders whose stages wait on each other, or on an action no stage runs, are refused by name."""
    from dt.parallel.pipeline.timeline import play_orders

    crossed = ((("B", 0, 0), ("F", 0, 0)), (("F", 0, 0), ("B", 0, 0)))  # stage 0 backward before forward
    with pytest.raises(RuntimeError, match="wait on each other forever"):
        play_orders(crossed, 1, (1.0, 1.0), (1.0, 1.0))
    with pytest.raises(RuntimeError, match="which no stage runs"):
        play_orders(((("B", 0, 0),), (("F", 0, 0),)), 1, (1.0, 1.0), (1.0, 1.0))
    played = play_orders(((("F", 0, 0), ("B", 0, 0)), (("F", 0, 0), ("B", 0, 0))), 1, (1.0, 2.0), (3.0, 4.0),
                         send=0.5)
    assert [(a.start, a.end) for a in played[1]] == [(1.5, 3.5), (3.5, 7.5)]
    assert [(a.start, a.end) for a in played[0]] == [(0.0, 1.0), (8.0, 11.0)]
