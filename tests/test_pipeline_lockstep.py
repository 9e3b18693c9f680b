"""The lockstep plan (dt.parallel.pipeline.lockstep): its batches, replayed as NCCL runs them, never
deadlock, for every schedule, and every message is taken after the tick it is sent at.

The runtime posting these batches under NCCL's rules is tests/test_nccl_rules_parallel.py.
"""

from __future__ import annotations

import pytest

from dt.parallel.pipeline import schedule
from dt.parallel.pipeline.lockstep import stage_plan
from dt.parallel.pipeline.timeline import play_orders
from dt.transport.rules import Batch, Op, simulate


def _batches(orders: tuple, v: int) -> list[dict]:
    """Every stage's batches as the link posts them: per tick, its send and its receives."""
    traces = []
    for s in range(len(orders)):
        plan = stage_plan(orders, v, s)
        ticks: dict[int, list[Op]] = {}
        for msg in plan.sends:
            ticks.setdefault(msg.tick, []).append(Op("send", msg.peer, 1))
        for msg in plan.receives:
            ticks.setdefault(msg.tick, []).append(Op("recv", msg.peer, 1))
        traces.append({"rank": s, "violations": [],
                       "batches": [Batch("pipeline", tuple(ticks[t]), f"tick {t}") for t in sorted(ticks)]})
    return traces


@pytest.mark.parametrize("name,virtual", [("gpipe", (1,)), ("1f1b", (1,)), ("interleaved", (2, 3, 4))])
def test_lockstep_batches_never_deadlock_on_nccl(name, virtual):
    for p in range(2, 7):
        for v in virtual:
            for m in range(1, 13):
                orders = tuple(tuple(schedule(name, p, s, m, v)) for s in range(p))
                forwards = tuple(tuple((k, c, i) for k, c, i in o if k == "F") for o in orders)  # forward
                for o in (orders, forwards):
                    assert simulate(_batches(o, v)) == [], (name, p, v, m)


def test_a_message_is_taken_after_it_is_sent():
    p, v, m = 4, 2, 6
    orders = tuple(tuple(schedule("interleaved", p, s, m, v)) for s in range(p))
    played = play_orders(orders, v, (1.0,) * p, (1.0,) * p)
    for s in range(p):
        start = {(kind, c, i): round(t0) for kind, c, i, t0, _ in played[s]}
        plan = stage_plan(orders, v, s)
        assert [msg.tick for msg in plan.sends] == sorted(msg.tick for msg in plan.sends)
        for msg in plan.receives:  # taken by the action it feeds: the same kind, chunk and micro-batch
            assert start[msg.kind, msg.chunk, msg.micro_batch] > msg.tick, (s, msg)
