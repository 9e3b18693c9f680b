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
    interleaved (v chunks per stage): GPipe's order over the virtual stages,
    micro-batches in groups of p, each group through chunk 0, then chunk 1, ...
    (Megatron's order), backwards mirrored. Every stage sorts its actions by the
    same key, so a receive only ever waits on an action earlier in that order.
    """
    if name in ("gpipe", "1f1b") and v != 1:
        raise ValueError(f"{name} runs one chunk per stage; use 'interleaved' for virtual={v}")
    if name == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if name == "1f1b":
        warmup = min(p - s - 1, m)
        acts = [("F", 0, i) for i in range(warmup)]
        for k in range(m - warmup):           # steady state: one forward, one backward
            acts += [("F", 0, warmup + k), ("B", 0, k)]
        acts += [("B", 0, i) for i in range(m - warmup, m)]  # cooldown
        return acts
    if name == "interleaved":
        work = [(c, i) for c in range(v) for i in range(m)]
        fwd = sorted(work, key=lambda ci: (ci[1] // p, ci[0], ci[1]))
        bwd = sorted(work, key=lambda ci: (ci[1] // p, v - 1 - ci[0], ci[1]))
        return [("F", c, i) for c, i in fwd] + [("B", c, i) for c, i in bwd]
    raise ValueError(f"unknown schedule {name!r}; one of 'gpipe', '1f1b', 'interleaved'")
