"""What the learner has done, in a small JSON file in the working directory.

    .dt-learn.json   {"passed": {"ring_all_reduce": {"file": ..., "at": ...}}, "hints": {...}}

`dt judge` records a pass of the full default judge; `dt exercises solution`
shows the reference only after one (or with --give-up, which is recorded
too); `dt exercises hint` remembers how many hints were shown.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

__all__ = ["FILENAME", "load", "record_pass", "save"]

FILENAME = ".dt-learn.json"


def _path(folder: str) -> str:
    return os.path.join(folder, FILENAME)


def load(folder: str = ".") -> dict[str, Any]:
    try:
        with open(_path(folder), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    for key in ("passed", "hints", "gave_up"):
        data.setdefault(key, {})
    return data


def save(data: dict[str, Any], folder: str = ".") -> None:
    with open(_path(folder), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def record_pass(exercise: str, path: str, folder: str = ".") -> None:
    data = load(folder)
    data["passed"][exercise] = {"file": os.path.abspath(path),
                                "at": datetime.datetime.now().isoformat(timespec="seconds")}
    save(data, folder)
