"""`dt train` as a trainer: validation loss on every mesh, the learning-rate schedule, bf16, metrics.

Every mesh is held to one process's numbers (float64): the training losses
and the validation losses, which run forward only (the pipeline's
forward schedule, the vocab-parallel loss, averaged over dp x cp).
"""

from __future__ import annotations

import json

import pytest

from dt import train
from dt.train.schedule import WarmupCosine

STEPS = 6
BASE = ["--steps", str(STEPS), "--batch-size", "8", "--block-size", "8", "--n-layer", "2", "--n-head", "4",
        "--n-embd", "16", "--lr", "1e-2", "--no-progress", "--threads", "1", "--micro-batches", "2",
        "--eval-every", "3", "--eval-batches", "2", "--warmup", "2", "--lr-min", "1e-3"]


def _train(argv: list[str]) -> dict:
    return train.train_worker(train.parse_args(BASE + argv))


def _curves(argv: list[str]) -> tuple[list[float], list[tuple[int, float]]]:
    out = _train(["--dtype", "float64", *argv])
    return out["losses"], out["val_losses"]


@pytest.mark.timeout(400)
def test_validation_loss_is_the_same_on_every_mesh(run):
    ref_losses, ref_val = run(1, _curves, [])[0]
    assert [n for n, _ in ref_val] == [3, 6]  # every --eval-every steps, and the last
    for mesh in (["--dp", "2", "--tp", "2"], ["--pp", "2", "--dp", "2"], ["--cp", "2", "--tp", "2"]):
        for losses, val in run(4, _curves, mesh):  # every rank returns the same figures
            assert losses == pytest.approx(ref_losses, rel=1e-10), mesh
            assert [n for n, _ in val] == [3, 6]
            assert [v for _, v in val] == pytest.approx([v for _, v in ref_val], rel=1e-10), mesh


def _metrics(path: str) -> dict:
    return _train(["--metrics", path, "--clip", "0.5"])


@pytest.mark.timeout(200)
def test_metrics_lines_carry_the_schedule_the_losses_and_the_split(run, tmp_path):
    path = str(tmp_path / "m.jsonl")
    out = run(1, _metrics, path)[0]
    marker, *lines = [json.loads(line) for line in open(path)]
    assert marker["run"]["from_step"] == 0 and marker["run"]["lr"] == 1e-2  # the run's options, first
    assert lines == out["metrics"] and [r["step"] for r in lines] == list(range(1, STEPS + 1))
    lr = WarmupCosine(peak=1e-2, warmup=2, total=STEPS, floor=1e-3)
    assert [r["lr"] for r in lines] == [lr(s) for s in range(STEPS)]  # applied each step
    assert [r["loss"] for r in lines] == out["losses"]
    assert [("val_loss" in r) for r in lines] == [False, False, True, False, False, True]
    assert [(r["step"], r["val_loss"]) for r in lines if "val_loss" in r] == out["val_losses"]
    # the steady rate leaves the first step (and validation) out: its tokens over the rest's time
    tokens = out["steps"] * 8 * 8
    assert out["steady_tokens_per_s"] > 0 and out["tokens_per_s"] == pytest.approx(tokens / out["wall_s"])
    for r in lines:
        assert r["tokens_per_s"] > 0 and set(r["time"]) == {"compute", "communication", "bubble"}
        assert r["time"]["compute"] > 0
        assert r["grad_norm"] > 0  # the step's global norm (--clip), reported each step


def _16_bit(precision: str) -> list[float]:
    return _train(["--tp", "2", "--precision", precision, "--steps", "10", "--eval-every", "0"])["losses"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision, bits", [("bfloat16", 8), ("float16", 11)])
def test_16_bit_on_a_tensor_parallel_mesh_follows_float32(run, precision, bits):
    ref = run(2, _16_bit, "float32")[0]
    mine = run(2, _16_bit, precision)[0]
    u = 2.0 ** -bits  # the significand's rounding: see tests/test_trainer_precision.py for the bound
    assert mine != ref
    assert max(abs(a - b) / a for a, b in zip(ref, mine)) <= u
