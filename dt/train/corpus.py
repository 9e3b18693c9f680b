"""Text files as memory-mapped token files, split into train and validation, and their batches.

    corpus = prepare(["a.txt", "b.txt"], ByteTokenizer(), "run/data", val_fraction=0.1)
    corpus = open_corpus("run/data")                 # later, or on another rank: no re-tokenizing
    x, y = corpus.batch("train", step, batch_size=8, block_size=64)

The files are read in order as one text, a line at a time (a long line in
pieces) and encoded in chunks, so no whole file, nor a whole long line, is ever
in memory. The split is by position: the
last val_fraction of the text's bytes (from the first line boundary there on)
is validation, the rest training, as nanoGPT splits. Text the model validates
on is then text it never trained on, and, unlike a random split of lines, the
two share no sentence.

Tokens go to train.bin and val.bin as raw little-endian integers, uint16 when
the vocabulary fits in 16 bits (it does for the byte tokenizer and any BPE
under 65,536 ids), else uint32: half the disk and page cache of int32.
numpy.memmap reads them back, so a batch touches only the pages its
sequences sit on and a corpus larger than memory trains the same. meta.json
says what the files hold; tokenizer.json is the tokenizer that made them.

Batches are a pure function of (split, step, seed), as dt.models.data's:
every rank draws the same global batch and keeps its slice, and a resumed run
draws what the interrupted one would have. No sampler state to checkpoint.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dt.train.tokenizer import Tokenizer, load_tokenizer

__all__ = ["SPLITS", "Corpus", "is_text_file", "open_corpus", "prepare", "split_offset", "text_files",
           "token_dtype"]

SPLITS = ("train", "val")
CHUNK_CHARS = 1 << 20  # text encoded per call: large enough to amortise, small enough to stream
SNIFF_BYTES = 8192  # what is_text_file reads: enough to tell text from a binary file's header


def is_text_file(path: Path) -> bool:
    """Whether `path` is a file whose first SNIFF_BYTES are UTF-8 text (no NUL byte).

    The first bytes only, so a folder of large files is sorted out quickly; a file
    that turns out not to be UTF-8 further on is refused by prepare, naming it.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return False
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at the end is fine
    except UnicodeDecodeError:
        return False
    return True


def text_files(names: Sequence[str | Path]) -> list[Path]:
    """--data's files: each file as given, each folder as its text files, sorted by name.

    Only the files directly in a folder (not its subfolders, not hidden ones): a
    checkout's .git or a folder of images next to the text stays out. ValueError
    naming a path that does not exist, or a folder holding no text file.
    """
    out: list[Path] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if not p.name.startswith(".") and p.is_file() and is_text_file(p))
            if not found:
                raise ValueError(f"{name} is a directory with no text files (UTF-8, directly inside it)")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise ValueError(f"{name}: no such file or directory")
    return out


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned integer that holds every id below vocab_size."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def split_offset(total_bytes: int, val_fraction: float) -> int:
    """The byte offset where validation starts: the last val_fraction of the text."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"the validation fraction must be in [0, 1), got {val_fraction}")
    return total_bytes - int(total_bytes * val_fraction)


@dataclass
class Corpus:
    """A prepared corpus: the token files memory-mapped, their tokenizer, and the sampler."""

    directory: Path
    tokens: dict[str, np.ndarray]  # "train", "val" -> read-only memmaps
    tokenizer: Tokenizer
    seed: int = 0

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def batch(self, split: str, step: int, batch_size: int,
              block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of `step` from `split`: inputs and next-token targets, [batch, block] int64.

        Each row starts at a uniformly drawn offset, so every window of the
        split is equally likely; validation draws from a stream of its own.
        """
        if split not in SPLITS:
            raise ValueError(f"no split {split!r}; the splits are {', '.join(SPLITS)}")
        ids = self.tokens[split]
        if len(ids) < block_size + 1:
            raise ValueError(f"the {split} split holds {len(ids)} tokens, too few for one sequence of "
                             f"block_size {block_size} (+1 target): give more text or a shorter block")
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * len(SPLITS) + SPLITS.index(split))
        starts = torch.randint(0, len(ids) - block_size, (batch_size,), generator=g).tolist()  # host: data
        rows = np.stack([ids[s:s + block_size + 1] for s in starts]).astype(np.int64)
        rows_t = torch.from_numpy(rows)
        return rows_t[:, :-1], rows_t[:, 1:]


