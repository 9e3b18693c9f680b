"""`dt model --measured`'s account of the terms beyond alpha, beta, gamma, and of how close it came.

The terms (dt.cost.overheads) are printed as `dt tune` measured them, and
after the tables one line per wire counts the (algorithm, size) pairs whose
prediction is within TOLERANCE (20%) of the measurement.
"""

from __future__ import annotations

from typing import Any

from dt.units import fmt_time

__all__ = ["TOLERANCE", "describe", "within"]

TOLERANCE = 0.20  # |predicted - measured| / measured


def describe(terms: dict[str, Any]) -> str:
    """One line: each term's figure, as dt tune saved it."""
    return (f"post {fmt_time(terms.get('post', 0.0), 3)} per message beyond a step's two, wake "
            f"{fmt_time(terms.get('wake', 0.0), 3)} (waits spin {fmt_time(terms.get('spin', 0.0), 3)}), "
            f"one rank alone pays {terms.get('solo', 1.0):.2f} of a byte copied all at once and "
            f"{terms.get('solo_reduce', 1.0):.2f} of one reduced, oversubscription "
            f"{fmt_time(terms.get('oversub', 0.0), 3)} of each step's alpha")


def within(tables: dict[str, dict[int, list]], measured: dict[str, dict[str, dict[str, float]]],
           tolerance: float = TOLERANCE) -> dict[str, tuple[int, int]]:
    """Per wire: (pairs within `tolerance` of the measurement, pairs measured)."""
    out = {}
    for wire, by_size in tables.items():
        good = total = 0
        for nbytes, rows in by_size.items():
            times = measured.get(wire, {}).get(str(nbytes), {})
            for name, e in rows:
                if name in times and times[name] > 0:
                    total += 1
                    good += abs(e.total - times[name]) / times[name] <= tolerance
        out[wire] = (good, total)
    return out
