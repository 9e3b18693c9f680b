"""A schedule played out with durations: when each stage's actions start and end.

Each stage runs dt.parallel.pipeline.schedules.schedule's own action order.
An action starts when its stage is free and its input has arrived:

    F(chunk c, micro-batch i) at virtual position c*p + s needs F(c', i) of position - 1
    B(c, i) needs B of position + 1, or, on the last position, its own F(c, i)

plus `send` seconds for the activation (or its gradient) to cross between
stages. What a stage waits is its bubble. The planner (dt.plan) plays it with
predicted durations; the scaling study's bubble table with unit ones.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from dt.parallel.pipeline.schedules import schedule

__all__ = ["Action", "Orders", "play", "play_orders"]


class Action(NamedTuple):
    """One of a stage's actions, played out: what it runs and when (seconds from the step's start)."""

    kind: str  # "F" (forward) or "B" (backward)
    chunk: int  # which of the stage's model chunks (interleaved: 0 .. v-1)
    micro_batch: int
    start: float
    end: float


Orders = tuple[tuple[tuple[str, int, int], ...], ...]  # each stage's ("F"|"B", chunk, micro-batch) actions


@functools.lru_cache(maxsize=1024)
def _orders(name: str, p: int, m: int, v: int) -> Orders:
    return tuple(tuple(schedule(name, p, s, m, v)) for s in range(p))


@functools.lru_cache(maxsize=4096)
def play(name: str, p: int, m: int, v: int, fwd: tuple[float, ...], bwd: tuple[float, ...],
         send: float = 0.0, post: float = 0.0, wake: float = 0.0,
         spin: float = float("inf")) -> list[list[Action]]:
    """Per stage: every action, in its order, with its start and end.

    fwd[s], bwd[s]: seconds of one chunk's forward / backward on stage s. A message between
    stages also costs its two ends' cores `post` each (posting the send, taking the receive:
    the action's own time), and a receiver that waited longer than `spin` went to sleep and
    starts `wake` after the message lands (dt.cost.overheads' terms, as `dt tune` measures them).
    """
    return play_orders(_orders(name, p, m, v), v, fwd, bwd, send, post, wake, spin)


def play_orders(orders: Orders, v: int, fwd: tuple[float, ...], bwd: tuple[float, ...],
                send: float = 0.0, post: float = 0.0, wake: float = 0.0,
                spin: float = float("inf")) -> list[list[Action]]:
    """play, for any per-stage action orders over v chunks per stage (a forward-only pass, say)."""
    p = len(orders)
    done: dict[tuple[str, int, int], float] = {}  # (kind, position, micro-batch) -> end
    free = [0.0] * p
    nxt = [0] * p
    out: list[list[Action]] = [[] for _ in range(p)]
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
                    sends = pos < last and (pos + 1) % p != s
                else:
                    dep, hop = (("B", pos + 1, i), send) if pos < last else (("F", pos, i), 0.0)
                    sends = pos > 0 and (pos - 1) % p != s
                if dep is not None and dep not in done:
                    break  # waits on another stage
                start = free[s]
                received = dep is not None and dep[1] % p != s  # its input crossed from another stage
                if received:
                    arrives = done[dep] + hop
                    start = max(start, arrives + wake if arrives > free[s] + spin else arrives)
                elif dep is not None:
                    start = max(start, done[dep])
                end = start + (fwd[s] if kind == "F" else bwd[s]) + post * (received + sends)
                done[(kind, pos, i)] = free[s] = end
                out[s].append(Action(kind, c, i, start, end))
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: orders[s][nxt[s]] for s in range(p) if nxt[s] < len(orders[s])}
            raise RuntimeError(f"the stages' orders wait on each other forever: next actions {stuck}")
    return out
