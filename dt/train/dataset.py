"""What `dt train` trains on: the generated text (the default), or your text files (`--data FILE...`).

    data = open_data(args)               # on every rank; the corpus was prepared once, before
    x, y = data.batch(step, 16, 32)      # the global batch of a training step
    x, y = data.val_batch(i, 16, 32)     # the i-th validation batch: text never trained on
    data.tokenizer.decode(ids)

--data: the files are tokenized once (dt.train.corpus.prepare: streamed, a line
at a time, into memory-mapped token files) into a folder keyed by what made
them: the files' paths, sizes and modification times, the tokenizer, its
vocabulary and the validation fraction. A second run on the same files opens
the folder instead of tokenizing again; a BPE tokenizer is trained on the
training files and saved in the same folder (tokenizer.json). The folder is
--data-dir, else $XDG_CACHE_HOME/dt/corpus/<key> (~/.cache when unset).
Preparing takes a lock on the folder (a file beside it, removed by its holder
however the preparing ends), so ranks started by torchrun (each runs `dt
train`'s main) tokenize once and the others wait and open it.

Without --data, dt.models.data's generated text: training batches as before
(the tests' trajectories rely on it), and validation on text generated from
another seed, encoded with the training text's characters.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from dt.models.data import CharData, generate_text
from dt.train.corpus import Corpus, open_corpus, prepare
from dt.train.tokenizer import CharTokenizer, Tokenizer, make_tokenizer

__all__ = ["GeneratedData", "TextData", "TrainData", "corpus_dir", "open_data", "prepare_data"]

VAL_CHARS = 50_000  # held-out generated text: plenty of distinct windows for a few batches


class TrainData(Protocol):
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int: ...

    def batch(self, step: int, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def val_batch(self, index: int, batch_size: int,
                  block_size: int) -> tuple[torch.Tensor, torch.Tensor]: ...


class GeneratedData:
    """dt.models.data's generated text, and a held-out stretch of it from the next seed."""

    def __init__(self, seed: int = 0):
        self.train = CharData(seed=seed)
        # Same grammar, other sentences: every character is in the training text's alphabet.
        self.val = CharData(generate_text(VAL_CHARS, seed=seed + 1), seed=seed)
        self.val.chars, self.val.stoi = self.train.chars, self.train.stoi
        self.val.ids = self.train.encode(self.val.text)
        self.tokenizer: Tokenizer = CharTokenizer(self.train.chars)

    @property
    def vocab_size(self) -> int:
        return self.train.vocab_size

    def batch(self, step: int, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.train.batch(step, batch_size, block_size)

    def val_batch(self, index: int, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.val.batch(index, batch_size, block_size)


class TextData:
    """A prepared corpus (dt.train.corpus) seen through the same two calls."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.tokenizer = corpus.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    def batch(self, step: int, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.corpus.batch("train", step, batch_size, block_size)

    def val_batch(self, index: int, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.corpus.batch("val", index, batch_size, block_size)


def corpus_dir(args: argparse.Namespace) -> Path:
    """Where --data's token files live: --data-dir, or the cache folder of what makes them."""
    if getattr(args, "data_dir", None):
        return Path(args.data_dir)
    files = []
    for name in args.data:
        st = os.stat(name)
        files.append([os.path.abspath(name), st.st_size, st.st_mtime_ns])
    vocab = args.vocab_size if args.tokenizer == "bpe" else 0
    key = json.dumps([files, args.tokenizer, vocab, args.val_fraction])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dt" / "corpus" / hashlib.sha256(key.encode()).hexdigest()[:16]


def prepare_data(args: argparse.Namespace) -> Path | None:
    """Tokenize --data once (under the folder's lock); None without --data. ValueError on bad text."""
    if not getattr(args, "data", None):
        return None
    out = corpus_dir(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(Path(f"{out}.lock")):  # beside the folder: prepare() may remove a failed one
        if not (out / "meta.json").is_file():
            # BPE learns from every file, the validation tail too (as GPT-2's tokenizer was trained
            # before any split): a few merges of thousands, no labels seen.
            tokenizer = make_tokenizer(args.tokenizer, args.data, args.vocab_size)
            prepare(args.data, tokenizer, out, val_fraction=args.val_fraction)
    return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of file `path` (made if missing); the file is gone afterwards.

    flock's lock goes with the process however it ends, so a killed holder leaves at
    most the file, which the next holder takes over and removes. The holder removes
    the file before it lets go; a waiter that was queued on the removed file then
    finds that the name leads elsewhere (or nowhere) and queues on the name afresh,
    so two processes never both hold it.
    """
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            held = os.fstat(fd)
            named = os.stat(path)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def open_data(args: argparse.Namespace) -> TrainData:
    """This rank's view of the training data (the corpus prepared now if main did not)."""
    path = prepare_data(args)
    if path is None:
        return GeneratedData(seed=args.seed)
    return TextData(open_corpus(path, seed=args.seed))

