"""Timeouts follow torch.distributed's rule: the group's own timeout when one was given, else DT_TIMEOUT.

The rule lives in one function, dt.transport.timeout_for; here it is checked
directly, then with a rank arriving late at a barrier of a group whose
timeout is shorter, or longer, than dt.set_timeout's, next to what torch's
gloo does in the same situation. The groups a timeout breaks are throwaway
subgroups, so the pool's default group stays usable. No timing assertions:
a run's own timeout (far below the 60 s DT_TIMEOUT) is what shows which
timeout fired, and the error says which rule chose it.
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch.distributed as dist

import dt
from dt import transport


def _rule() -> list:
    dt.set_timeout(42)
    given = dist.new_group(timeout=datetime.timedelta(seconds=7))
    plain = dist.new_group()
    torchs_default = dist.new_group(timeout=datetime.timedelta(minutes=30))  # gloo's default
    out = []
    for g in (given, plain, torchs_default, None):
        t = transport.timeout_for(transport.resolve_group(g))
        out.append((float(t), t.source))
    with transport.call_timeout(datetime.timedelta(seconds=3)):
        t = transport.timeout_for(transport.resolve_group(given))
        out.append((float(t), t.source))
    return out


def test_the_rule_call_then_group_then_dt_timeout(run):
    given, plain, default, world, call = run(2, _rule)[0]
    assert given == (7.0, "the group's timeout")
    assert plain == (42.0, "dt.set_timeout")
    assert default == (42.0, "dt.set_timeout")  # indistinguishable from "not given"
    assert world == (42.0, "dt.set_timeout")  # the pool's group was made without one
    assert call == (3.0, "this call's timeout=")


def _late_rank(barrier: str, group_s: float, dt_s: float, late_s: float) -> tuple[str, str]:
    """Rank 1 reaches a barrier of a fresh group `late_s` after the others.

    barrier: "torch" (dist.barrier on gloo), "dt" (dt.barrier on gloo), or
    "dt backend" (dist.barrier on a group of torch's backend "dt").
    """
    backend = "dt" if barrier == "dt backend" else None
    group = dist.new_group(timeout=datetime.timedelta(seconds=group_s), backend=backend)
    dt.set_timeout(dt_s)
    dt.barrier(group=group)  # every connection of the new group made before the clock matters
    if dist.get_rank() == 1:
        time.sleep(late_s)
    try:
        (dt.barrier if barrier == "dt" else dist.barrier)(group=group)
    except RuntimeError as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


@pytest.mark.parametrize("barrier", ("torch", "dt", "dt backend"))
def test_group_timeout_shorter_than_dt_timeout_fires(run, barrier):
    # DT_TIMEOUT is 60 s and the run may last 30: only the group's 1 s can end the wait.
    results = run(3, _late_rank, barrier, 1.0, 60.0, 2.5, timeout=30)
    for r in (0, 2):  # the ranks that waited
        kind, message = results[r]
        if barrier == "torch":
            assert kind == "RuntimeError" and "Timed out waiting 1000ms" in message
        else:
            assert kind == "CollectiveTimeout", results
            assert "Timed out waiting 1000ms (the group's timeout)" in message
            # at step 0 on the torch wire; on shared memory the signatures meet at one
            # synchronisation of the group's board (dt.collectives.validate)
            assert "in validate(barrier call" in message
            assert "at step " in message or "at sync " in message
            assert "rank 1" in message  # the peer it waited on, directly or through the dissemination
    late_kind, late_message = results[1]
    assert late_kind != "ok"  # it arrives to find its peers gone, and says so
    if barrier != "torch":
        assert late_kind in ("CollectiveError", "CollectiveTimeout")
        assert "at step" in late_message or "at sync" in late_message


@pytest.mark.parametrize("barrier", ("torch", "dt"))
def test_group_timeout_longer_than_dt_timeout_is_the_one_used(run, barrier):
    # DT_TIMEOUT is 0.5 s, rank 1 is 1.5 s late, the group allows 30 s: no error, as with torch.
    assert run(3, _late_rank, barrier, 30.0, 0.5, 1.5) == [("ok", "")] * 3
