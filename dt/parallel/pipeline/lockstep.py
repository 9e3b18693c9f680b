"""The schedule on a common clock: how a stage posts its messages where receives may not go ahead.

On NCCL every operation between two ranks runs in order on one stream, and a
send completes only once its receiver's matching receive runs: a send posted
on its own can block the stream it is on until the peer gets to it, and the
peer may first need something queued behind it. So each stage posts in
lockstep, as Megatron-LM and torch.distributed.pipelining do. Every action
gets a tick: one after the later of its stage's previous action and the
action it waits on (timeline.play with every action one unit long, so a
message is always taken at a later tick than it was made). At each tick a
stage posts one batch: what it sends at that tick and the receives of what
its neighbours send at that tick. The batches of one tick pair up exactly
between any two ranks (one action per stage and tick: at most one message
each way), so in tick order every batch finds its peers' at the head of
their streams, for any schedule whose orders timeline.play walks to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.parallel.pipeline.schedules import neighbour
from dt.parallel.pipeline.timeline import Orders, play_orders

__all__ = ["Message", "StagePlan", "stage_plan"]


@dataclass(frozen=True)
class Message:
    """One message of a step, as one of its two stages sees it."""

    tick: int
    peer: int      # the other stage
    kind: str      # "F": an activation, "B": its gradient
    chunk: int     # the chunk of this stage it leaves from or arrives to
    micro_batch: int


@dataclass(frozen=True)
class StagePlan:
    """One stage's messages to other stages, each list in the order the stage posts it."""

    sends: tuple[Message, ...]
    receives: tuple[Message, ...]


def stage_plan(orders: Orders, v: int, stage: int) -> StagePlan:
    """The messages `stage` sends and receives, with their ticks (a message to itself is no message)."""
    p = len(orders)
    ones = (1.0,) * p
    sends: list[Message] = []
    receives: list[Message] = []
    for s, played in enumerate(play_orders(orders, v, ones, ones)):
        for kind, c, i, start, _ in played:
            dst = neighbour(p, v, s, c, +1 if kind == "F" else -1)
            if dst is None or dst == s or stage not in (s, dst):
                continue
            tick = round(start)
            if s == stage:
                sends.append(Message(tick, dst, kind, c, i))
            else:  # it arrives at the chunk next to c: the position after (forward) or before it
                pos = c * p + s + (1 if kind == "F" else -1)
                receives.append(Message(tick, s, kind, pos // p, i))
    return StagePlan(tuple(sends), tuple(sorted(receives, key=lambda r: (r.tick, r.peer))))
