"""Settings every collective reads: how long to wait on a peer, and whether to validate.

One place for both, so a collective never reads the environment itself.
"""

from __future__ import annotations

import os

__all__ = ["get_timeout", "set_timeout", "set_validation", "validation_enabled"]

_timeout_s: float = float(os.environ.get("DT_TIMEOUT", "300"))
_validate: bool = os.environ.get("DT_VALIDATE", "1") not in ("0", "false", "False", "")


def set_timeout(seconds: float) -> None:
    """Longest dt waits on one message before declaring the peer stuck."""
    global _timeout_s
    if seconds <= 0:
        raise ValueError(f"timeout must be positive, got {seconds}")
    _timeout_s = float(seconds)


def get_timeout() -> float:
    return _timeout_s


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
