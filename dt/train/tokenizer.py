"""Text to token ids and back: a byte-level tokenizer built in, a BPE one trained here.

    tok = ByteTokenizer()                                  # 256 ids: the UTF-8 bytes
    tok = BPETokenizer.train(["a.txt", "b.txt"], vocab_size=2048)   # no downloads
    ids = tok.encode("héllo"); tok.decode(ids) == "héllo"
    tok.save(path); load_tokenizer(path)                   # one JSON file either way

Both are lossless on any text: the byte tokenizer trivially, the BPE one
because it is byte-level too (Hugging Face `tokenizers`' ByteLevel, GPT-2's
scheme): its alphabet is the 256 bytes, so nothing is ever unknown, and merges
only join bytes that are often next to each other. BPE trades a vocabulary (a
bigger embedding and head) for shorter sequences: English text runs at about
4 bytes per token at a vocabulary of a few thousand, so the same block_size
sees four times the context.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

__all__ = ["BPETokenizer", "ByteTokenizer", "CharTokenizer", "Tokenizer", "load_tokenizer", "make_tokenizer",
           "tokenizer_from_json"]

KINDS = ("byte", "bpe")


class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_json(self) -> str: ...

    def save(self, path: str | Path) -> None: ...


class ByteTokenizer:
    """Each UTF-8 byte is a token: 256 ids, nothing to train."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        # A model may sample a byte sequence that is not UTF-8: shown as U+FFFD, never an error.
        return bytes(ids).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"kind": "byte"})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


class CharTokenizer:
    """One id per character of a fixed alphabet: dt.models.data's generated text (`dt train` without
    --data). Text outside the alphabet is refused in one line; it has no ids."""

    kind = "chars"

    def __init__(self, chars: Sequence[str]):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        missing = sorted(set(text) - self.stoi.keys())
        if missing:
            raise ValueError(f"characters outside the model's alphabet: {''.join(missing)!r} (it was "
                             f"trained on generated text of {len(self.chars)} characters: "
                             f"{''.join(self.chars)!r})")
        return [self.stoi[c] for c in text]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "chars", "chars": self.chars})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


class BPETokenizer:
    """Byte-level BPE (Hugging Face `tokenizers`), trained on local files."""

    kind = "bpe"

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, files: Sequence[str | Path], vocab_size: int) -> BPETokenizer:
        """Learn merges from `files` (read by `tokenizers` itself, streamed) up to vocab_size ids."""
        if vocab_size < 257:
            raise ValueError(f"a byte-level BPE vocabulary holds the 256 bytes and at least one merge: "
                             f"--vocab-size {vocab_size} is below 257")
        tokenizers = _tokenizers()
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size, show_progress=False, special_tokens=[],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())  # every byte, seen or not
        tok.train([str(f) for f in files], trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]  # in parallel, in Rust

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def to_json(self) -> str:
        return self.tokenizer.to_str()

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ValueError("the BPE tokenizer needs the `tokenizers` package (pip install tokenizers); "
                         "--tokenizer byte needs nothing") from None
    return tokenizers


def make_tokenizer(kind: str, files: Sequence[str | Path] = (), vocab_size: int = 0) -> Tokenizer:
    """The built-in byte tokenizer, or a BPE one trained on `files`."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.train(files, vocab_size)
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(KINDS)}")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer saved by save(): dt's own kinds, or `tokenizers`' JSON."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{path}: not a saved tokenizer ({e.__class__.__name__}: {e})") from None
    return tokenizer_from_json(text, str(path))


def tokenizer_from_json(text: str, where: str = "tokenizer") -> Tokenizer:
    """The tokenizer to_json() wrote (a file's text, or a checkpoint's manifest entry)."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{where}: not a saved tokenizer ({e.__class__.__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a saved tokenizer (a JSON {type(data).__name__}, not an object)")
    if data.get("kind") == "byte":
        return ByteTokenizer()
    if data.get("kind") == "chars" and isinstance(data.get("chars"), list):
        return CharTokenizer(data["chars"])
    if "model" not in data:
        raise ValueError(f"{where}: not a saved tokenizer (neither one of dt's kinds nor `tokenizers` JSON)")
    return BPETokenizer(_tokenizers().Tokenizer.from_str(text))
