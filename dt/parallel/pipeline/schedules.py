"""The pipeline's arithmetic: which layers each stage holds, and in what order it works.

Pure functions of (layers, stages, micro-batches, chunks), no tensors and no
messages: the runtime (runtime.py) plays these orders out, the scaling study
simulates them, and the tests check them directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from dt.layout import edges, split_sizes

__all__ = ["bubble_fraction", "neighbour", "partition", "schedule", "stage_layers"]


def bubble_fraction(p: int, m: int, virtual: int = 1) -> float:
    """Idle fraction of a pipeline step: (p-1) / (v*m + p-1).

    Each stage works v*m chunk-slots (m micro-batches through v model chunks
    of 1/v the work each) and idles p-1 of them while the pipe fills and
    drains. v=1 gives GPipe's and 1F1B's (p-1)/(m+p-1).
    """
    if p < 1 or m < 1 or virtual < 1:
        raise ValueError(f"p, m and virtual must be at least 1, got {p}, {m}, {virtual}")
    return (p - 1) / (virtual * m + p - 1)


def partition(n_layers: int, stages: int, sizes: Sequence[int] | None = None) -> list[range]:
    """Layer ranges of each stage: balanced by count (split_sizes: first stages get the extra) or `sizes`."""
    if sizes is None:
        if not 1 <= stages <= n_layers:
            raise ValueError(f"cannot split {n_layers} layers into {stages} non-empty stages")
        sizes = split_sizes(n_layers, stages)
    if len(sizes) != stages or sum(sizes) != n_layers or min(sizes) < 1:
        raise ValueError(f"stage sizes {list(sizes)} must be {stages} positive counts "
                         f"summing to {n_layers}")
    return [range(a, a + n) for a, n in zip(edges(sizes), sizes)]


def stage_layers(n_layers: int, stages: int, stage: int, sizes: Sequence[int] | None = None,
                 virtual: int = 1) -> list[range]:
    """The layer ranges `stage` runs, one per model chunk it holds.

    The model is cut into stages * virtual parts (`sizes`: that many counts);
    chunk c of stage s is part c * stages + s, so with virtual = v the stage
    holds parts s, s + p, s + 2p, ... (Megatron's interleaving).
    """
    parts = partition(n_layers, stages * virtual, sizes)
    return [parts[c * stages + stage] for c in range(virtual)]


def neighbour(stages: int, virtual: int, stage: int, chunk: int, direction: int) -> int | None:
    """The stage holding the chunk before (-1) or after (+1) `stage`'s `chunk`; None past the ends.

    Virtual position pos = chunk * stages + stage lives on stage pos % stages,
    so with virtual > 1 the last stage hands on to the first stage's next chunk.
    None: the model's input (before the first chunk) or its loss (after the last).
    """
    pos = chunk * stages + stage + direction
    if not 0 <= pos < stages * virtual:
        return None
    return pos % stages


def schedule(name: str, p: int, s: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """The ordered ("F"|"B", chunk, micro-batch) actions of stage s.

    gpipe: every forward, then every backward. 1f1b: min(p-s-1, m) warm-up
    forwards, then one forward one backward, then the remaining backwards.
    interleaved: Megatron's interleaved 1F1B over v chunks per stage (see
    _interleaved_1f1b); with one chunk it is 1F1B, as in Megatron.
    """
    if name in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{name} runs one chunk per stage; use 'interleaved' for virtual={v}")
    if name == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if name == "1f1b" or (name == "interleaved" and v == 1):
        warmup = min(p - s - 1, m)
        acts = [("F", 0, i) for i in range(warmup)]
        for k in range(m - warmup):           # steady state: one forward, one backward
            acts += [("F", 0, warmup + k), ("B", 0, k)]
        acts += [("B", 0, i) for i in range(m - warmup, m)]  # cooldown
        return acts
    if name == "interleaved":
        return _interleaved_1f1b(p, s, m, v)
    raise ValueError(f"unknown schedule {name!r}; one of 'gpipe', '1f1b', 'interleaved'")


def _interleaved_1f1b(p: int, s: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B (Narayanan et al. 2021, Section 2.2.2) on stage s.

    Forwards take micro-batches in groups of p, each group through chunk 0,
    then chunk 1, ..., then the next group; backwards take the same order with
    the chunks reversed. Stage s runs 2 (p-s-1) + (v-1) p forwards first (a
    group's way through the other chunks, plus the round trip to the last stage
    and back), then alternates one forward and one backward, then drains the
    backwards. Stage 0 then holds p v + p - 1 (chunk, micro-batch) activations
    at most, p (1 + (p-1)/(p v)) micro-batches of its whole stage, where every
    forward first would hold all v m; the bubble is (p-1)/(v m + p-1).

    Every stage follows one forward order and one backward order, so between any
    two ranks messages leave in the order the receiver takes them (with p = 2 one
    pair carries activations and gradients both ways; they agree because a group
    is 2 micro-batches, the difference between the two stages' warm-ups), and no
    receive waits on an action that waits on it: timeline.play walks every
    stage's order to its end.

    m not a multiple of p (Megatron refuses it; its groups of N > p, a last one
    of at least p, would break that agreement at p = 2): the order for the next
    multiple of p with the missing micro-batches' actions left out, so the last
    group is shorter. Leaving actions out keeps both properties (any run of the
    longer order, restricted, runs the shorter one, and each pair loses the same
    messages at both ends); the price is bubble, since a short group cannot keep
    the virtual stages busy.
    """
    padded = -(-m // p) * p
    table = [(c, i) for g in range(0, padded, p) for c in range(v) for i in range(g, g + p)]
    forwards = [("F", c, i) for c, i in table]
    backwards = [("B", v - 1 - c, i) for c, i in table]
    warmup = min(2 * (p - s - 1) + (v - 1) * p, len(table))
    acts = forwards[:warmup]
    for f, b in zip(forwards[warmup:], backwards):  # steady state: one forward, one backward
        acts += [f, b]
    acts += backwards[len(table) - warmup:]  # cooldown
    return [(kind, chunk, i) for kind, chunk, i in acts if i < m]
