"""No shared-memory segment outlives a test module: the check every tests/test_shm_*.py uses.

`no_leaked_segments` (module scope, autouse where imported) lists /dev/shm
before and after the module; a dt segment that appeared and is still there
is a leak when its creator (the pid in its name) is dead, or is one of this
test session's processes. Segments of other people's runs on a shared
machine (live creators outside this process tree) are not ours to judge.
"""

from __future__ import annotations

import os

import pytest

from dt.transport.shm.segment import DIR, alive


def dt_segments() -> set[str]:
    try:
        return {n for n in os.listdir(DIR) if n.startswith("dt-")}
    except OSError:
        return set()


def _creator(name: str) -> int:
    try:
        return int(name.split("-")[1])
    except (IndexError, ValueError):
        return -1


def _ours(pid: int) -> bool:
    """Whether pid descends from this test process."""
    me = os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def leaked(before: set[str]) -> list[str]:
    out = []
    for name in sorted(dt_segments() - before):
        pid = _creator(name)
        if not alive(pid) or _ours(pid):
            out.append(name)
    return out


@pytest.fixture(scope="module", autouse=True)
def no_leaked_segments():
    before = dt_segments()
    yield
    assert leaked(before) == [], "shared-memory segments left in /dev/shm"
