"""Layouts dt train used to refuse, each against the plain model trained in one process.

ZeRO through the step with clipping from the sharded gradients; recompute
(bit for bit the losses without it).

Each run is dt.train.build's step driven for a few float64 steps on the same
global batches as the single-process twin (tests/test_step.py's _twin): the
losses must follow its trajectory, the clipped norm must be its
clip_grad_norm_ figure, and the bytes the step charges to data parallel must
be ZeRO's formula (ZeroOptimizer.expected_bytes_sent: dt.cost's ring arithmetic; stage 2
reduce-scatters once per micro-batch's backward).
"""

from __future__ import annotations

import math

import pytest

from dt import transport
from dt.models.data import CharData
from dt.parallel.recompute import recomputed
from dt.train.build import build
from tests.test_step import STEPS, _args, _twin


def _stepped(runs: list[tuple[str, dict]]) -> list[dict]:
    """Each run's losses, last clipped norm, and bytes per step by kind, next to ZeRO's formula."""
    out, validating = [], transport.validation_enabled()
    transport.set_validation(False)  # as dt train runs: its signature exchange would be bytes too
    try:
        for model, kw in runs:
            out.append(_stepped_one(model, kw))
    finally:
        transport.set_validation(validating)
    return out


def _stepped_one(model: str, kw: dict) -> dict:
    args = _args(model, **kw)
    data = CharData(seed=args.seed)
    built = build(args, data.vocab_size)
    per_rank = args.batch_size // args.dp
    mine = slice(built.coords[0] * per_rank, (built.coords[0] + 1) * per_rank)
    losses = []
    for i in range(STEPS):
        x, y = data.batch(i, args.batch_size, args.block_size)
        losses.append(built.step(x[mine], y[mine]))
    sent = {k: v / STEPS for k, v in built.step.bytes_sent.items()}
    formula = getattr(built.optimizer, "expected_bytes_sent", None)
    return {"losses": losses, "norm": built.step.stats["grad_norm"], "sent": sent,
            "formula": formula(args.micro_batches) if formula else None,
            "recomputed": sum(recomputed(m) for c in built.saved.stage.chunks for m in c.modules())}


CLIPPED = [("gpt", {"dp": 2, "tp": 2, "zero": 1, "clip": 0.5}),
           ("gpt", {"dp": 2, "pp": 2, "zero": 2, "untied": True, "clip": 0.5}),
           ("llama", {"dp": 4, "zero": 2, "clip": 0.5})]


@pytest.mark.timeout(240)
def test_clip_under_zero_is_the_unsharded_clip(run):
    """The global norm from each rank's shard of the averaged gradient (summed over dp x cp, then
    pp x tp; tp replicas and the tied weight once) equals the plain model's, to float64 precision."""
    results = run(4, _stepped, CLIPPED, timeout=220)
    for k, (model, kw) in enumerate(CLIPPED):
        want, norms = _twin(_args(model, **kw))
        assert min(norms) > kw["clip"]  # the clip bites every step: a wrong norm changes the trajectory
        got = results[0][k]
        diff = max(abs(a - b) for a, b in zip(got["losses"], want))
        assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
        for r in results:
            assert math.isclose(r[k]["norm"], norms[-1], rel_tol=1e-12), (kw, r[k]["norm"], norms[-1])
            assert r[k]["losses"] == got["losses"]
            assert r[k]["sent"]["data"] == r[k]["formula"], (kw, r[k]["sent"], r[k]["formula"])
            assert r[k]["sent"]["norm"] > 0 and r[k]["sent"]["other"] == 0


RECOMPUTED = [("gpt", {"pp": 2, "schedule": "gpipe"}), ("llama", {"tp": 2}), ("gpt", {"dp": 2, "zero": 2}),
              ("llama", {"pp": 2, "clip": 0.5})]


@pytest.mark.timeout(200)
def test_recompute_gives_the_same_losses_bit_for_bit(run):
    """--recompute reruns each block's forward in backward: the same operations on the same values,
    so every loss is exactly the one without it (and the plain model's, to float64 precision)."""
    both = [run_ for m, kw in RECOMPUTED for run_ in ((m, kw), (m, {**kw, "recompute": True}))]
    results = run(2, _stepped, both, timeout=180)
    for k, (model, kw) in enumerate(RECOMPUTED):
        want, _ = _twin(_args(model, **kw))
        for r in results:
            plain, again = r[2 * k], r[2 * k + 1]
            assert again["losses"] == plain["losses"], f"{model} {kw}: recompute changed the losses"
            assert plain["recomputed"] == 0 and again["recomputed"] > 0  # its stage's blocks recompute
            assert max(abs(a - b) for a, b in zip(again["losses"], want)) < 1e-9, f"{model} {kw}"
