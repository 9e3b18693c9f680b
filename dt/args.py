"""What people type, checked at the door: every command line, and dt's environment variables.

Each `dt` command builds its options with `Parser` and these types, so a bad
value is refused before any process starts, in one line, with exit status 2:

    $ dt train --steps 0
    dt train: error: argument --steps: must be a whole number >= 1, got '0' (see dt train --help)

never a traceback, and never a silent exit 0 with nothing done. A check that
spans options (a batch that must split over --dp) calls `parser.error(...)`,
which says it the same way. DT_TIMEOUT and DT_VALIDATE are read by the same
rules (`seconds`, `boolean`), so `dt` refuses a bad one up front too.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from dt.units import parse_rate, parse_size, parse_time

__all__ = ["ENVIRONMENT", "MAX_WORLD", "InputError", "Parser", "at_least", "boolean", "check_environment",
           "duration", "finite", "listed", "positive", "rate", "seconds", "size", "world"]

MAX_WORLD = 4096  # local processes: beyond this it is a typo, not a plan


class InputError(argparse.ArgumentTypeError, ValueError):
    """A value people typed that dt refuses; argparse shows its text as is."""


def _number(text: Any, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(str(text).strip())
    except ValueError:
        raise InputError(f"must be {what}, got {text!r}") from None


def at_least(low: int) -> Callable[[str], int]:
    """A whole number >= low (at_least(1) for counts of steps, at_least(0) for 'none allowed')."""
    def check(text: str) -> int:
        value = _number(text, int, f"a whole number >= {low}")
        if value < low:
            raise InputError(f"must be a whole number >= {low}, got {text!r}")
        return value
    check.__name__ = f"at_least_{low}"
    return check


def world(text: str) -> int:
    """A number of ranks: 1 to MAX_WORLD."""
    value = _number(text, int, "a number of processes (1 or more)")
    if not 1 <= value <= MAX_WORLD:
        raise InputError(f"must be a number of processes from 1 to {MAX_WORLD}, got {text!r}")
    return value


def finite(text: str) -> float:
    """Any finite number (no nan, no inf)."""
    value = _number(text, float, "a number")
    if not math.isfinite(value):
        raise InputError(f"must be a finite number, got {text!r}")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (a learning rate, a factor)."""
    value = finite(text)
    if value <= 0:
        raise InputError(f"must be a number > 0, got {text!r}")
    return value


def seconds(text: Any) -> float:
    """A timeout: a positive, finite number of seconds."""
    try:
        value = float(str(text).strip())
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"must be a positive, finite number of seconds, got {text!r} (for a very "
                         "long wait give a large number, e.g. 86400)")
    return value


def size(text: str) -> int:
    """A message size people type (4096, 64KB, 1GiB): at least one byte."""
    try:
        value = parse_size(str(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if value < 1:
        raise InputError(f"must be at least 1 byte, got {text!r}")
    return value


def rate(text: str) -> float:
    """A rate people type (100GB/s, 25Gbit/s): more than 0."""
    try:
        value = parse_rate(str(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"must be a rate above 0, got {text!r}")
    return value


def duration(text: str) -> float:
    """A time people type (5us, 2ms): 0 or more."""
    try:
        value = parse_time(str(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not (value >= 0 and math.isfinite(value)):
        raise InputError(f"must be a time of 0 or more, got {text!r}")
    return value


def listed(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    """A comma-separated list ('2,4,8'), each item checked by `item`, at least one item."""
    def check(text: str) -> tuple[Any, ...]:
        parts = [p for p in str(text).replace(" ", "").split(",") if p]
        if not parts:
            raise InputError(f"must be a comma-separated list, like 2,4,8, got {text!r}")
        try:
            return tuple(item(p) for p in parts)
        except InputError as exc:
            raise InputError(f"{exc} (in the list {text!r})") from None
    return check


def boolean(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise InputError(f"must be 1 or 0 (true/false, yes/no, on/off), got {text!r}")


# The environment variables dt reads, and the rule each one's value follows.
ENVIRONMENT: dict[str, Callable[[str], Any]] = {"DT_TIMEOUT": seconds, "DT_VALIDATE": boolean}


def check_environment() -> None:
    """InputError naming the first of dt's environment variables that holds a bad value."""
    for name, rule in ENVIRONMENT.items():
        text = os.environ.get(name, "").strip()
        if text:
            try:
                rule(text)
            except InputError as exc:
                raise InputError(f"{name} {exc}") from None


class Parser(argparse.ArgumentParser):
    """argparse, with every refusal in one line (exit 2) and the environment checked too."""

    def error(self, message: str) -> Any:  # noqa: ANN401 - argparse's signature (never returns)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # noqa: ANN401
        parsed = super().parse_args(args, namespace)
        try:
            check_environment()
        except InputError as exc:
            self.error(str(exc))
        return parsed
