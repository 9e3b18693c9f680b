"""dt.train.step.TrainStep against the plain model trained in one process, on both shipped models.

The twin is the plain model (dt.models.gpt.GPT, dt.models.llama.Llama)
built from the same seed and trained by a loop of a few lines (forward, mean
loss, backward, Adam); `dt train` on worlds 2 and 4 (dp, tp, pp, ZeRO,
schedules, tied and untied) must follow its float64 loss trajectory.
"""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from dt import train
from dt.models.data import CharData
from dt.models.lm import lm_loss
from dt.train.build import build, plain_model

# 4 steps: every twin learns by then (the assertion below) and the clip bites on each
STEPS = 4


def _args(model: str, dp: int = 1, tp: int = 1, pp: int = 1, **kw: object) -> argparse.Namespace:
    argv = ["--model", model, "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--steps", str(STEPS),
            "--batch-size", "4", "--block-size", "8", "--n-layer", "2", "--n-head", "4", "--n-embd", "16",
            "--dtype", "float64", "--lr", "1e-2", "--no-progress", "--threads", "1",
            "--micro-batches", str(min(2, 4 // dp))]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return train.parse_args(argv)


def _twin(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """The plain model in one process: its losses, and its gradients' global norm before each clip."""
    data = CharData(seed=args.seed)
    model, _ = plain_model(args, data.vocab_size)
    opt = train.Adam(model.parameters(), lr=args.lr)
    losses, norms = [], []
    for step in range(args.steps):
        x, y = data.batch(step, args.batch_size, args.block_size)
        opt.zero_grad()
        loss = lm_loss(model(x)[0], y)
        loss.backward()
        if args.clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)))
        opt.step()
        losses.append(loss.item())
    return losses, norms


def _runs(runs: list[tuple[str, dict]]) -> list[dict]:
    out = []
    for model, kw in runs:
        args = _args(model, **{k: v for k, v in kw.items() if k != "recompute"})
        args.recompute = kw.get("recompute", False)  # the plan's recompute entries (dt.train.build)
        out.append(train.train_worker(args))
    return out


WORLD2 = [("gpt", {"dp": 2}), ("gpt", {"tp": 2}), ("gpt", {"pp": 2, "schedule": "gpipe"}),
          ("gpt", {"dp": 2, "zero": 1}), ("gpt", {"dp": 2, "zero": 2, "untied": True}),
          ("llama", {"tp": 2}), ("llama", {"pp": 2}), ("llama", {"pp": 2, "untied": True}),
          ("llama", {"dp": 2, "zero": 1}), ("gpt", {"pp": 2, "recompute": True}),
          ("llama", {"tp": 2, "recompute": True})]
WORLD4 = [("gpt", {"dp": 2, "tp": 2}), ("gpt", {"tp": 2, "pp": 2}),
          ("gpt", {"pp": 2, "dp": 2, "schedule": "interleaved", "virtual": 2}),
          ("gpt", {"tp": 2, "pp": 2, "layout": "tp-across"}), ("llama", {"dp": 2, "pp": 2}),
          ("llama", {"tp": 2, "pp": 2, "n_kv_head": 2}), ("gpt", {"cp": 2, "dp": 2, "zero": 1}),
          ("gpt", {"cp": 2, "tp": 2, "cp_attention": "ulysses"}), ("gpt", {"cp": 2, "pp": 2, "clip": 0.5})]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world, runs", [(2, WORLD2), (4, WORLD4)])
def test_layouts_follow_the_plain_model(run, world, runs):
    results = run(world, _runs, runs, timeout=280)
    for k, (model, kw) in enumerate(runs):
        want, _ = _twin(_args(model, **{k_: v for k_, v in kw.items() if k_ != "recompute"}))
        got = results[0][k]["losses"]
        assert want[-1] < want[0] - 0.1  # it learns, so a wrong gradient shows
        diff = max(abs(a - b) for a, b in zip(got, want))
        assert len(got) == STEPS and diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
        assert all(r[k]["losses"] == got for r in results), f"{model} {kw}: ranks disagree"


EXPERTS = {"experts": 4, "top_k": 2, "capacity_factor": 1.0, "aux_loss_coef": 0.05}
WORLD2_EXPERTS = [("gpt", {"dp": 2, "ep": 2, **EXPERTS}), ("gpt", {"dp": 2, **EXPERTS}),
                  ("gpt", {"pp": 2, **EXPERTS}), ("gpt", {"dp": 2, "ep": 2, "clip": 0.05, **EXPERTS})]


@pytest.mark.timeout(200)
def test_experts_follow_the_plain_model(run):
    """Experts on the step: ep 2 (each rank half the experts, summed over edp), ep 1 over dp 2, and
    a pipeline whose stages hold the MoE blocks' balance losses, each against the plain MoE GPT."""
    results = run(2, _runs, WORLD2_EXPERTS, timeout=180)
    for k, (model, kw) in enumerate(WORLD2_EXPERTS):
        want, norms = _twin(_args(model, **kw))
        got = results[0][k]["losses"]
        assert want[-1] < want[0] - 0.1
        diff = max(abs(a - b) for a, b in zip(got, want))
        assert len(got) == STEPS and diff < 1e-9, f"{kw}: max loss difference {diff}"
        if "clip" in kw:  # the norm over every expert (summed over ep) and dense weight, and it bit
            assert norms[-1] > kw["clip"]
            assert all(abs(r[k]["grad_norm"] - norms[-1]) < 1e-9 for r in results), kw
        assert all(r[k]["losses"] == got for r in results), f"{kw}: ranks disagree"
        moe = [r[k]["moe"] for r in results]
        assert all(m["assignments"] > 0 for m in moe) and all(r[k]["bytes_sent"]["expert"] >= 0
                                                               for r in results)
    ep2 = [r[0]["bytes_sent"]["expert"] for r in results]
    assert all(b > 0 for b in ep2)  # ep 2's all-to-alls charged to the expert label, not "other"


def _clipped(runs: list[tuple[str, dict]]) -> list[tuple[list[float], float | None, dict]]:
    out = []
    for model, kw in runs:
        res = train.train_worker(_args(model, **kw))
        out.append((res["losses"], res["grad_norm"], res["bytes_sent"]))
    return out


@pytest.mark.timeout(200)
def test_clipping_by_the_global_norm_over_tp_pp_and_dp(run):
    """The norm of the whole gradient: tp shards' squares summed, replicas and the tied weight once."""
    runs = [("gpt", {"tp": 2, "pp": 2, "clip": 0.5}), ("gpt", {"dp": 2, "tp": 2, "clip": 0.5}),
            ("llama", {"tp": 2, "pp": 2, "clip": 0.5})]
    results = run(4, _clipped, runs, timeout=180)
    for k, (model, kw) in enumerate(runs):
        want, norms = _twin(_args(model, **kw))
        assert min(norms) > 0.5  # the clip bites every step: a wrong norm changes the trajectory
        losses, norm, sent = results[0][k]
        assert max(abs(a - b) for a, b in zip(losses, want)) < 1e-9, f"{model} {kw}"
        assert all(math.isclose(r[k][1], norms[-1], rel_tol=1e-9) for r in results), (kw, norm, norms)
        assert sent["other"] == 0 and sent["tensor"] > 0  # every byte under its package's label
        if kw.get("dp"):
            assert sent["data"] > 0


class _Recording:
    """A precision object (dt.train.step's interface) that records its calls; optionally refuses."""

    def __init__(self, refuse: bool):
        self.refuse, self.calls = refuse, {"autocast": 0, "scale": 0, "unscale": 0}

    def autocast(self):  # noqa: ANN201
        import contextlib

        self.calls["autocast"] += 1
        return contextlib.nullcontext()

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self.calls["scale"] += 1
        return loss * 4.0

    def unscale_and_check(self, grads: list[torch.Tensor], group: object) -> bool:
        self.calls["unscale"] += 1
        for g in grads:
            g.div_(4.0)
        return not self.refuse


def _with_precision(refuse: bool) -> tuple[list[float], dict, bool, int]:
    from dt.train.step import TrainStep

    args = _args("gpt", pp=2)
    run_ = build(args, CharData(seed=0).vocab_size)
    precision = _Recording(refuse)
    step = TrainStep(run_.parallel_model, run_.optimizer, micro_batches=2, precision=precision)
    before = [p.detach().clone() for p in run_.parameters]
    data = CharData(seed=0)
    losses = [step(*data.batch(i, 4, 8)) for i in range(3)]
    same = all(torch.equal(a, p) for a, p in zip(before, run_.parameters))
    return losses, precision.calls, same, step.stats["skipped"]


@pytest.mark.timeout(120)
def test_precision_hooks_are_called_where_the_interface_says(run):
    ok, refused = run(2, _with_precision, False)[0], run(2, _with_precision, True)
    want, _ = _twin(_args("gpt"))
    losses, calls, same, skipped = ok
    assert max(abs(a - b) for a, b in zip(losses, want[:3])) < 1e-9  # scaled, then unscaled: the same
    assert calls["unscale"] == 3 and not same and skipped == 0
    assert calls["autocast"] == 3 * 2  # each micro-batch's forward, on each stage
    for losses, calls, same, skipped in refused:
        assert same and skipped == 3 and calls["unscale"] == 3  # every step skipped, nothing moved
        assert abs(losses[0] - want[0]) < 1e-9
    assert refused[1][1]["scale"] == 3 * 2 and refused[0][1]["scale"] == 0  # the loss is on the last stage


def _resume(path: str) -> tuple[list[float], list[float], list[float]]:
    straight = train.train_worker(_args("llama", pp=2, steps=4))["losses"]
    first = train.train_worker(_args("llama", tp=2, steps=2, checkpoint=path))["losses"]
    resumed = train.train_worker(_args("llama", pp=2, steps=4, checkpoint=path))
    assert resumed["start"] == 2
    return straight, first, resumed["losses"]


@pytest.mark.timeout(200)
def test_llama_resumes_on_another_grid(run, tmp_path):
    straight, first, resumed = run(2, _resume, str(tmp_path / "ckpt"), timeout=180)[0]
    assert max(abs(a - b) for a, b in zip(first, straight[:2])) < 1e-9
    assert max(abs(a - b) for a, b in zip(resumed, straight[2:])) < 1e-9  # tp 2 saved, pp 2 resumed


def test_cli_refuses_what_the_step_cannot_do(capsys):
    cases = [(["--model", "llama", "--experts", "2"], "--experts are the GPT's"),
             (["--model", "llama", "--tp", "4", "--n-kv-head", "2"], "divisible by --tp 4")]
    for argv, why in cases:
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert why in capsys.readouterr().err, argv


def _zero_with_experts() -> str:
    """TrainStep given one ZeroOptimizer over every parameter of a model with experts (not
    make_optimizer's, which shards the experts over their replicas): its one-line refusal."""
    from dt.models.gpt import GPT, GPTConfig
    from dt.parallel.grid import Grid
    from dt.parallel.plan import ParallelPlan, gpt_blocks, gpt_plan, parallelize
    from dt.parallel.zero import ZeroOptimizer
    from dt.train.step import TrainStep

    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, n_experts=2)
    par = parallelize(GPT(cfg), Grid({"pp": 1, "dp": 1, "tp": 1}),
                      ParallelPlan(tensor=gpt_plan(cfg, 1), blocks=gpt_blocks, data_parallel="zero1"))
    try:
        TrainStep(par, ZeroOptimizer(par.parameters(), train.Adam, stage=1, lr=1e-3))
    except ValueError as e:
        return str(e)
    return "accepted"


@pytest.mark.timeout(60)
def test_step_refuses_zero_with_experts_in_one_line(run):
    why = run(1, _zero_with_experts, timeout=50)[0]
    assert "only its edp group" in why and "\n" not in why