def _lines(files: Sequence[Path]) -> Iterator[str]:
    """Every line of every file, in order; a file missing its last newline gets one.

    A line longer than CHUNK_CHARS comes in pieces of CHUNK_CHARS: a file with no
    newline at all (minified, or one huge line) is never read whole either.
    """
    for path in files:
        last = "\n"
        try:
            with open(path, encoding="utf-8", newline="") as f:
                for line in iter(lambda: f.readline(CHUNK_CHARS), ""):
                    last = line
                    yield line
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} in a line near byte {e.start})") from None
        if not last.endswith("\n"):
            yield "\n"


def _chunks(files: Sequence[Path], val_from: int) -> Iterator[tuple[str, str]]:
    """(split, text) chunks of about CHUNK_CHARS, never crossing the split or a line."""
    buffer: list[str] = []
    size, offset, current = 0, 0, "train"
    for line in _lines(files):
        split = "train" if offset < val_from else "val"
        if buffer and (split != current or size >= CHUNK_CHARS):
            yield current, "".join(buffer)
            buffer, size = [], 0
        current = split
        buffer.append(line)
        size += len(line)
        offset += len(line.encode("utf-8"))
    if buffer:
        yield current, "".join(buffer)


def prepare(files: Sequence[str | Path], tokenizer: Tokenizer, directory: str | Path,
            val_fraction: float = 0.1, seed: int = 0) -> Corpus:
    """Tokenize `files` into `directory` (train.bin, val.bin, meta.json, tokenizer.json) and open it."""
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("no text files given (--data FILE ...)")
    for p in paths:
        if not p.is_file():
            raise ValueError(f"{p}: no such file")
    # Files end with a newline or get one, so the text is at least this long.
    total = sum(p.stat().st_size for p in paths)
    if total == 0:
        raise ValueError(f"the text files are empty: {', '.join(map(str, paths))}")
    out = Path(directory)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    counts = dict.fromkeys(SPLITS, 0)
    partial = [out / f"{s}.bin.partial" for s in SPLITS]
    try:
        sinks = {s: open(p, "wb") for s, p in zip(SPLITS, partial)}
        try:
            for split, text in _chunks(paths, split_offset(total, val_fraction)):
                ids = np.asarray(tokenizer.encode(text), dtype=dtype)
                sinks[split].write(ids.astype(dtype.newbyteorder("<"), copy=False).tobytes())
                counts[split] += len(ids)
        finally:
            for f in sinks.values():
                f.close()
        if val_fraction > 0 and counts["val"] == 0:
            raise ValueError(f"a validation fraction of {val_fraction} of {total} bytes holds no whole "
                             "line: give more text, or --val-fraction 0")
        for split, p in zip(SPLITS, partial):
            os.replace(p, out / f"{split}.bin")  # whole files or none: a reader never sees half
    except BaseException:
        for p in partial:
            p.unlink(missing_ok=True)
        if made and not any(out.iterdir()):
            out.rmdir()  # a failed run leaves no empty folder of its own behind
        raise
    tokenizer.save(out / "tokenizer.json")
    meta = {"dtype": dtype.name, "vocab_size": tokenizer.vocab_size, "tokenizer": tokenizer.kind,
            "tokens": counts, "val_fraction": val_fraction, "files": [str(p) for p in paths],
            "bytes": total}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return open_corpus(out, seed)


def open_corpus(directory: str | Path, seed: int = 0) -> Corpus:
    """A corpus prepare() wrote, its token files memory-mapped read-only."""
    d = Path(directory)
    try:
        meta = json.loads((d / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{d}: not a prepared corpus (meta.json: {e.__class__.__name__})") from None
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    tokens: dict[str, np.ndarray] = {}
    for split in SPLITS:
        n = meta["tokens"][split]
        path = d / f"{split}.bin"
        if path.stat().st_size != n * dtype.itemsize:
            raise ValueError(f"{path}: {path.stat().st_size} bytes, meta.json says {n} tokens of "
                             f"{dtype.itemsize} bytes: the corpus is damaged, prepare it again")
        # numpy cannot map an empty file; an empty split is an empty array.
        tokens[split] = np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
    return Corpus(d, tokens, load_tokenizer(d / "tokenizer.json"), seed)
