"""Shared by the benchmarks: the machine, robust statistics, markdown tables, files on disk.

Every figure a benchmark prints is a median over repetitions with its spread
(min..max), and every result file carries the machine it was measured on, so
a number never travels without the conditions that produced it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dt.record import cpu_model
from dt.units import fmt_bytes, fmt_time  # noqa: F401  (the tables' formats live in dt.units)

README_BEGIN = "<!-- scaling:begin -->"
README_END = "<!-- scaling:end -->"


# --------------------------------------------------------------------------
# The machine.
# --------------------------------------------------------------------------


def machine(backend: str = "gloo") -> dict[str, Any]:
    """What a result was measured on: cores, CPU, torch, backend, OS."""
    import torch

    return {
        "cores": os.cpu_count() or 1,
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "backend": backend,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }


def machine_line(m: dict[str, Any]) -> str:
    """The machine in one line; no wire: each run says the wires it used (`wires_line`)."""
    return (f"{m['cores']} cores ({m['cpu']}), torch {m['torch']}, backend {m['backend']}, "
            f"Python {m['python']}, {m['os']}")


def wire_label(wire: str, backend: str = "gloo") -> str:
    """What a dt wire name (dt.traffic().by_wire's keys, a group's wires) means on this machine."""
    return {"shm": "shared memory", "torch": f"torch.distributed ({backend})"}.get(wire, wire)


def oversubscription_note(world: int, cores: int) -> str | None:
    """What to say when a run has more processes than cores: it competes with itself."""
    if world <= cores:
        return None
    return (f"world {world} > {cores} cores: the {world} ranks share {cores} cores "
            f"(oversubscribed), so every rank's compute and communication compete with the others'; "
            f"these times measure contention as much as the algorithm")


# --------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """Median and spread of repeated measurements (seconds, bytes, ...)."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        xs = [float(x) for x in samples]
        if not xs:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    @property
    def spread(self) -> float:
        """(max - min) / median: how much to trust the median."""
        return (self.hi - self.lo) / self.median if self.median else math.nan

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "n": self.n}


def per_rep_max(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Repetition i took as long as its slowest rank: max over ranks, per repetition."""
    return [max(col) for col in zip(*per_rank)]


# --------------------------------------------------------------------------
# Formatting. Bytes and times: dt.units.fmt_bytes / fmt_time, imported above, so the
# benchmarks, `dt model` and the tables write sizes and times one way.
# --------------------------------------------------------------------------


def fmt_stat_time(st: Stat) -> str:
    """'12.3 ms (±4%)': the median and half the relative spread."""
    if st.n == 0 or math.isnan(st.median):
        return "-"
    if st.n == 1 or not st.median:
        return fmt_time(st.median)
    return f"{fmt_time(st.median)} (±{50 * st.spread:.0f}%)"


def fmt_pct(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.{digits}f}%"


def fmt_ratio(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.2f}x"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table; `align` per column is 'l' or 'r' (numbers right)."""
    cells = [[str(c) for c in row] for row in rows]
    if align is None:
        align = ["l"] + ["r"] * (len(headers) - 1)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        out = []
        for v, w, a in zip(values, widths, align):
            out.append(v.rjust(w) if a == "r" else v.ljust(w))
        return "| " + " | ".join(out) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":" if a == "r" else "-" * (w + 2))
                          for w, a in zip(widths, align)) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in cells])


# --------------------------------------------------------------------------
# Files.
# --------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    if isinstance(x, Stat):
        return x.as_dict()
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        return x.item()
    return x


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(payload), indent=2, sort_keys=False) + "\n")
    return path


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def replace_between_markers(text: str, body: str, begin: str = README_BEGIN,
                            end: str = README_END) -> str | None:
    """`text` with what lies between the markers replaced by `body`; None if they are missing."""
    i = text.find(begin)
    j = text.find(end, i + len(begin)) if i >= 0 else -1
    if i < 0 or j < 0:
        return None
    return text[: i + len(begin)] + "\n" + body.strip("\n") + "\n" + text[j:]


def update_readme(readme: Path, body: str) -> bool:
    """Write `body` between the scaling markers of README; False (untouched) if absent."""
    if not readme.is_file():
        return False
    new = replace_between_markers(readme.read_text(), body)
    if new is None:
        return False
    readme.write_text(new)
    return True
