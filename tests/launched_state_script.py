"""A rank program for tests/test_transport_state.py, run by torchrun: `launched_state_script.py OUT`.

Two runs on the same launched ranks (LaunchedWorld keeps the process and its process group
between them): the first leaves everything behind (tests.test_transport_state's careless run,
plus a dt.traffic() record left open and a shared_group made), the second reports what it
starts with. Rank 0 writes every rank's report to OUT as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

import dt
from dt import transport
from dt.launcher import open_world, run_command
from dt.transport import STATE
from dt.transport.shm.segment import DIR
from tests.test_transport_state import _leave_everything_behind, _what_a_run_starts_with

_FIRST: dict[str, Any] = {}  # what the first run left, looked at again by the second


def _careless() -> bool:
    connected = _leave_everything_behind()
    left_open = transport.traffic().__enter__()  # never closed: it would count the next run's bytes
    _FIRST["left open"] = (left_open, left_open.as_dict())
    _FIRST["view"] = transport.resolve_group(None)
    _FIRST["made"] = transport.shared_group([0, 1], "state test")
    return connected


def _fresh() -> dict:
    got = _what_a_run_starts_with()
    with dt.traffic() as t:
        dt.all_reduce(torch.ones(1024))  # 4 KiB on a board of two: counted by this record alone
    got["new view"] = transport.resolve_group(None) is not _FIRST["view"]
    got["made kept"] = transport.shared_group([0, 1], "state test") is _FIRST["made"]
    got["counted"] = {name: c.calls for name, c in t.by_collective.items()}
    left_open, then = _FIRST["left open"]
    got["left open grew"] = left_open.as_dict() != then
    got["pending names"] = len(STATE.segments.pending)
    got["my names"] = sorted(n for n in os.listdir(DIR) if n.startswith(f"dt-{os.getpid()}-"))
    got["pid"] = os.getpid()
    return got


def main(argv: list[str]) -> int:
    with open_world(2) as world:
        world.run(_careless, timeout=120)
        reports = world.run(_fresh, timeout=120)
    if world.rank == 0:
        with open(argv[0], "w") as f:
            json.dump(reports, f)
    return 0


if __name__ == "__main__":
    sys.exit(run_command("launched_state_script", main, sys.argv[1:]))
