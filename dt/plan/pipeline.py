"""The pipeline's schedule played out with predicted durations: when each action starts and ends.

Each stage runs dt.parallel.pipeline.schedules.schedule's own action order.
An action starts when its stage is free and its input has arrived:

    F(chunk c, micro-batch i) at virtual position c*p + s needs F(c', i) of position - 1
    B(c, i) needs B of position + 1, or, on the last position, its own F(c, i)

plus `send` seconds for the activation (or its gradient) to cross between
stages. What a stage waits is its bubble; how many forwards it holds
without their backward at once is its peak stash (activation memory).
"""

from __future__ import annotations

import functools

from dt.parallel.pipeline.schedules import schedule
from dt.parallel.pipeline.stash import peak_stash

__all__ = ["Played", "play", "stash"]

Played = tuple[list[list[tuple[str, int, int, float, float]]], list[int]]


@functools.lru_cache(maxsize=1024)
def _orders(name: str, p: int, m: int, v: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    return tuple(tuple(schedule(name, p, s, m, v)) for s in range(p))


@functools.lru_cache(maxsize=4096)
def play(name: str, p: int, m: int, v: int, fwd: tuple[float, ...], bwd: tuple[float, ...],
         send: float) -> Played:
    """Per stage: (kind, chunk, micro-batch, start, end) of every action in order; peak stash per stage.

    fwd[s], bwd[s]: seconds of one chunk's forward / backward on stage s.
    """
    orders = _orders(name, p, m, v)
    done: dict[tuple[str, int, int], float] = {}  # (kind, position, micro-batch) -> end
    fs, bs = fwd, bwd
    free = [0.0] * p
    nxt = [0] * p
    out: list[list[tuple[str, int, int, float, float]]] = [[] for _ in range(p)]
    last = p * v - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, c, i = orders[s][nxt[s]]
                pos = c * p + s
                if kind == "F":
                    dep, hop = (("F", pos - 1, i), send) if pos else (None, 0.0)
                else:
                    dep, hop = (("B", pos + 1, i), send) if pos < last else (("F", pos, i), 0.0)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done[dep] + hop) if dep is not None else free[s]
                end = start + (fs[s] if kind == "F" else bs[s])
                done[(kind, pos, i)] = free[s] = end
                out[s].append((kind, c, i, start, end))
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {name} p={p} m={m} v={v} deadlocks")  # the schedules never do
    return out, stash(name, p, m, v)


@functools.lru_cache(maxsize=4096)
def stash(name: str, p: int, m: int, v: int) -> list[int]:
    """Per stage, the most (chunk, micro-batch) activations held at once: a property of the order
    alone (dt.parallel.pipeline.stash replays it)."""
    return [peak_stash(name, p, s, m, v) for s in range(p)]
