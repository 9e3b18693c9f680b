"""Reading and writing sizes, rates, times and counts as people type and read them.

Sizes: B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (of 1024), and
nccl-tests' bare K, M, G, T, which it reads as powers of 1024 (`-e 128M` is
128 MiB there, so here too).
Rates: B/s .. GB/s, KiB/s .. GiB/s, bit/s, Kbit/s, Mbit/s, Gbit/s.
Times: ns, us, ms, s.
"""

from __future__ import annotations

import math
import re

__all__ = ["fmt_bytes", "fmt_optional", "fmt_time", "parse_rate", "parse_size", "parse_time", "plural"]

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
# nccl-tests' -b/-e suffixes: binary. Sizes only: a rate's "G" (Gbit/s) stays decimal.
_NCCL_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_TIME_UNITS = {"NS": 1e-9, "US": 1e-6, "µS": 1e-6, "MS": 1e-3, "S": 1.0, "": 1.0}


def _split(text: str) -> tuple[float, str]:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*", text)
    if not m:
        raise ValueError(f"cannot read {text!r}: expected a number and a unit, like 4MB")
    return float(m.group(1)), m.group(2)


def parse_size(text: str) -> int:
    """'1GB' -> 10**9 bytes, '1GiB' and '1G' -> 2**30, '4096' -> 4096."""
    value, unit = _split(text)
    u = unit.upper()
    scale = _SIZE_UNITS.get(u, _NCCL_SIZE_UNITS.get(u))
    if scale is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} "
                         f"(use B, KB, MB, GB (1000s), KiB, MiB, GiB or K, M, G (1024s))")
    return int(round(value * scale))


def parse_rate(text: str) -> float:
    """Bytes per second: '450GB/s' -> 4.5e11, '100Gbit/s' -> 1.25e10."""
    value, unit = _split(text)
    u = unit.upper()
    if not u.endswith("/S"):
        raise ValueError(f"a rate needs /s: {text!r} (e.g. 450GB/s or 100Gbit/s)")
    u = u[:-2]
    for bits in ("BIT", "BPS"):
        if u.endswith(bits):
            prefix = u[: -len(bits)]
            return value * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[prefix] / 8
    try:
        return value * _SIZE_UNITS[u]
    except KeyError:
        raise ValueError(f"unknown rate unit {unit!r} in {text!r} (use GB/s, Gbit/s, ...)") from None


def parse_time(text: str) -> float:
    """Seconds: '5us' -> 5e-6, '2ms' -> 2e-3."""
    value, unit = _split(text)
    try:
        return value * _TIME_UNITS[unit.upper()]
    except KeyError:
        raise ValueError(f"unknown time unit {unit!r} in {text!r} (use ns, us, ms, s)") from None


def _missing(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_time(seconds: float | None, digits: int | None = None) -> str:
    """'69.5 ms', '1.500 s', '42 us' (a table's compact form); '-' for a missing value.

    digits=None: fixed decimals per unit (3 for s; 2 below 10 ms, else 1; none for us),
    so a column of times lines up. digits=k: k significant digits ('3.89 us'), for a
    calculator whose small terms matter (`dt model`).
    """
    if _missing(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale or unit == "us":
            v = seconds / scale
            if digits is not None:
                return f"{v:.{digits}g} {unit}"
            places = {"s": 3, "ms": 2 if abs(v) < 10 else 1, "us": 0}[unit]
            return f"{v:.{places}f} {unit}"
    raise AssertionError("unreachable")


def fmt_bytes(n: float | None, digits: int | None = None) -> str:
    """Decimal units, as the original design's tables use: 33,554,432 B is '33.6 MB'.

    digits=None: 2 decimals below 10 of the unit, else 1 ('8.39 MB', '262.1 KB');
    digits=k: k significant digits ('262 KB'). Below 1 KB: whole bytes. '-' if missing.
    """
    if _missing(n):
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.{digits}g} {unit}" if digits is not None else \
                f"{v:.{2 if abs(v) < 10 else 1}f} {unit}"
    return f"{int(n)} B"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 process', '2 processes', '1 thread', '4 threads': the count and its noun, agreed."""
    if n == 1:
        return f"{n:,} {word}"
    return f"{n:,} {many or (word + 'es' if word.endswith(('s', 'sh', 'ch', 'x')) else word + 's')}"


def fmt_optional(value: object, missing: str = "-") -> str:
    """A setting that may be unset: its value, or `missing` for None ('top-k -', not 'top-k None')."""
    return missing if value is None else f"{value}"
