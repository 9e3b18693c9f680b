"""The pipeline's schedule played out with predicted durations (dt.parallel.pipeline.timeline).

Each stage runs dt.parallel.pipeline.schedules.schedule's own action order.
An action starts when its stage is free and its input has arrived:

    F(chunk c, micro-batch i) at virtual position c*p + s needs F(c', i) of position - 1
    B(c, i) needs B of position + 1, or, on the last position, its own F(c, i)

plus `send` seconds for the activation (or its gradient) to cross between
stages, `post` of each end's core per message, and `wake` when the receiver had
waited past its spin and slept (dt.cost.overheads: what `dt tune` measured).
What a stage waits is its bubble; how many forwards it holds
without their backward at once is its peak stash (activation memory).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from dt.parallel.pipeline import timeline
from dt.parallel.pipeline.stash import peak_stash
from dt.parallel.pipeline.timeline import Action

__all__ = ["Action", "Played", "last_end", "play", "stash"]


class Played(NamedTuple):
    """A schedule played out: each stage's actions in order, and each stage's peak stash."""

    actions: list[list[Action]]
    stash: list[int]


@functools.lru_cache(maxsize=4096)
def play(name: str, stages: int, micro_batches: int, virtual: int, fwd: tuple[float, ...],
         bwd: tuple[float, ...], send: float, post: float = 0.0, wake: float = 0.0,
         spin: float = float("inf")) -> Played:
    """Per stage: every action in order, with its start and end; peak stash per stage.

    fwd[s], bwd[s]: seconds of one chunk's forward / backward on stage s; post, wake, spin: a
    message's cost to each end's core, a sleeping receiver's wake-up and how long it spins first.
    """
    actions = timeline.play(name, stages, micro_batches, virtual, fwd, bwd, send, post=post, wake=wake,
                            spin=spin)
    return Played(actions, stash(name, stages, micro_batches, virtual))


def last_end(actions: list[list[Action]]) -> float:
    """When the last stage to finish ends its last action."""
    return max(stage[-1].end for stage in actions if stage)


@functools.lru_cache(maxsize=4096)
def stash(name: str, stages: int, micro_batches: int, virtual: int) -> list[int]:
    """Per stage, the most (chunk, micro-batch) activations held at once: a property of the order
    alone (dt.parallel.pipeline.stash replays it)."""
    return [peak_stash(name, stages, s, micro_batches, virtual) for s in range(stages)]
