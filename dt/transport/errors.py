"""The errors every dt collective raises: one family, so callers catch one thing."""

from __future__ import annotations

__all__ = ["CollectiveError", "CollectiveTimeout"]


class CollectiveError(RuntimeError):
    """A collective failed: bad input, mismatched ranks, or a lost peer."""


class CollectiveTimeout(CollectiveError):
    """A wait on a peer outlasted the timeout: the usual symptom of a deadlock."""
