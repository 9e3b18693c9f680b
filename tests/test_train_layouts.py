"""Layouts dt train used to refuse, each against the plain model trained in one process.

ZeRO through the step with clipping from the sharded gradients; recompute
(bit for bit the losses without it); ZeRO with experts (the dense part over
dp x cp, each expert over its replicas).

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

from dt import train, transport
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
    fsdp, opt = built.parallel_model.fsdp, built.optimizer  # FSDP's formulas are its modules', one a chunk
    if fsdp:  # each chunk gathers for each micro-batch's forward and backward
        formula = sum(f.expected_bytes_sent(args.micro_batches) for f in fsdp)
        state = (fsdp[0].memory(opt)["optimizer"], sum(f.formula(k=16)["optimizer"] for f in fsdp))
    elif hasattr(opt, "expected_bytes_sent"):  # a backward per micro-batch and chunk: ZeRO 2 scatters
        formula = opt.expected_bytes_sent(args.micro_batches * args.virtual)  # every bucket in each
        state = (opt.memory()["optimizer"], opt.formula(k=16)["optimizer"])
    else:
        formula = state = None
    return {"losses": losses, "norm": built.step.stats["grad_norm"], "sent": sent, "formula": formula,
            # Adam's two float64 moments: K = 16 bytes per parameter, each part over its own ranks
            "state": state,
            "recomputed": sum(recomputed(m) for c in built.parallel_model.stage.chunks for m in c.modules()),
            # FSDP's gathers issued ahead, and those its units took (dt.parallel.zero.prefetch)
            "prefetched": [(f.prefetch.issued, f.prefetch.taken) for f in fsdp]}


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


RECOMPUTED = [("gpt", {"pp": 2, "schedule": "gpipe"}, "full"), ("llama", {"tp": 2}, "full"),
              ("gpt", {"dp": 2, "zero": 2}, "full"), ("llama", {"pp": 2, "clip": 0.5}, "full"),
              ("gpt", {"dp": 2, "zero": 3, "clip": 0.5}, "full"), ("llama", {"dp": 2, "zero": 3}, "full"),
              ("gpt", {"dp": 2}, "selective"), ("llama", {"dp": 2}, "selective"),
              ("gpt", {"tp": 2}, "selective"), ("llama", {"tp": 2}, "selective"),
              ("gpt", {"pp": 2}, "selective"), ("gpt", {"cp": 2}, "selective"),
              ("llama", {"dp": 2, "zero": 3}, "selective")]


@pytest.mark.timeout(300)
def test_recompute_gives_the_same_losses_bit_for_bit(run):
    """--recompute full reruns each block's forward in backward, selective only each attention
    core's: the same operations on the same values, so every loss is exactly the one without it
    (and the plain model's, to float64 precision); under FSDP each unit gathers again in a
    block's rerun instead of in backward (the same bytes; a core has no unit)."""
    both = [run_ for m, kw, how in RECOMPUTED for run_ in ((m, kw), (m, {**kw, "recompute": how}))]
    results = run(2, _stepped, both, timeout=280)
    for k, (model, kw, how) in enumerate(RECOMPUTED):
        want, _ = _twin(_args(model, **kw))
        for r in results:
            plain, again = r[2 * k], r[2 * k + 1]
            assert again["losses"] == plain["losses"], f"{model} {kw}: recompute {how} changed the losses"
            assert plain["recomputed"] == 0 and again["recomputed"] > 0  # its blocks (or cores) recompute
            assert max(abs(a - b) for a, b in zip(again["losses"], want)) < 1e-9, f"{model} {kw}"
            # FSDP: the rerun's gather replaces backward's (tp's collectives do run again)
            assert again["sent"]["data"] == plain["sent"]["data"], (model, kw, again["sent"], plain["sent"])
            assert again["formula"] is None or again["sent"]["data"] == again["formula"], (model, kw)
            if how == "selective":  # the core alone reruns: no tensor-parallel collective in it
                assert again["sent"]["tensor"] == plain["sent"]["tensor"], (model, kw)


EXPERTS = {"experts": 4, "top_k": 2, "capacity_factor": 1.0, "aux_loss_coef": 0.05}
EXPERT_ZERO = {2: [("gpt", {"dp": 2, "ep": 2, "zero": 1, **EXPERTS}),
                   ("gpt", {"dp": 2, "zero": 2, **EXPERTS}),
                   ("gpt", {"dp": 2, "ep": 2, "zero": 2, "clip": 0.05, **EXPERTS})],
               4: [("gpt", {"dp": 4, "ep": 2, "zero": 1, "clip": 0.05, **EXPERTS}),
                   ("gpt", {"dp": 2, "tp": 2, "ep": 2, "zero": 2, **EXPERTS})]}


def _follows_the_twin(got: dict, want: list[float], norms: list[float], kw: dict, model: str = "") -> None:
    """A run's losses against the single-process twin's, its clipped norm, its data bytes = formula."""
    diff = max(abs(a - b) for a, b in zip(got["losses"], want))
    assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
    if "clip" in kw:
        assert norms[-1] > kw["clip"] and math.isclose(got["norm"], norms[-1], rel_tol=1e-12), kw
    assert got["sent"]["data"] == got["formula"], (kw, got["sent"], got["formula"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_zero_with_experts_follows_the_plain_model(run, world):
    """Dense parameters sharded over dp x cp, each expert's over its edp replicas (summed there, divided
    by dp x cp): the plain MoE GPT's losses and clipped norm, ZeRO's bytes and state per part."""
    runs = EXPERT_ZERO[world]
    results = run(world, _stepped, runs, timeout=280)
    for k, (model, kw) in enumerate(runs):
        want, norms = _twin(_args(model, **kw))
        assert want[-1] < want[0] - 0.1
        for r in results:
            got = r[k]
            _follows_the_twin(got, want, norms, kw)
            held, formula = got["state"]
            assert held == formula, (kw, held, formula)


TIED_ZERO2 = [("gpt", {"dp": 2, "pp": 2, "zero": 2}), ("llama", {"dp": 2, "pp": 2, "zero": 2, "clip": 0.5}),
              ("gpt", {"dp": 2, "pp": 2, "zero": 2, "schedule": "interleaved", "virtual": 2})]


@pytest.mark.timeout(300)
def test_zero_2_sums_the_tied_weight_across_stages(run):
    """ZeRO 2 with the embedding and head tied across two stages: the tied weight keeps its full
    gradient, the step sums it over its stages, then ZeRO reduce-scatters it once (the formula's
    bytes: the other gradients once per micro-batch, the tied one once per step)."""
    results = run(4, _stepped, TIED_ZERO2, timeout=280)
    for k, (model, kw) in enumerate(TIED_ZERO2):
        want, norms = _twin(_args(model, **kw))
        for r in results:
            got = r[k]
            _follows_the_twin(got, want, norms, kw, model)
            assert got["sent"]["tied embedding"] > 0 and got["sent"]["other"] == 0


LLAMA_CP = [("llama", {"cp": 2, "dp": 2, "n_kv_head": 2}),
            ("llama", {"cp": 2, "tp": 2, "cp_attention": "ulysses"}),
            ("llama", {"cp": 2, "pp": 2, "zero": 1, "dp": 1, "clip": 0.5})]


@pytest.mark.timeout(300)
def test_llama_with_context_parallel_follows_the_plain_model(run):
    """Llama under cp (ring and Ulysses; grouped-query attention; a pipeline): each rank's rotary
    positions are its zig-zag share (SharePositions on the model's rotary module, on every stage)."""
    results = run(4, _stepped, LLAMA_CP, timeout=280)
    for k, (model, kw) in enumerate(LLAMA_CP):
        want, norms = _twin(_args(model, **kw))
        assert want[-1] < want[0] - 0.1
        for r in results:
            diff = max(abs(a - b) for a, b in zip(r[k]["losses"], want))
            assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
            if "clip" in kw:
                assert math.isclose(r[k]["norm"], norms[-1], rel_tol=1e-12), kw


FSDP = {2: [("gpt", {"dp": 2, "zero": 3}), ("gpt", {"dp": 2, "zero": 3, "no_prefetch": True}),
            ("llama", {"dp": 2, "zero": 3, "clip": 0.5}),
            ("gpt", {"dp": 2, "ep": 2, "zero": 3, **EXPERTS}),
            ("gpt", {"dp": 2, "zero": 3, "clip": 0.05, **EXPERTS}),
            # FSDP over dp x cp is the cp group itself here: its gathers ahead share the channels
            # ring attention's hops take (dt.transport.asynchronous.after_queued orders them)
            ("gpt", {"cp": 2, "zero": 3})],
        4: [("gpt", {"dp": 2, "tp": 2, "zero": 3, "clip": 0.5}), ("gpt", {"cp": 2, "dp": 2, "zero": 3}),
            ("gpt", {"dp": 2, "pp": 2, "zero": 3, "clip": 0.5}),
            ("llama", {"dp": 2, "pp": 2, "zero": 3, "schedule": "interleaved", "virtual": 2,
                       "recompute": True}),
            ("gpt", {"dp": 4, "ep": 2, "zero": 3, "clip": 0.05, **EXPERTS}),
            ("gpt", {"dp": 2, "pp": 2, "ep": 2, "zero": 3, "recompute": True, **EXPERTS}),
            ("gpt", {"dp": 2, "pp": 2, "zero": 3, "no_prefetch": True})]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_through_the_step_follows_the_plain_model(run, world):
    """--zero 3: FSDP over dp x cp through the same TrainStep and make_optimizer (tied embedding and
    head one unit; tp slices sharded further; two micro-batches, each gathering its own copy); on a
    pipeline FSDP per chunk over its stage's dp group, the tied weight's shards summed over its two
    stages (counted once in the clipped norm), with interleaved chunks and recompute; with experts
    the dense units over dp x cp, each expert's over its replicas (edp: summed, / dp x cp). Each
    unit's gathers are issued one unit ahead (every one of them taken by its unit), or with
    --no-prefetch each made when its unit runs: the same losses and bytes either way."""
    runs = FSDP[world]
    results = run(world, _stepped, runs, timeout=280)
    for k, (model, kw) in enumerate(runs):
        want, norms = _twin(_args(model, **kw))
        for r in results:
            diff = max(abs(a - b) for a, b in zip(r[k]["losses"], want))
            assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
            if "clip" in kw:
                assert norms[-1] > kw["clip"] and math.isclose(r[k]["norm"], norms[-1], rel_tol=1e-12), kw
            # every forward and backward gathers, every backward scatters: all charged to data
            assert r[k]["sent"]["data"] == r[k]["formula"], (kw, r[k])
            assert r[k]["sent"]["other"] == 0, (kw, r[k])  # ring attention: the context label
            assert (r[k]["sent"]["tied embedding"] > 0) == ("pp" in kw), (kw, r[k])  # summed on shards
            assert r[k]["state"][0] == r[k]["state"][1], (kw, r[k]["state"])  # Adam's state: 1 / (dp x cp)
            issued, taken = (sum(c) for c in zip(*r[k]["prefetched"]))
            assert issued == taken and (issued > 0) != ("no_prefetch" in kw), (kw, r[k]["prefetched"])


def _resume_fsdp(a: str, b: str) -> list[list[float]]:
    """Straight; FSDP saves at 2, a pipeline resumes; tensor parallel saves at 2, FSDP resumes."""
    straight = train.train_worker(_args("gpt", dp=2, steps=4))["losses"]
    train.train_worker(_args("gpt", dp=2, zero=3, steps=2, checkpoint=a))
    on_pp = train.train_worker(_args("gpt", pp=2, steps=4, checkpoint=a))
    train.train_worker(_args("gpt", tp=2, steps=2, checkpoint=b))
    on_fsdp = train.train_worker(_args("gpt", dp=2, zero=3, steps=4, checkpoint=b))
    assert on_pp["start"] == on_fsdp["start"] == 2 and on_pp["resumed"]["layout"]["zero"] == 3
    return [straight, on_pp["losses"], on_fsdp["losses"]]


@pytest.mark.timeout(200)
def test_fsdp_checkpoints_resume_on_other_layouts(run, tmp_path):
    """FSDP's shards are saved as pieces of the plain model's tensors (and Adam's state beside them):
    a pipeline resumes from them, and FSDP resumes from a tensor-parallel checkpoint."""
    straight, on_pp, on_fsdp = run(2, _resume_fsdp, str(tmp_path / "a"), str(tmp_path / "b"), timeout=180)[0]
    for resumed in (on_pp, on_fsdp):
        assert max(abs(x - y) for x, y in zip(resumed, straight[2:])) < 1e-9, (resumed, straight)


def _resume_fsdp_pipeline(a: str, b: str) -> list[list[float]]:
    """Straight; FSDP on a pipeline saves at 2, FSDP on one stage resumes; a tensor-parallel
    pipeline saves at 2, FSDP on the pipeline resumes."""
    straight = train.train_worker(_args("gpt", dp=4, steps=4))["losses"]
    train.train_worker(_args("gpt", dp=2, pp=2, zero=3, steps=2, checkpoint=a))
    on_one = train.train_worker(_args("gpt", dp=4, zero=3, steps=4, checkpoint=a))
    train.train_worker(_args("gpt", tp=2, pp=2, steps=2, checkpoint=b))
    on_pp = train.train_worker(_args("gpt", dp=2, pp=2, zero=3, steps=4, checkpoint=b))
    assert on_one["start"] == on_pp["start"] == 2 and on_one["resumed"]["layout"]["zero"] == 3
    return [straight, on_one["losses"], on_pp["losses"]]


@pytest.mark.timeout(240)
def test_fsdp_on_a_pipeline_checkpoints_resume_on_other_layouts(run, tmp_path):
    """Each stage's FSDP shards are pieces of the plain model's tensors (the tied weight written by
    its first stage): one stage resumes from them, and FSDP on a pipeline from a tp x pp run."""
    straight, on_one, on_pp = run(4, _resume_fsdp_pipeline, str(tmp_path / "a"), str(tmp_path / "b"),
                                  timeout=220)[0]
    for resumed in (on_one, on_pp):
        assert max(abs(x - y) for x, y in zip(resumed, straight[2:])) < 1e-9, (resumed, straight)


def _resume_fsdp_experts(a: str, b: str) -> list[list[float]]:
    """Straight (ep 2, no ZeRO); FSDP with ep 2 saves at 2, ZeRO 1 with ep 1 resumes; ZeRO 1 with
    ep 2 saves at 2, FSDP with ep 1 resumes (experts named by global index: any ep reads them)."""
    straight = train.train_worker(_args("gpt", dp=2, ep=2, steps=4, **EXPERTS))["losses"]
    train.train_worker(_args("gpt", dp=2, ep=2, zero=3, steps=2, checkpoint=a, **EXPERTS))
    on_zero = train.train_worker(_args("gpt", dp=2, zero=1, steps=4, checkpoint=a, **EXPERTS))
    train.train_worker(_args("gpt", dp=2, ep=2, zero=1, steps=2, checkpoint=b, **EXPERTS))
    on_fsdp = train.train_worker(_args("gpt", dp=2, zero=3, steps=4, checkpoint=b, **EXPERTS))
    assert on_zero["start"] == on_fsdp["start"] == 2 and on_zero["resumed"]["layout"]["zero"] == 3
    return [straight, on_zero["losses"], on_fsdp["losses"]]


@pytest.mark.timeout(200)
def test_fsdp_with_experts_checkpoints_resume_on_other_layouts(run, tmp_path):
    """FSDP's expert shards are pieces of the plain MoE's experts: ZeRO on another ep resumes from
    them, and FSDP from ZeRO's."""
    straight, on_zero, on_fsdp = run(2, _resume_fsdp_experts, str(tmp_path / "a"), str(tmp_path / "b"),
                                     timeout=180)[0]
    for resumed in (on_zero, on_fsdp):
        assert max(abs(x - y) for x, y in zip(resumed, straight[2:])) < 1e-9, (resumed, straight)


def test_what_stays_refused_is_one_line_naming_it(capsys):
    """FSDP with a tied weight in two chunks of one rank; a Llama with experts (it has no MoE);
    sequence parallel without tp, with experts, or on a sequence that does not split; a recompute
    that is not one of the kinds."""
    cases = [(["--zero", "3", "--dp", "2", "--schedule", "interleaved", "--virtual", "2"],
              "two chunks of one rank"),
             (["--model", "llama", "--experts", "2"], "no mixture of experts"),
             (["--sequence-parallel"], "it needs --tp > 1"),
             (["--tp", "2", "--experts", "2", "--sequence-parallel"], "routes whole sequences"),
             (["--tp", "2", "--cp", "2", "--block-size", "18", "--sequence-parallel"],
              "divisible by cp * tp = 4"),
             (["--recompute", "attention"], "invalid choice: 'attention'")]
    for argv, why in cases:
        with pytest.raises(SystemExit) as e:
            train.parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and why in err and err.count("\n") == 1, (argv, err)
    for argv in (["--zero", "3", "--dp", "2"], ["--model", "llama", "--cp", "2"],
                 ["--pp", "2", "--zero", "2"], ["--zero", "2", "--dp", "2", "--experts", "2", "--clip", "1"],
                 ["--recompute"], ["--zero", "3", "--dp", "2", "--recompute"],
                 ["--zero", "3", "--dp", "2", "--pp", "2"], ["--zero", "3", "--dp", "2", "--experts", "2"],
                 ["--tp", "2", "--pp", "2", "--sequence-parallel", "--recompute", "selective"],
                 ["--zero", "3", "--dp", "2", "--no-prefetch"]):
        train.parse_args(argv)  # each accepted now


def test_a_layouts_recompute_is_a_kind_or_the_older_bool():
    """dt plan's layouts say recompute as a bool (True: full) or a kind's name; dt plan --check
    passes the kind to dt train, whose rule takes either."""
    from dt.plan.check import train_argv
    from dt.plan.layouts import Layout, train_args
    from dt.plan.model import ModelShape
    from dt.train.layouts import layout_error

    shape = ModelShape(2, 4, 16, 44)
    for given, kind in ((False, "none"), (True, "full"), ("none", "none"), ("selective", "selective"),
                        ("full", "full")):
        lay = Layout(dp=2, recompute=given)
        assert layout_error(train_args(lay, shape, 4, 8)) is None
        assert train.parse_args(train_argv(lay, shape, 4, 8, 1)).recompute == kind
    assert "--recompute must be one of none, selective, full" in layout_error(
        train_args(Layout(dp=2, recompute="half"), shape, 4, 8))


# The gradient thread's sync beside the main thread's context-parallel sends on the same ranks:
# dp 1 x cp 2, so the dp x cp plane is the cp pair. Before the plane got a process group of its
# own (dt.parallel.grid.GRADIENT_SYNC), ZeRO 2's reduce-scatter and DDP's buckets shared the
# cp group's stream with ring attention's backward, and the two calls' messages crossed
# ("rank 2 sent a message of 512 bytes where this receive expects 16384").
CP_BESIDE_SYNC = [("gpt", {"pp": 2, "cp": 2, "dp": 1, "zero": 2, "schedule": "gpipe", "micro_batches": 4}),
                  ("gpt", {"pp": 2, "cp": 2, "dp": 1, "zero": 0, "micro_batches": 4})]


@pytest.mark.timeout(300)
def test_gradient_sync_beside_ring_attention_on_the_same_ranks(run):
    results = run(4, _stepped, CP_BESIDE_SYNC, timeout=280)
    for k, (model, kw) in enumerate(CP_BESIDE_SYNC):
        want, _ = _twin(_args(model, **kw))
        for r in results:
            got = r[k]
            diff = max(abs(a - b) for a, b in zip(got["losses"], want))
            assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
            if got["formula"] is not None:  # ZeRO 2's bytes: its formula (DDP has none here)
                assert got["sent"]["data"] == got["formula"], (kw, got["sent"], got["formula"])
            assert got["sent"]["context"] > 0 and got["sent"]["data"] > 0


SP = {"tp": 2, "sequence_parallel": True}
SEQUENCE_PARALLEL = [("gpt", {**SP, "dp": 2}), ("llama", {**SP, "dp": 2, "n_kv_head": 2}),
                     ("gpt", {**SP, "pp": 2}),
                     ("llama", {**SP, "pp": 2, "schedule": "interleaved", "virtual": 2}),
                     ("gpt", {**SP, "dp": 2, "zero": 3, "clip": 0.5}), ("gpt", {**SP, "cp": 2}),
                     ("gpt", {**SP, "dp": 2, "untied": True, "recompute": "selective"}),
                     ("llama", {**SP, "pp": 2, "recompute": "full"})]


@pytest.mark.timeout(300)
def test_sequence_parallel_follows_the_plain_model(run):
    """--sequence-parallel: the norms and the residual stream on block/tp tokens per rank (a pipeline
    carries each rank's share of the sequence between stages; Llama's rotary tables are the whole
    sequence's), with data parallel, FSDP, context parallel and recompute: the plain model's losses."""
    results = run(4, _stepped, SEQUENCE_PARALLEL, timeout=280)
    for k, (model, kw) in enumerate(SEQUENCE_PARALLEL):
        want, norms = _twin(_args(model, **kw))
        for r in results:
            diff = max(abs(a - b) for a, b in zip(r[k]["losses"], want))
            assert diff < 1e-9, f"{model} {kw}: max loss difference {diff}"
            if "clip" in kw:
                assert math.isclose(r[k]["norm"], norms[-1], rel_tol=1e-12), kw
            assert r[k]["sent"]["tensor"] > 0 and r[k]["sent"]["other"] == 0, (kw, r[k]["sent"])
