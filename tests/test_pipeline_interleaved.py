"""The interleaved schedule is Megatron's interleaved 1F1B: its order, that no stage waits forever
and every message meets its receive, its stash and bubble, and the pipeline and dt train running
it against the unpipelined model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dt.parallel.pipeline import (
    Pipeline,
    bubble_fraction,
    neighbour,
    peak_stash,
    schedule,
    stage_module,
)
from dt.parallel.pipeline.timeline import play
from tests.test_step import _args, _runs, _twin


def _megatron_slot(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """Megatron's micro-step k -> (chunk, micro-batch) when p divides m: micro-batches go in groups
    of p, each group through every chunk in turn (get_model_chunk_id); backwards reverse the chunks."""
    chunk = (k % (p * v)) // p
    return (chunk if forward else v - 1 - chunk), (k // (p * v)) * p + k % p


def test_the_order_is_megatrons():
    # p = 2, v = 2, m = 4: stage 0 warms up with 2 (p-1) + (v-1) p = 4 forwards, stage 1 with 2
    assert schedule("interleaved", 2, 0, 4, 2) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1), ("F", 0, 2), ("B", 1, 0), ("F", 0, 3),
        ("B", 1, 1), ("F", 1, 2), ("B", 0, 0), ("F", 1, 3), ("B", 0, 1), ("B", 1, 2), ("B", 1, 3),
        ("B", 0, 2), ("B", 0, 3)]
    assert schedule("interleaved", 2, 1, 4, 2) == [
        ("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("F", 0, 2),
        ("B", 0, 0), ("F", 0, 3), ("B", 0, 1), ("F", 1, 2), ("B", 1, 2), ("F", 1, 3), ("B", 1, 3),
        ("B", 0, 2), ("B", 0, 3)]
    for p in range(1, 6):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p):
                for s in range(p):
                    acts = schedule("interleaved", p, s, m, v)
                    warmup = min(2 * (p - s - 1) + (v - 1) * p, v * m)
                    kinds = "".join(kind for kind, _, _ in acts)
                    assert kinds == "F" * warmup + "FB" * (v * m - warmup) + "B" * warmup, (p, v, m, s)
                    for kind, forward in (("F", True), ("B", False)):
                        assert [(c, i) for k, c, i in acts if k == kind] == \
                            [_megatron_slot(k, p, v, forward) for k in range(v * m)], (p, v, m, s, kind)
    for s in range(4):  # one chunk is 1F1B, as Megatron runs a virtual size of 1
        assert schedule("interleaved", 4, s, 6, 1) == schedule("1f1b", 4, s, 6)


def test_a_short_last_group_drops_the_missing_micro_batches():
    # m not a multiple of p: the order of the next multiple, less the micro-batches that do not exist
    for p, v, m in ((2, 2, 3), (4, 2, 6), (4, 3, 1), (3, 2, 7)):
        padded = -(-m // p) * p
        for s in range(p):
            assert schedule("interleaved", p, s, m, v) == \
                [(k, c, i) for k, c, i in schedule("interleaved", p, s, padded, v) if i < m], (p, v, m, s)


def _messages(p: int, v: int, orders: list[list[tuple[str, int, int]]]) -> tuple[dict, dict]:
    """Per (sender, receiver) stage pair: the messages in the sender's order, and in the receiver's."""
    sent: dict[tuple[int, int], list] = {}
    taken: dict[tuple[int, int], list] = {}
    for s, acts in enumerate(orders):
        for kind, c, i in acts:
            out, into = (+1, -1) if kind == "F" else (-1, +1)  # forwards send on, backwards back
            dst, src = neighbour(p, v, s, c, out), neighbour(p, v, s, c, into)
            if dst is not None:
                sent.setdefault((s, dst), []).append((kind, c * p + s + out, i))
            if src is not None:
                taken.setdefault((src, s), []).append((kind, c * p + s, i))
    return sent, taken


@pytest.mark.parametrize("name,virtual", [("gpipe", (1,)), ("1f1b", (1,)), ("interleaved", (1, 2, 3, 4))])
def test_no_stage_waits_forever_and_messages_meet_in_order(name, virtual):
    """Played out, every stage reaches its last action (timeline.play raises on a deadlock); and
    between two ranks (or a rank and itself) messages leave in the order the receiver takes them,
    which the runtime needs: it matches a receive to the next message from that peer."""
    for p in range(1, 7):
        for v in virtual:
            for m in range(1, 14):
                play(name, p, m, v, (1.0,) * p, (2.0,) * p)
                sent, taken = _messages(p, v, [schedule(name, p, s, m, v) for s in range(p)])
                assert sent == taken, (name, p, v, m)


def test_the_stash_is_megatrons():
    """Stage 0 holds p v + p - 1 chunks' activations, Megatron's p (1 + (p-1)/(p v)) micro-batches of
    its layers, once the first group's warm-up fits (m >= 2p); stage s holds 2 (p-s-1) fewer."""
    for p in range(2, 9):
        for v in (2, 3, 4):
            for m in (2 * p, 3 * p, 5 * p):
                assert peak_stash("interleaved", p, 0, m, v) / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
                for s in range(p):
                    assert peak_stash("interleaved", p, s, m, v) == 2 * (p - s - 1) + (v - 1) * p + 1
            for s in range(p):  # one group: every forward comes before the first backward on stage 0
                assert peak_stash("interleaved", p, s, p, v) == min(2 * (p - s - 1) + (v - 1) * p + 1, v * p)
            for m in range(1, 3 * p):  # a short last group holds no more than a whole one
                padded = -(-m // p) * p
                assert peak_stash("interleaved", p, 0, m, v) <= peak_stash("interleaved", p, 0, padded, v)


def test_the_played_order_idles_the_bubble_formula():
    for p in range(2, 7):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p):
                played = play("interleaved", p, m, v, (1.0 / v,) * p, (2.0 / v,) * p)
                step = max(acts[-1].end for acts in played)
                assert 1 - 3 * m / step == pytest.approx(bubble_fraction(p, m, v)), (p, v, m)


