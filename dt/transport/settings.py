"""Settings every collective reads: how long to wait on a peer, whether to validate, which wire.

One place for all three, so a collective never reads the environment itself.

How long one wait on a peer may last is decided by ONE function,
`timeout_for(group)`, which every wait in dt.transport asks. The first of
these that is set wins:

1. a timeout given to the call itself (`barrier(timeout=...)`,
   `monitored_barrier(timeout=...)`, `batch_isend_irecv`), while it runs;
2. the group's own timeout: `timeout=` given to `dist.new_group` or
   `dist.init_process_group` (torch's rule; a group created with torch's
   default for its backend, or by dt's launcher, has none of its own);
3. `dt.set_timeout(seconds)`, in this process;
4. the environment variable `DT_TIMEOUT` (seconds);
5. the launcher's: run_workers / WorkerPool / `dt train` give each run's
   ranks a wait a little shorter than the run's own timeout, so a deadlock
   is reported by the stuck ranks before the run is killed;
6. else 300 s.

A timeout is a positive, finite number of seconds, wherever it comes from:
0, negative, nan, inf and text are refused with the same message (the rule
is dt.args.seconds; `DT_TIMEOUT=abc` is refused when a wait first asks, or
up front by every `dt` command line, never at import). The number
`timeout_for` returns remembers which rule chose it (`.source`), for error
messages.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from dt import args

__all__ = ["DEFAULT_TIMEOUT", "SETTINGS", "TIMEOUT_SOURCES", "Settings", "Timeout", "call_timeout",
           "check_environment", "get_timeout",
           "get_transport", "group_timeout", "launcher_owns", "parse_timeout", "set_launcher_timeout",
           "set_timeout", "set_transport", "set_validation", "shared_memory_allowed", "timeout_for",
           "validation_enabled"]

DEFAULT_TIMEOUT = 300.0
# The rules of `timeout_for`, first to last: what `Timeout.source` says chose the number.
TIMEOUT_SOURCES = ("this call's timeout=", "the group's timeout", "dt.set_timeout", "DT_TIMEOUT",
                   "the launcher's", "dt's default")


@dataclass
class Settings:
    """What this process was told (dt.set_*, the launcher) and what it read once, in one place.

    `reset()` (dt.transport.reset) forgets what calls
    and the launcher set; `declared` stays: it describes process groups, which outlive a run
    (those destroyed between runs are dropped: forget_groups).
    A call's own timeout (rule 1) is a context variable, `call_timeout`: it ends with its block.
    """

    user_timeout: float | None = None  # dt.set_timeout (rule 3)
    launcher_timeout: float | None = None  # the launcher's, set for each run (rule 5)
    validate: bool | None = None  # dt.set_validation; None: DT_VALIDATE, else on
    transport: str | None = None  # dt.set_transport; None: DT_TRANSPORT, else auto
    env_timeout: tuple[str | None, float | None] = (None, None)  # DT_TIMEOUT's text, and it parsed
    # id(process group) -> (group, its own timeout in seconds or None): read once per group (rule 2).
    declared: dict[int, tuple[Any, float | None]] = field(default_factory=dict)

    def reset(self) -> None:
        self.user_timeout = self.launcher_timeout = self.validate = self.transport = None
        self.env_timeout = (None, None)


SETTINGS = Settings()


def parse_timeout(value: Any, what: str = "timeout") -> float:
    """A timeout in seconds, or ValueError saying what a timeout must be (dt.args.seconds)."""
    try:
        return args.seconds(value.total_seconds() if hasattr(value, "total_seconds") else value)
    except args.InputError as exc:
        raise args.InputError(f"{what} {exc}") from None


def _env_timeout() -> float | None:
    text = os.environ.get("DT_TIMEOUT", "").strip()
    if SETTINGS.env_timeout[0] != text:  # every wait asks: parse each new value once
        SETTINGS.env_timeout = (text, parse_timeout(text, "DT_TIMEOUT") if text else None)
    return SETTINGS.env_timeout[1]


def set_timeout(seconds: float | None) -> None:
    """Longest dt waits on one message (rule 3 of `timeout_for`); None forgets it."""
    SETTINGS.user_timeout = None if seconds is None else parse_timeout(seconds)


def set_launcher_timeout(seconds: float | None) -> None:
    """The launcher's wait for this run (rule 5): below everything the user sets."""
    SETTINGS.launcher_timeout = None if seconds is None else parse_timeout(seconds)


class Timeout(float):
    """A number of seconds that remembers which rule chose it (for error messages)."""

    source: str

    def __new__(cls, seconds: float, source: str) -> Timeout:
        obj = super().__new__(cls, seconds)
        obj.source = source
        return obj

    def __reduce__(self) -> tuple:  # pickles (a worker's result) with its source
        return (Timeout, (float(self), self.source))


_call_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar("dt_call_timeout",
                                                                             default=None)


