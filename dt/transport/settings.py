"""Settings every collective reads: how long to wait on a peer, and whether to validate.

One place for both, so a collective never reads the environment itself.

How long a wait may last follows torch.distributed's rule, decided in one
function, `timeout_for(group)`, which every wait in dt.transport asks:

1. a timeout given to the call itself (`barrier(timeout=...)`,
   `monitored_barrier(timeout=...)`), while that call runs;
2. else the group's own timeout, when one was given to `init_process_group`
   or `new_group` (`timeout=timedelta(...)`), as torch's backends use it;
3. else `dt.set_timeout(...)`, else `DT_TIMEOUT` (300 s by default).

torch records a group's timeout but not whether the caller gave it, so a
group whose timeout equals torch's default for its backend (30 min for gloo,
10 min for NCCL) counts as "not given" and rule 3 applies.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import os
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from dt.transport.group import Group

__all__ = ["Timeout", "call_timeout", "get_timeout", "group_timeout", "set_timeout", "set_validation",
           "timeout_for", "validation_enabled"]

_timeout_s: float = float(os.environ.get("DT_TIMEOUT", "300"))
_validate: bool = os.environ.get("DT_VALIDATE", "1") not in ("0", "false", "False", "")


def set_timeout(seconds: float) -> None:
    """Longest dt waits on one message before declaring the peer stuck, for groups
    created without a timeout of their own."""
    global _timeout_s
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {seconds}")
    _timeout_s = float(seconds)


def get_timeout() -> float:
    """dt.set_timeout / DT_TIMEOUT: the last rule of `timeout_for`."""
    return _timeout_s


class Timeout(float):
    """A number of seconds that remembers which rule chose it (for error messages)."""

    source: str

    def __new__(cls, seconds: float, source: str) -> Timeout:
        obj = super().__new__(cls, seconds)
        obj.source = source
        return obj


_call_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar("dt_call_timeout",
                                                                             default=None)


@contextlib.contextmanager
def call_timeout(timeout: float | datetime.timedelta | None) -> Iterator[None]:
    """Inside the block, waits use `timeout` (the call's own; None: the usual rules)."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    token = _call_timeout.set(timeout)
    try:
        yield
    finally:
        _call_timeout.reset(token)


# id(process group) -> (the group, its declared timeout in seconds or None).
# Read once per group: every message's wait asks.
_declared: dict[int, tuple[Any, float | None]] = {}


def group_timeout(pg: Any = None) -> float | None:
    """Seconds of the timeout `pg` (None: the default group) was created with; None if not given."""
    if pg is None:
        if not dist.is_initialized():
            return None
        pg = dist.distributed_c10d._get_default_group()
    hit = _declared.get(id(pg))
    if hit is not None and hit[0] is pg:
        return hit[1]
    seconds = _read_group_timeout(pg)
    _declared[id(pg)] = (pg, seconds)
    return seconds


def _read_group_timeout(pg: Any) -> float | None:
    # torch's backends keep it in `options._timeout`; dt.ProcessGroup keeps its own the same way.
    options = getattr(pg, "options", None)
    if options is None:
        for device in pg._device_types:
            try:
                options = pg._get_backend(device).options
                break
            except (RuntimeError, AttributeError):
                continue
    timeout = getattr(options, "_timeout", None)
    if timeout is None:
        return None
    default = dist.distributed_c10d._get_default_timeout(dist.get_backend(pg))
    return None if timeout == default else timeout.total_seconds()


def timeout_for(group: Group | Any = None) -> Timeout:
    """How long a wait on `group` (a dt Group, a ProcessGroup, or None) may last: THE rule."""
    call = _call_timeout.get()
    if call is not None:
        return Timeout(call, "this call's timeout=")
    declared = group_timeout(group.pg if isinstance(group, Group) else group)
    if declared is not None:
        return Timeout(declared, "the group's timeout")
    return Timeout(_timeout_s, "DT_TIMEOUT / dt.set_timeout")


def set_validation(enabled: bool) -> None:
    """Check arguments across ranks before each collective (on by default).

    The check is one Bruck all-gather of an 8(8+2p)-byte signature per collective:
    ceil(lg p) tiny messages. It turns a mismatch (different lengths, dtypes,
    roots, or a rank calling another collective) into the same clear error on
    every rank, where gloo would abort the receiving process. Benchmarks turn it
    off, as torch.distributed runs without such a check by default.
    """
    global _validate
    _validate = bool(enabled)


def validation_enabled() -> bool:
    return _validate
