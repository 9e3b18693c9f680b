"""Training text made by the project itself (no downloads), character-level.

The corpus is generated from a fixed seed: short sentences from a tiny
grammar plus lines of arithmetic ("17+25=42."). It has enough structure for a
small GPT's loss to fall visibly within a few hundred steps (the spelling of
words, the grammar, carrying digits), and it is identical on every rank and
every machine, so a sharded run can be checked against a single process.

Batches are a pure function of (step, seed): every rank draws the same global
batch and keeps its data-parallel slice. No sampler state to checkpoint.
"""

from __future__ import annotations

import random

import torch

__all__ = ["CharData", "generate_text"]

_SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird",
             "the teacher", "every child", "the farmer", "our neighbour"]
_VERBS = ["sees", "likes", "finds", "follows", "paints", "carries", "remembers", "builds"]
_OBJECTS = ["the red ball", "a green boat", "the tall tree", "an empty box", "the quiet river",
            "a bright star", "the long road", "some warm bread"]
_PLACES = ["in the garden", "near the house", "at night", "on the hill", "by the sea",
           "after school", "in the rain"]


def generate_text(n_chars: int = 200_000, seed: int = 0) -> str:
    """About n_chars of deterministic text: sentences and sums, one per line."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        if rng.random() < 0.3:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            line = f"{a}+{b}={a + b}."
        else:
            line = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
            if rng.random() < 0.5:
                line += " " + rng.choice(_PLACES)
            line = line[0].upper() + line[1:] + "."
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


class CharData:
    """The corpus as token ids, a character vocabulary, and deterministic batches."""

    def __init__(self, text: str | None = None, seed: int = 0):
        self.text = text if text is not None else generate_text(seed=seed)
        self.chars = sorted(set(self.text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.ids = torch.tensor([self.stoi[c] for c in self.text], dtype=torch.int64)  # host: data
        self.seed = seed

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.int64)  # host: data

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())

    def batch(self, step: int, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of `step`: inputs and next-character targets, [batch, block]."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.ids) - block_size - 1, (batch_size,), generator=g)  # host: data
        x = torch.stack([self.ids[s:s + block_size] for s in starts.tolist()])
        y = torch.stack([self.ids[s + 1:s + 1 + block_size] for s in starts.tolist()])
        return x, y
