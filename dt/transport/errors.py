"""The errors every dt collective raises: one family, so callers catch one thing."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["CollectiveError", "CollectiveTimeout", "everywhere", "is_everywhere"]

E = TypeVar("E", bound=BaseException)


class CollectiveError(RuntimeError):
    """A collective failed: bad input, mismatched ranks, or a lost peer."""


class CollectiveTimeout(CollectiveError):
    """A wait on a peer outlasted the timeout: the usual symptom of a deadlock."""


def everywhere(exc: E) -> E:
    """Mark `exc` as raised by every rank of its group at the same call (validation's
    verdicts): nobody is left waiting, so it is no failure to announce (dt.transport.liveness)."""
    exc.dt_everywhere = True  # type: ignore[attr-defined]
    return exc


def is_everywhere(exc: BaseException) -> bool:
    return bool(getattr(exc, "dt_everywhere", False))
