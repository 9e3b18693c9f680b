"""`dt train --data FILE...`: your text files, tokenized once into a cached corpus, on any mesh.

Every text is written by the test itself; nothing is downloaded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dt import train
from dt.tools import cli
from dt.train import corpus as corpus_mod
from dt.train import dataset
from dt.train.dataset import GeneratedData, corpus_dir, open_data, prepare_data
from dt.train.sample import load_model

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept", "grün", "über", "日本"]


def _write_text(path: Path, lines: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    path.write_text("".join(" ".join(rng.choice(WORDS, size=rng.integers(3, 10))) + ".\n"
                            for _ in range(lines)))
    return path


def _argv(files: list[Path], cache: Path, *more: str) -> list[str]:
    return ["--data", *map(str, files), "--data-dir", str(cache), "--steps", "4", "--batch-size", "8",
            "--block-size", "16", "--n-layer", "2", "--n-embd", "16", "--dtype", "float64", "--no-progress",
            "--threads", "1", "--micro-batches", "2", "--eval-every", "2", "--eval-batches", "2", *more]


def _curves(argv: list[str]) -> tuple[list[float], list]:
    out = train.train_worker(train.parse_args(argv))
    return out["losses"], out["val_losses"]


@pytest.mark.timeout(300)
def test_text_files_train_the_same_on_a_mesh_as_in_one_process(run, tmp_path):
    files = [_write_text(tmp_path / "a.txt", 300, 1), _write_text(tmp_path / "b.txt", 100, 2)]
    argv = _argv(files, tmp_path / "corpus")
    prepare_data(train.parse_args(argv))  # once, as dt train's main does before the ranks start
    ref = run(1, _curves, argv)[0]
    for losses, val in run(4, _curves, argv + ["--dp", "2", "--tp", "2"]):
        assert losses == pytest.approx(ref[0], rel=1e-10)
        assert [v for _, v in val] == pytest.approx([v for _, v in ref[1]], rel=1e-10)
    data = open_data(train.parse_args(argv))
    assert data.vocab_size == 256 and data.tokenizer.kind == "byte"
    x, _ = data.batch(0, 4, 16)
    text = "".join(p.read_text() for p in files).encode()
    assert all(bytes(row.tolist()) in text for row in x)  # the batches are windows of the files


def test_the_corpus_is_prepared_once_and_keyed_by_what_made_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    f = _write_text(tmp_path / "a.txt", 200, 3)
    args = train.parse_args(["--data", str(f), "--tokenizer", "bpe", "--vocab-size", "300"])
    first = prepare_data(args)
    assert first == corpus_dir(args) and first.parent == tmp_path / "cache" / "dt" / "corpus"
    made = (first / "train.bin").stat().st_mtime_ns
    assert prepare_data(args) == first and (first / "train.bin").stat().st_mtime_ns == made  # reused
    assert open_data(args).tokenizer.kind == "bpe" and open_data(args).vocab_size <= 300
    other = train.parse_args(["--data", str(f), "--tokenizer", "bpe", "--vocab-size", "400"])
    assert corpus_dir(other) != first  # another vocabulary: another corpus
    _write_text(f, 210, 4)
    assert corpus_dir(args) != first  # the file changed: tokenized again, not stale ids


def test_a_failed_preparation_leaves_no_lock_and_a_killed_holders_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    corpora = tmp_path / "cache" / "dt" / "corpus"
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        prepare_data(train.parse_args(["--data", str(tmp_path / "empty.txt")]))
    assert list(corpora.iterdir()) == []
    args = train.parse_args(["--data", str(_write_text(tmp_path / "a.txt", 50, 1))])
    Path(f"{corpus_dir(args)}.lock").write_text("")  # what a holder SIGKILLed mid-prepare leaves
    assert prepare_data(args) == corpus_dir(args)
    assert [p.name for p in corpora.iterdir()] == [corpus_dir(args).name]


def test_the_corpus_lock_is_held_by_one_at_a_time_though_each_holder_removes_it(tmp_path):
    """A waiter queued on the file its holder removed must not hold the lock beside a newcomer."""
    path, holders, most, errors = tmp_path / "c.lock", [0], [0], []

    def use() -> None:
        try:
            for _ in range(30):
                with dataset._locked(path):
                    holders[0] += 1
                    most[0] = max(most[0], holders[0])
                    time.sleep(0.001)
                    holders[0] -= 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and most == [1] and not path.exists()


def test_a_long_line_is_read_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_mod, "CHUNK_CHARS", 100)
    f = tmp_path / "one.txt"
    f.write_text("x" * 5000 + "\n" + "tail line\n" * 50)
    seen = []
    from dt.train.tokenizer import ByteTokenizer

    class Recording(ByteTokenizer):
        def encode(self, text: str) -> list[int]:
            seen.append(len(text))
            return super().encode(text)

    c = corpus_mod.prepare([f], Recording(), tmp_path / "d", val_fraction=0.05)
    assert max(seen) <= 200  # never the 5000-character line at once
    assert bytes(c.tokens["train"].tolist() + c.tokens["val"].tolist()).decode() == f.read_text()


def test_generated_text_validates_on_text_it_never_trained_on():
    data = GeneratedData(seed=0)
    assert data.val.text != data.train.text and data.val.text not in data.train.text
    x, y = data.val_batch(0, 4, 16)
    assert x.shape == (4, 16) and int(x.max()) < data.vocab_size
    assert data.tokenizer.decode(data.tokenizer.encode("The cat sees")) == "The cat sees"


@pytest.mark.timeout(300)
def test_dt_train_on_text_then_dt_sample(tmp_path, monkeypatch, capsys):
    """Both commands through dt's entry point, in this process (no second import of torch)."""
    f = _write_text(tmp_path / "a.txt", 400, 5)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "ckpt"
    code = cli.main(["train", "--data", str(f), "--tokenizer", "bpe", "--vocab-size", "300", "--steps", "6",
                     "--batch-size", "4", "--block-size", "16", "--n-layer", "1", "--n-embd", "16",
                     "--threads", "1", "--eval-every", "3", "--checkpoint", str(ckpt),
                     "--metrics", str(tmp_path / "m.jsonl"), "--plot", str(tmp_path / "loss.png"),
                     "--no-progress"])
    done = capsys.readouterr()
    assert code == 0, done.err[-2000:]
    assert "validation loss" in done.out and "MFU" in done.out
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    model, tokenizer, step = load_model(str(ckpt))
    assert step == 6 and tokenizer.kind == "bpe" and model.cfg.vocab_size == tokenizer.vocab_size
    code = cli.main(["sample", "--checkpoint", str(ckpt), "--prompt", "the cat", "--max-new-tokens", "10"])
    said = capsys.readouterr()
    assert code == 0 and said.out.startswith("the cat"), said.err
