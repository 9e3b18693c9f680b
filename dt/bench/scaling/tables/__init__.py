"""The study's tables: one file each, found by name, so a new table is one new file.

Every module here named t<N>_<what>.py defines `SPEC = TableSpec(...)` (base.py):
its number, its title, what it needs measured and how it is built. This file
imports them all and keeps them by number; the study measures what the
selected ones need and builds them in order. To add a table: copy the nearest
t<N>_*.py to a new number, change what it needs and what it builds; the plots
(plots.py) are optional. A table that measures something the study does not
(tables 8 and 9) names its own worker as a Run in its needs.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable
from typing import Any

from dt.bench.scaling.tables.base import Needs, Results, Run, Table, TableSpec

__all__ = ["ALL_TABLES", "BUILDERS", "TABLES", "TITLES", "Needs", "Results", "Run", "Table", "TableSpec",
           "needs_of"]


def _discover() -> dict[int, TableSpec]:
    specs: dict[int, TableSpec] = {}
    for info in pkgutil.iter_modules(__path__):
        if not re.fullmatch(r"t\d+_\w+", info.name):
            continue
        spec = importlib.import_module(f"{__name__}.{info.name}").SPEC
        if spec.id in specs:
            raise RuntimeError(f"tables/{info.name}.py: table {spec.id} is already defined")
        specs[spec.id] = spec
    return dict(sorted(specs.items()))


TABLES: dict[int, TableSpec] = _discover()
ALL_TABLES: tuple[int, ...] = tuple(TABLES)
TITLES: dict[int, str] = {i: t.title for i, t in TABLES.items()}
BUILDERS: dict[int, Callable[[Results], Table]] = {i: t.build for i, t in TABLES.items()}


def needs_of(settings: Any, tables: Iterable[int] | None = None) -> Needs:
    """Everything the selected tables need measured (default: settings.tables), merged."""
    out = Needs()
    for i in settings.tables if tables is None else tables:
        out = out | TABLES[i].needs(settings)
    return out
