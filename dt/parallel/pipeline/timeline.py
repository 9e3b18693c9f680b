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
    return _play(_wiring(_orders(name, p, m, v), v), fwd, bwd, send, post, wake, spin)


def play_orders(orders: Orders, v: int, fwd: tuple[float, ...], bwd: tuple[float, ...],
                send: float = 0.0, post: float = 0.0, wake: float = 0.0,
                spin: float = float("inf")) -> list[list[Action]]:
    """play, for any per-stage action orders over v chunks per stage (a forward-only pass, say)."""
    return _play(_wiring(orders, v), fwd, bwd, send, post, wake, spin)


class _Wiring(NamedTuple):
    """The orders as a table the play loop reads by number: per stage its actions' numbers in order;
    per action what it is, the number of the action it waits on (-1: none), whether that input crossed
    from another stage and whether the action itself sends to another stage."""

    stages: tuple[tuple[int, ...], ...]
    actions: tuple[tuple[str, int, int], ...]
    dep: tuple[int, ...]
    received: tuple[bool, ...]
    sends: tuple[bool, ...]


@functools.lru_cache(maxsize=1024)
def _wiring(orders: Orders, v: int) -> _Wiring:
    """Each action's dependency (the module doc's rules), found once per schedule, not per play."""
    p = len(orders)
    last = p * v - 1
    number: dict[tuple[str, int, int], int] = {}
    flat: list[tuple[str, int, int, int]] = []  # (kind, chunk, micro-batch, stage)
    for s, order in enumerate(orders):
        for kind, c, i in order:
            number[(kind, c * p + s, i)] = len(flat)
            flat.append((kind, c, i, s))
    dep, received, sends = [], [], []
    for kind, c, i, s in flat:
        pos = c * p + s
        if kind == "F":
            wanted = ("F", pos - 1, i) if pos else None
            sends.append(pos < last and (pos + 1) % p != s)
        else:
            wanted = ("B", pos + 1, i) if pos < last else ("F", pos, i)
            sends.append(pos > 0 and (pos - 1) % p != s)
        if wanted is not None and wanted not in number:
            raise RuntimeError(f"stage {s}'s {(kind, c, i)} waits on {wanted}, which no stage runs")
        dep.append(-1 if wanted is None else number[wanted])
        received.append(wanted is not None and wanted[1] % p != s)
    stages, first = [], 0
    for order in orders:
        stages.append(tuple(range(first, first + len(order))))
        first += len(order)
    return _Wiring(tuple(stages), tuple((kind, c, i) for kind, c, i, _ in flat), tuple(dep), tuple(received),
                   tuple(sends))


_new_action = tuple.__new__  # Action's fields without the namedtuple's argument-parsing frame


def _play(wiring: _Wiring, fwd: tuple[float, ...], bwd: tuple[float, ...], send: float, post: float,
          wake: float, spin: float) -> list[list[Action]]:
    """Every stage runs its next action as soon as its input has ended (+ the hop when it crossed).
    A stage whose next input has not ended waits on that action: when it ends, the stage runs on.
    Each action is looked at once or twice, however many stages and micro-batches."""
    stages, actions, dep, received, sends = wiring
    ends = [-1.0] * len(actions)
    free = [0.0] * len(stages)
    nxt = [0] * len(stages)
    out: list[list[Action]] = [[] for _ in stages]
    # an action not yet run -> the stage whose next action needs it (an action is the input of at most
    # one other: F feeds the next position's F, or the last position's own B; B the previous one's B)
    waiting: dict[int, int] = {}
    ready = list(range(len(stages)))
    remaining = len(actions)
    while ready:
        s = ready.pop()
        order = stages[s]
        while nxt[s] < len(order):
            a = order[nxt[s]]
            d = dep[a]
            if d >= 0 and ends[d] < 0:
                waiting[d] = s
                break
            start = free[s]
            if received[a]:
                arrives = ends[d] + send
                start = max(start, arrives + wake if arrives > start + spin else arrives)
            elif d >= 0:
                start = max(start, ends[d])
            kind, c, i = actions[a]
            end = start + (fwd[s] if kind == "F" else bwd[s]) + post * (received[a] + sends[a])
            ends[a] = free[s] = end
            out[s].append(_new_action(Action, (kind, c, i, start, end)))
            nxt[s] += 1
            remaining -= 1
            if a in waiting:
                ready.append(waiting.pop(a))
    if remaining:
        stuck = {s: actions[order[nxt[s]]] for s, order in enumerate(stages) if nxt[s] < len(order)}
        raise RuntimeError(f"the stages' orders wait on each other forever: next actions {stuck}")
    return out
