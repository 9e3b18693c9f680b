"""What a nanoGPT user expects of `dt train`: --data FOLDER, validation by default, one set of
precision spellings (with dt plan), help and defaults for every option, a resume that reads the
model from its checkpoint, a marker per run in --metrics, the start line, a progress line whose
validation loss says when it was measured."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from dt import args as args_
from dt import train
from dt.plan import cli as plan_cli
from dt.tools.cli import main as dt_main
from dt.train import cli as train_cli
from dt.train.build import plain_model
from dt.train.dataset import GeneratedData
from dt.train.hooks import StepHooks
from dt.train.loop import start_line
from dt.train.metrics import read_metrics
from dt.train.options import EVALS_PER_RUN, data_source
from dt.train.precision import float32_matmuls

SMALL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "8", "--batch-size", "4",
         "--threads", "1", "--no-progress", "--micro-batches", "1"]


def _refused(argv: list[str], capsys) -> str:
    """The one line dt prints for a refused command line (exit status 2)."""
    try:
        rc = dt_main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)
    return err


@pytest.mark.parametrize("typed, name, short", [
    ("bf16", "bfloat16", "bf16"), ("bfloat16", "bfloat16", "bf16"), ("BF16", "bfloat16", "bf16"),
    ("fp16", "float16", "fp16"), ("float16", "float16", "fp16"), ("half", "float16", "fp16"),
    ("fp32", "float32", "fp32"), ("float32", "float32", "fp32"), ("tf32", "tf32", "tf32")])
def test_one_set_of_precision_spellings_for_train_and_plan(typed, name, short):
    assert args_.precision(typed) == name and args_.short_precision(name) == short
    if name != "tf32":  # tf32 is a GPU's mode: refused by dt train on the CPU (below)
        assert train.parse_args(["--precision", typed, "--device", "cpu"]).precision == name
    assert plan_cli.parse_args(["--precision", typed, "--device", "h100"]).precision == short


def test_precisions_a_command_cannot_run_are_refused_in_one_line(capsys):
    assert "(did you mean bf16?)" in _refused(["train", "--precision", "bf61"], capsys)
    assert "the CPU has none" in _refused(["train", "--precision", "tf32", "--device", "cpu"], capsys)
    assert "--dtype float64 trains in it" in _refused(["train", "--precision", "fp64"], capsys)
    assert "needs --device" in _refused(["plan", "--precision", "bf16"], capsys)
    assert plan_cli.parse_args(["--precision", "fp32"]).precision == "float32"  # this machine's name


def test_every_train_option_has_help_and_shows_its_default():
    parser = train_cli.make_parser()
    formatter = parser.formatter_class(prog="dt train")
    for action in parser._actions:  # noqa: SLF001 - argparse lists its options nowhere else
        if not action.option_strings or isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        flag = action.option_strings[-1]
        assert action.help, f"{flag} has no help"
        if action.default is not False:  # a flag is off unless typed
            shown = formatter._get_help_string(action) % {"default": action.default}  # noqa: SLF001
            assert "default" in shown, f"{flag}: {shown}"
    text = " ".join(parser.format_help().split())
    assert "--steps STEPS the step the run ends at (a resumed run: in all) (default: 50)" in text


def _write(path, lines: int) -> None:
    path.write_text("".join(f"the cat sat on mat number {i}.\n" for i in range(lines)))


def test_a_data_folder_is_its_text_files_sorted_by_name(tmp_path, capsys):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    _write(folder / "b.txt", 20)
    _write(folder / "a.md", 20)
    _write(folder / ".hidden", 20)
    _write(folder / "sub" / "c.txt", 20)  # a subfolder's files stay out
    (folder / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0" + bytes(range(256)))
    args = train.parse_args(["--data", str(folder), "--steps", "12"])
    assert args.data == [str(folder / "a.md"), str(folder / "b.txt")]
    assert data_source(args) == f"2 text files (the text files of {folder}, sorted by name)"
    assert args.eval_every == -(-12 // EVALS_PER_RUN)  # validated by default on held-out text
    assert train.parse_args(["--data", str(folder), "--eval-every", "0"]).eval_every == 0  # as typed
    assert train.parse_args([]).eval_every == 0  # generated text: as before, unless asked
    assert data_source(train.parse_args(["--data", str(folder / "b.txt")])) == "1 text file"
    (tmp_path / "binaries").mkdir()
    (tmp_path / "binaries" / "x.bin").write_bytes(bytes(range(256)))
    err = _refused(["train", "--data", str(tmp_path / "binaries")], capsys)
    assert f"--data {tmp_path / 'binaries'} is a directory with no text files" in err
    assert "no such file or directory" in _refused(["train", "--data", str(tmp_path / "none")], capsys)


def test_the_start_line_counts_the_plain_models_parameters_and_a_steps_tokens():
    args = train.parse_args(SMALL)
    model, _ = plain_model(args, 44)
    line = start_line(args, 44)
    assert f"GPT of {model.num_params():,} parameters; 32 tokens per step (global batch 4 x 8)" in line
    assert line.endswith("data: generated text (dt.models.data)")


class _Optimizer:
    param_groups: list[dict] = [{}]


def test_the_progress_line_dates_a_validation_loss_it_did_not_just_measure(capsys):
    args = train.parse_args(["--steps", "4", "--eval-every", "2", "--eval-batches", "1"])
    losses = iter([3.0, 2.0])
    hooks = StepHooks(args, GeneratedData(), lambda x, y: next(losses), rank=0, dp_rank=0, start=0,
                      desc="test")
    for step in range(4):
        hooks.begin(step, _Optimizer())
        hooks.end(step, 1.0, {"compute": 0.0})
    hooks.close()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "step " in ln]
    assert ", val" not in lines[0]
    assert ", val 3.0000, lr" in lines[1] and ", val 3.0000 (step 2), lr" in lines[2]
    assert ", val 2.0000, lr" in lines[3]


def _resume(argv: list[str]) -> dict:
    args = train.parse_args(argv)
    out = train.train_worker(args)
    return {"start": out["start"], "model_from": args.model_from, "shape": (args.n_layer, args.n_embd)}


@pytest.mark.timeout(300)
def test_a_checkpoint_resumes_without_its_model_options_and_refuses_others(run, tmp_path, capsys):
    ckpt, metrics = str(tmp_path / "ckpt"), str(tmp_path / "m.jsonl")
    first = run(1, _resume, [*SMALL, "--steps", "2", "--checkpoint", ckpt, "--metrics", metrics])[0]
    assert first["start"] == 0 and first["model_from"] is None
    plain = ["--steps", "4", "--checkpoint", ckpt, "--metrics", metrics, "--threads", "1", "--no-progress",
             "--batch-size", "4", "--micro-batches", "1"]
    second = run(1, _resume, plain)[0]  # no --n-layer, --n-embd, --n-head, --block-size
    assert second["start"] == 2 and second["shape"] == (1, 16)
    assert "--n-layer 1" in second["model_from"] and "--block-size 8" in second["model_from"]
    assert train.parse_args([*plain, "--n-layer", "1"]).n_layer == 1  # typed as saved: accepted
    err = _refused(["train", *plain, "--n-layer", "3"], capsys)
    assert err.startswith("dt train: error: --n-layer 3: the checkpoint in ") and "--n-layer 1" in err
    assert "--model llama: the checkpoint in " in _refused(["train", *plain, "--model", "llama"], capsys)
    lines = [json.loads(ln) for ln in open(metrics)]
    runs = [ln["run"] for ln in lines if "run" in ln]
    assert [list(ln) for ln in (lines[0], lines[3])] == [["run"], ["run"]]  # each run's first line
    assert [(r["from_step"], r["world"], r["steps"]) for r in runs] == [(0, 1, 2), (2, 1, 4)]
    assert all(r["started"].endswith("Z") for r in runs)
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3, 4]  # the markers are not steps


def test_a_directory_without_a_checkpoint_leaves_the_options_alone(tmp_path):
    assert train.parse_args(["--checkpoint", str(tmp_path / "empty")]).model_from is None


def test_tf32_holds_for_the_run_and_is_undone_after():
    before = torch.get_float32_matmul_precision()
    with float32_matmuls("tf32"):
        assert torch.get_float32_matmul_precision() == "high"  # TF32 where the device has it
    assert torch.get_float32_matmul_precision() == before
    with float32_matmuls("bfloat16"):
        assert torch.get_float32_matmul_precision() == before


def test_the_report_counts_in_words_and_says_what_an_unset_option_means():
    args = train.parse_args(["--experts", "2", "--steps", "2"])
    r0 = {"rank": 0, "coords": (0, 0, 0, 0, 0), "losses": [3.0, 2.0], "start": 0, "wall_s": 1.0,
          "tokens_per_s": 1024.0, "times": {"compute": 0.5, "communication": 0.1, "bubble": 0.0},
          "bytes_sent": {"data": 0.0}, "steps": 2, "peak_stash": 0, "moe": {"assignments": 64, "dropped": 0}}
    text = train_cli.report(args, [r0])
    assert "(1 process), global batch" in text and "capacity factor none (no drops);" in text, text
    assert "None" not in text