BATCH = 8


def _chunked_model() -> nn.Sequential:
    """12 layers: 4 stages x 3 chunks of one layer each, or fewer, longer chunks."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(4, 4) if k % 2 == 0 else nn.Tanh() for k in range(12)]).double()


def _interleaved_vs_reference(cases: list[tuple[int, int]]) -> list[str]:
    """Each (v, m): the loss, every gradient and the peak stash (the replay's) against one process."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 4, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, 4, generator=g, dtype=torch.float64)
    failures = []
    for v, m in cases:
        ref = _chunked_model()
        ref_loss = nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        model = _chunked_model()
        stage = stage_module(model, None, virtual=v)
        pipe = Pipeline(stage)
        loss = pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None,
                               nn.functional.mse_loss, micro_batches=m, schedule_name="interleaved")
        tag = f"v={v} p={pipe.stages} m={m} stage={pipe.stage}"
        if pipe.is_last and abs(loss - ref_loss.item()) > 1e-12:
            failures.append(f"{tag}: loss {loss} != {ref_loss.item()}")
        mine = {id(q) for q in stage.parameters()}
        for q, ref_q in zip(model.parameters(), ref.parameters()):
            if id(q) in mine and not torch.allclose(q.grad, ref_q.grad, atol=1e-12, rtol=0):
                failures.append(f"{tag}: gradient differs by {(q.grad - ref_q.grad).abs().max()}")
        want = peak_stash("interleaved", pipe.stages, pipe.stage, m, v)
        if pipe.stats.peak_stash != want:
            failures.append(f"{tag}: peak stash {pipe.stats.peak_stash}, the replay's {want}")
    return failures


@pytest.mark.parametrize("world,micro_batches", [(2, (2, 3, 4)), (4, (3, 4, 6, 8))])
def test_the_pipeline_runs_it_like_one_process(run, world, micro_batches):
    # m = p, 2p, one that p does not divide (and m < p at p = 4), with 2 and 3 chunks per stage
    cases = [(v, m) for v in (2, 3) for m in micro_batches]
    results = run(world, _interleaved_vs_reference, cases)
    assert [f for r in results for f in r] == []


TRAINED = {2: [("gpt", {"pp": 2, "schedule": "interleaved", "virtual": 2, "micro_batches": 3}),
               ("gpt", {"pp": 2, "schedule": "interleaved", "virtual": 3, "n_layer": 4, "micro_batches": 4})],
           4: [("gpt", {"pp": 4, "schedule": "interleaved", "virtual": 2, "n_layer": 6, "batch_size": 8,
                        "micro_batches": 8}),
               ("llama", {"pp": 4, "schedule": "interleaved", "virtual": 3, "n_layer": 10, "batch_size": 8,
                          "micro_batches": 6})]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_dt_train_runs_it_like_the_plain_model(run, world):
    """dt train --schedule interleaved: m = 2p, and m that p does not divide, with 2 and 3 chunks."""
    runs = TRAINED[world]
    results = run(world, _runs, runs, timeout=280)
    for k, (model, kw) in enumerate(runs):
        want, _ = _twin(_args(model, **kw))
        got = results[0][k]["losses"]
        assert want[-1] < want[0] - 0.1  # it learns, so a wrong gradient shows
        diff = max(abs(a - b) for a, b in zip(got, want))
        assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
        assert all(r[k]["losses"] == got for r in results), f"{model} {kw}: ranks disagree"