@contextlib.contextmanager
def call_timeout(timeout: float | datetime.timedelta | None) -> Iterator[None]:
    """Inside the block, waits use `timeout` (rule 1: the call's own; None: the other rules)."""
    if timeout is not None:
        timeout = parse_timeout(timeout)
    token = _call_timeout.set(timeout)
    try:
        yield
    finally:
        _call_timeout.reset(token)


def launcher_owns(pg: Any) -> None:
    """The launcher created `pg` with a timeout of its own choosing: not the user's (rule 2)."""
    SETTINGS.declared[id(pg)] = (pg, None)


def forget_groups(kept: set[int]) -> None:
    """Drop the timeouts read of every group but those whose ids are `kept` (the destroyed ones:
    an entry holds its group, which would keep it and its threads alive)."""
    SETTINGS.declared = {key: hit for key, hit in SETTINGS.declared.items() if key in kept}


def group_timeout(pg: Any = None) -> float | None:
    """Seconds of the timeout `pg` (None: the default group) was created with; None if not given."""
    if pg is None:
        if not dist.is_initialized():
            return None
        pg = dist.group.WORLD
    hit = SETTINGS.declared.get(id(pg))
    if hit is not None and hit[0] is pg:
        return hit[1]
    seconds = _read_group_timeout(pg)
    SETTINGS.declared[id(pg)] = (pg, seconds)
    return seconds


def _read_group_timeout(pg: Any) -> float | None:
    # torch keeps a group's timeout in its backend's options (dt.ProcessGroup keeps its
    # own the same way, on itself); torch does not record whether the caller gave it,
    # so torch's default for the backend counts as "not given".
    try:
        options = getattr(pg, "options", None) or pg._get_backend(pg._device_types[0]).options
        timeout = options._timeout
        default = dist.distributed_c10d._get_default_timeout(dist.get_backend(pg))
    except (AttributeError, IndexError, RuntimeError, ValueError):
        return None
    return None if timeout == default else timeout.total_seconds()


def timeout_for(group: Any = None) -> Timeout:
    """How long a wait on `group` (a dt Group, a ProcessGroup, or None: the world) may last.

    THE rule (module docstring), every wait's one source: the first of TIMEOUT_SOURCES
    that is set, read in this order and no further than needed.
    """
    seconds = _call_timeout.get()  # 1
    if seconds is not None:
        return Timeout(seconds, TIMEOUT_SOURCES[0])
    pg = getattr(group, "pg", group)
    seconds = group_timeout(pg)  # 2
    if seconds is not None:
        return Timeout(seconds, TIMEOUT_SOURCES[1])
    return get_timeout()


def get_timeout() -> Timeout:
    """Rules 3 to 6 of `timeout_for`: a wait outside any call's timeout, on a group of no
    timeout of its own (the launcher's process group at init)."""
    for seconds, source in zip((SETTINGS.user_timeout, _env_timeout(), SETTINGS.launcher_timeout),
                               TIMEOUT_SOURCES[2:5]):  # 3, 4, 5
        if seconds is not None:
            return Timeout(seconds, source)
    return Timeout(DEFAULT_TIMEOUT, TIMEOUT_SOURCES[5])  # 6


def set_validation(enabled: bool | None) -> None:
    """Check arguments across ranks before each collective (on by default; None: DT_VALIDATE).

    The check is one Bruck all-gather of an 8(8+2p)-byte signature per collective:
    ceil(lg p) tiny messages. It turns a mismatch (different lengths, dtypes,
    roots, or a rank calling another collective) into the same clear error on
    every rank, where gloo would abort the receiving process. Benchmarks turn it
    off, as torch.distributed runs without such a check by default.
    """
    SETTINGS.validate = None if enabled is None else bool(enabled)


def _env_validation() -> bool:
    return args.env_value("DT_VALIDATE", True)


def validation_enabled() -> bool:
    enabled = SETTINGS.validate
    return _env_validation() if enabled is None else enabled


def check_environment() -> None:
    """Read every DT_* variable now (dt.args.ENVIRONMENT): ValueError naming the bad one."""
    args.check_environment()


def set_transport(name: str | None) -> None:
    """Which wire groups connected from now on use between ranks of one host.

    "auto" (default): shared memory wherever ranks share a host and the CPU
    allows it (dt.args.shared_memory_refused: x86 only), torch.distributed
    elsewhere; "shm" the same, refused on a CPU that does not allow it.
    "torch" (or "gloo", "nccl"): torch.distributed for every peer. Read when a group
    connects (its first collective), so every rank must set the same value
    before then; `DT_TRANSPORT` sets it for a whole run; None forgets this call.
    """
    if name is not None:
        try:
            name = args.transport(name)
        except args.InputError as exc:
            raise args.InputError(f"transport {exc}") from None
    SETTINGS.transport = name


def get_transport() -> str:
    if SETTINGS.transport is not None:
        return SETTINGS.transport
    return args.env_value("DT_TRANSPORT", "auto")


def shared_memory_allowed() -> bool:
    """Whether a group connecting now may use the shared-memory wire (chosen, and this CPU's)."""
    return get_transport() in ("auto", "shm") and args.shared_memory_refused() is None
