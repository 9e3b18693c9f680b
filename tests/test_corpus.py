"""Data for a real trainer: tokenizers, memory-mapped token files, the split, batches, the LR schedule.

Every text is written by the test itself; nothing is downloaded.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dt.train import corpus as corpus_mod
from dt.train.corpus import open_corpus, prepare, split_offset, token_dtype
from dt.train.schedule import WarmupCosine
from dt.train.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer, make_tokenizer

HARD = "plain ascii\nünïcödé, 世界, emoji 🙂\r\nwindows line\n\n\ttabs  and   spaces\n\x00nul"


def _text(lines: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "grün", "über", "日本", "42", "+", "="]
    return "".join(" ".join(rng.choice(words, size=rng.integers(3, 9))) + "\n" for _ in range(lines))


def test_byte_tokenizer_round_trips_any_text(tmp_path):
    tok = ByteTokenizer()
    ids = tok.encode(HARD)
    assert ids == list(HARD.encode("utf-8")) and tok.vocab_size == 256
    assert tok.decode(ids) == HARD
    assert tok.decode([0xE4, 0xB8]) == "\ufffd"  # half a character: replaced, not an error
    tok.save(tmp_path / "t.json")
    assert isinstance(load_tokenizer(tmp_path / "t.json"), ByteTokenizer)


def test_bpe_trains_locally_compresses_and_round_trips(tmp_path):
    (tmp_path / "a.txt").write_text(_text(400))
    tok = make_tokenizer("bpe", [tmp_path / "a.txt"], vocab_size=320)
    assert isinstance(tok, BPETokenizer) and 256 < tok.vocab_size <= 320
    sample = _text(50, seed=1)
    assert len(tok.encode(sample)) < len(sample.encode("utf-8")) / 2  # merges learnt from the text
    for text in (sample, HARD, ""):  # bytes it never saw come through too
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_many([sample, HARD]) == [tok.encode(sample), tok.encode(HARD)]
    tok.save(tmp_path / "bpe.json")
    again = load_tokenizer(tmp_path / "bpe.json")
    assert again.encode(sample) == tok.encode(sample) and again.vocab_size == tok.vocab_size


def test_tokenizers_refuse_bad_input_in_one_line(tmp_path):
    (tmp_path / "junk.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    cases = [(lambda: make_tokenizer("words"), "unknown tokenizer 'words'"),
             (lambda: make_tokenizer("bpe", [], 100), "below 257"),
             (lambda: load_tokenizer(tmp_path / "missing.json"), "not a saved tokenizer"),
             (lambda: load_tokenizer(tmp_path / "junk.json"), "a JSON list"),
             (lambda: load_tokenizer(tmp_path / "other.json"), "neither")]
    for make, words in cases:
        with pytest.raises(ValueError, match=words) as e:
            make()
        assert "\n" not in str(e.value)


def test_token_dtype_and_split_offset():
    assert token_dtype(256) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32
    assert split_offset(1000, 0.1) == 900 and split_offset(1000, 0.0) == 1000
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        split_offset(10, 1.0)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_prepare_writes_memmapped_token_files_and_splits_by_position(tmp_path, kind, monkeypatch):
    monkeypatch.setattr(corpus_mod, "CHUNK_CHARS", 100)  # many chunks: streaming, not one read
    a, b = _text(120, seed=2), _text(80, seed=3).rstrip("\n")  # b lacks its last newline
    (tmp_path / "a.txt").write_text(a)
    (tmp_path / "b.txt").write_text(b)
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    tok = make_tokenizer(kind, files, vocab_size=300)
    c = prepare(files, tok, tmp_path / "data", val_fraction=0.2)
    text = a + b + "\n"
    train, val = (tok.decode(c.tokens[s].tolist()) for s in ("train", "val"))
    assert train + val == text  # nothing lost, nothing repeated, in order
    cut = split_offset(len((a + b).encode("utf-8")), 0.2)
    assert len(train.encode("utf-8")) >= cut and train.endswith("\n")  # at the first line end past the cut
    assert len(train.encode("utf-8")) - cut < max(len(line.encode()) for line in text.splitlines(True))
    assert val.strip() and val not in train
    # The files on disk are the raw little-endian ids, read back through numpy.memmap.
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["tokens"]["val"] == len(c.tokens["val"])
    raw = np.fromfile(tmp_path / "data" / "train.bin", dtype="<u2")
    assert raw.tolist() == c.tokens["train"].tolist() and isinstance(c.tokens["train"], np.memmap)
    again = open_corpus(tmp_path / "data")
    assert again.tokens["val"].tolist() == c.tokens["val"].tolist()
    assert again.tokenizer.encode(text) == tok.encode(text)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [
        "meta.json", "tokenizer.json", "train.bin", "val.bin"]


def test_batches_are_next_token_windows_and_a_function_of_the_step(tmp_path):
    (tmp_path / "a.txt").write_text(_text(200))
    c = prepare([tmp_path / "a.txt"], ByteTokenizer(), tmp_path / "d", val_fraction=0.25, seed=7)
    x, y = c.batch("train", 3, batch_size=4, block_size=16)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    ids = torch.from_numpy(c.tokens["train"].astype(np.int64))
    for row, target in zip(x, y):  # each row is a window of the split, its targets one further
        starts = [s for s in range(len(ids) - 16) if torch.equal(ids[s:s + 16], row)]
        assert any(torch.equal(ids[s + 1:s + 17], target) for s in starts)
    assert torch.equal(c.batch("train", 3, 4, 16)[0], x)
    assert not torch.equal(c.batch("train", 4, 4, 16)[0], x)
    vx, _ = c.batch("val", 3, 4, 16)
    val = bytes(c.tokens["val"].tolist())
    assert all(bytes(r.tolist()) in val for r in vx)
    with pytest.raises(ValueError, match="too few for one sequence"):
        c.batch("val", 0, 1, 10_000)
    with pytest.raises(ValueError, match="no split 'test'"):
        c.batch("test", 0, 1, 4)


def test_prepare_refuses_bad_input_in_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "one.txt").write_text("a single line\n")
    (tmp_path / "bin.txt").write_bytes(b"ok\n\xff\xfe\x00 not text\n")
    tok = ByteTokenizer()
    cases = [([], "no text files"), ([tmp_path / "nope.txt"], "no such file"),
             ([tmp_path / "empty.txt"], "are empty"), ([tmp_path / "one.txt"], "holds no whole line"),
             ([tmp_path / "bin.txt"], "not UTF-8 text")]
    for files, words in cases:
        out = tmp_path / "out"
        with pytest.raises(ValueError, match=words) as e:
            prepare(files, tok, out, val_fraction=0.5)
        assert "\n" not in str(e.value)
        assert not out.exists(), f"{words}: left {list(out.iterdir())}"
    with pytest.raises(ValueError, match="not a prepared corpus"):
        open_corpus(tmp_path)


def test_damaged_token_file_is_named(tmp_path):
    (tmp_path / "a.txt").write_text(_text(50))
    prepare([tmp_path / "a.txt"], ByteTokenizer(), tmp_path / "d")
    with open(tmp_path / "d" / "train.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(ValueError, match="train.bin: .* the corpus is damaged"):
        open_corpus(tmp_path / "d")


def test_warmup_cosine_at_known_steps():
    lr = WarmupCosine(peak=3e-4, warmup=100, total=5000, floor=3e-5)
    assert lr(0) == pytest.approx(3e-6) and lr(49) == pytest.approx(1.5e-4)
    assert lr(99) == pytest.approx(3e-4) and lr(100) == pytest.approx(3e-4)
    assert lr(2550) == pytest.approx(1.65e-4)  # half-way through the decay: half-way to the floor
    assert lr(100 + 4900 // 4) == pytest.approx(3e-5 + 2.7e-4 * (1 + math.cos(math.pi / 4)) / 2)
    assert lr(5000) == lr(10**6) == pytest.approx(3e-5)
    rates = [lr(s) for s in range(100, 5001)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # never rises after warmup
    assert WarmupCosine(1.0, 0, 10)(0) == 1.0 and WarmupCosine(1.0, 10, 10)(9) == 1.0
    for bad, words in (((0.0, 1, 10), "peak > 0"), ((1.0, 1, 10, 2.0), "floor <= peak"),
                       ((1.0, 11, 10), "warmup <= total")):
        with pytest.raises(ValueError, match=words):
            WarmupCosine(*bad)
    with pytest.raises(ValueError, match="before step 0"):
        lr(-1)
