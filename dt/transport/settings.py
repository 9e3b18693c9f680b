"""Settings every collective reads: how long to wait on a peer, and whether to validate.

One place for both, so a collective never reads the environment itself.
"""

from __future__ import annotations

import os

__all__ = ["get_timeout", "get_transport", "set_timeout", "set_transport", "set_validation",
           "validation_enabled"]

_timeout_s: float = float(os.environ.get("DT_TIMEOUT", "300"))
_validate: bool = os.environ.get("DT_VALIDATE", "1") not in ("0", "false", "False", "")
_TRANSPORTS = ("auto", "shm", "torch", "gloo", "nccl")
_transport: str = os.environ.get("DT_TRANSPORT", "auto").strip().lower() or "auto"


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


def set_transport(name: str) -> None:
    """Which wire groups connected from now on use between ranks of one host.

    "auto" (default; "shm" is the same): shared memory wherever ranks share a
    host, torch.distributed elsewhere. "torch" (or "gloo", "nccl"): torch.distributed
    for every peer, as before the shared-memory wire existed. Read when a group
    connects (its first collective), so every rank must set the same value
    before then; `DT_TRANSPORT` sets it for a whole run.
    """
    global _transport
    name = name.strip().lower()
    if name not in _TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(_TRANSPORTS)}, got {name!r}")
    _transport = name


def get_transport() -> str:
    if _transport not in _TRANSPORTS:
        raise ValueError(f"DT_TRANSPORT must be one of {', '.join(_TRANSPORTS)}, got {_transport!r}")
    return _transport


def shared_memory_allowed() -> bool:
    return get_transport() in ("auto", "shm")
