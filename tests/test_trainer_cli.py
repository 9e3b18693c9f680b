"""`dt train`'s trainer options and `dt sample`: bad input is one line and exit 2; metrics and the plot."""

from __future__ import annotations

import pytest

from dt.cost.flops import train_flops_per_token
from dt.models.gpt import GPTConfig
from dt.tools.cli import main as dt_main
from dt.train.metrics import (
    MetricsLog,
    curve_records,
    mfu,
    model_flops_per_token,
    plot_loss,
    read_metrics,
)


def _bad_lines(tmp_path) -> list[tuple[list[str], str]]:
    (tmp_path / "bin.txt").write_bytes(b"ok\n\xff\xfe not text\n" * 20)
    return [
        (["train", "--data", "nosuch.txt"], "--data nosuch.txt: no such file"),
        (["train", "--tokenizer", "bpe"], "--tokenizer bpe is trained on --data"),
        (["train", "--vocab-size", "100"], "argument --vocab-size"),
        (["train", "--steps", "10", "--warmup", "11"], "--warmup 11 is longer than --steps 10"),
        (["train", "--lr", "1e-3", "--lr-min", "1e-2"], "above --lr"),
        (["train", "--precision", "bfloat16", "--dtype", "float64"], "it needs --dtype float32"),
        (["train", "--precision", "int8"], "argument --precision"),
        (["train", "--eval-batches", "0"], "argument --eval-batches"),
        (["train", "--val-fraction", "1.5"], "--val-fraction must be below 1"),
        (["train", "--plot", str(tmp_path / "curve.jpg")], "saved as a PNG"),
        (["train", "--metrics", str(tmp_path / "no" / "m.jsonl")], "no folder"),
        (["train", "--peak-flops", "0"], "argument --peak-flops"),
        (["train", "--data", str(tmp_path / "bin.txt"), "--data-dir", str(tmp_path / "d")], "not UTF-8 text"),
        (["sample"], "the following arguments are required: --checkpoint"),
        (["sample", "--checkpoint", str(tmp_path), "--temperature", "-1"], "argument --temperature"),
        (["sample", "--checkpoint", str(tmp_path), "--max-new-tokens", "0"], "argument --max-new-tokens"),
        (["sample", "--checkpoint", str(tmp_path / "none")], "holds no checkpoint"),
    ]


@pytest.mark.timeout(120)
def test_bad_trainer_options_are_refused_in_one_line(tmp_path, capsys):
    for argv, words in _bad_lines(tmp_path):
        try:
            rc = dt_main(argv)
        except SystemExit as e:
            rc = e.code
        err = capsys.readouterr().err.strip()
        assert rc == 2, (argv, err)
        assert words in err and len(err.splitlines()) == 1, (argv, err)
        assert "Traceback" not in err


def test_metrics_lines_round_trip_and_the_curve_is_a_png(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(path)
    for step in range(1, 6):
        log.write({"step": step, "loss": 4.0 / step, **({"val_loss": 4.2 / step} if step % 2 == 0 else {})})
    log.close()
    records = read_metrics(path)
    assert records == log.records and [r["step"] for r in records] == [1, 2, 3, 4, 5]
    plot_loss(records, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    resumed = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5}, {"step": 2, "loss": 2.4},
               {"step": 3, "loss": 2.0}]
    assert [r["loss"] for r in curve_records(resumed)] == [3.0, 2.4, 2.0]  # a redone step: its last record
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "loss": 2}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not a JSON line"):
        read_metrics(tmp_path / "bad.jsonl")


def test_mfu_uses_the_one_flops_formula():
    cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64)
    assert model_flops_per_token(cfg) == train_flops_per_token(cfg)  # dt.cost.flops, not a second formula
    assert mfu(6e6, 1000.0, 1.2e10) == pytest.approx(0.5)
