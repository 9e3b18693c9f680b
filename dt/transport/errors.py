"""The errors every dt collective raises: one family, so callers catch one thing.

A timeout is also what torch code expects of one. torch's backends raise
torch.distributed.DistBackendError (a RuntimeError) when a collective times
out, and torch's own code and tests tell a timeout by its wording (its test
suite matches " (Timed out|closed|timeout) "; gloo writes "Timed out waiting
1000ms"). So CollectiveTimeout is a DistBackendError as well, and every
timeout message says `timed_out(seconds)`, beside the rank, step and peer
that only dt's messages name.
"""

from __future__ import annotations

from typing import TypeVar

import torch.distributed as dist

__all__ = ["CollectiveError", "CollectiveTimeout", "everywhere", "is_everywhere", "timed_out"]

E = TypeVar("E", bound=BaseException)


class CollectiveError(RuntimeError):
    """A collective failed: bad input, mismatched ranks, or a lost peer."""


class CollectiveTimeout(CollectiveError, dist.DistBackendError):
    """A wait on a peer outlasted the timeout: the usual symptom of a deadlock.

    Caught by `except CollectiveError`, `except torch.distributed.DistBackendError`
    (what torch's backends raise for a timeout) and `except RuntimeError` alike.
    """


def timed_out(seconds: float) -> str:
    """The words of a timeout, as gloo writes them: "Timed out waiting 1000ms"."""
    return f"Timed out waiting {round(float(seconds) * 1000)}ms"


def everywhere(exc: E) -> E:
    """Mark `exc` as raised by every rank of its group at the same call (validation's
    verdicts): nobody is left waiting, so it is no failure to announce (dt.transport.liveness)."""
    exc.dt_everywhere = True  # type: ignore[attr-defined]
    return exc


def is_everywhere(exc: BaseException) -> bool:
    return bool(getattr(exc, "dt_everywhere", False))
