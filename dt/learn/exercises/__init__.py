"""The exercises: one folder each, with a statement, hints, a skeleton and a reference solution.

    dt exercises list                      what there is
    dt exercises start ring_all_reduce     ring_all_reduce.py here: statement, cost to reach, skeleton
    dt judge ring_all_reduce.py            the judge knows the exercise from the file's first line
                                           (or, without it, from the file's name)
    dt exercises hint ring_all_reduce      one hint more each time
    dt exercises solution ring_all_reduce  after a judged pass (or --give-up)

A folder holds `__init__.py` (EXERCISE: the statement, hints and what the
judge checks), `skeleton.py` (what the learner starts from; its first line,
`# dt exercise: NAME`, tells the judge which exercise it is; a file without
it named NAME.py is NAME too) and
`solution.py` (the reference, kept out of the skeleton; the tests judge it).
The cost to reach is never written down here: it is computed from dt.cost
for the exercise's target algorithm, the same figure the judge holds the
learner's bytes to.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dt.learn.judge.cases import JudgeCase
from dt.learn.judge.specs import SPECS
from dt.units import plural

__all__ = ["EXERCISES", "Exercise", "all_exercises", "cost_lines", "find", "marker", "starter",
           "unlock_rule"]

HERE = Path(__file__).resolve().parent
EXERCISES = ("ring_all_reduce", "cost_estimate", "ring_reduce_scatter", "ring_all_gather",
             "chain_broadcast", "tree_broadcast", "all_to_all_transpose",
             "recursive_doubling_all_reduce", "bucketed_gradient_sync")
MARKER = re.compile(r"#\s*dt exercise:\s*(\w+)")


@dataclass(frozen=True)
class Exercise:
    name: str
    title: str
    statement: str
    hints: tuple[str, ...]
    function: str  # what the learner writes
    collective: str | None = None  # the judge's spec (None: a numeric exercise, judged by `check`)
    target: str | None = None  # the dt.cost algorithm whose traffic is the cost to reach
    see: str = ""  # the dt command that shows the idea
    check: Callable[[dict[str, Any]], list[tuple[str, bool, str]]] | None = None

    @property
    def folder(self) -> Path:
        return HERE / self.name

    @property
    def solution(self) -> str:
        return (self.folder / "solution.py").read_text()


def find(name: str) -> Exercise:
    if name not in EXERCISES:
        raise KeyError(f"no exercise {name!r}; there are: {', '.join(EXERCISES)}")
    return importlib.import_module(f"dt.learn.exercises.{name}").EXERCISE


def all_exercises() -> list[Exercise]:
    return [find(n) for n in EXERCISES]


def marker(path: str) -> str | None:
    """The exercise a learner's file is: its `# dt exercise: NAME` line, else its name (NAME.py).

    The header comes first (a file may be named anything); a file that lost it,
    rewritten from scratch, is still the exercise `dt exercises start` named it
    after. `unlock_rule` says the same to the learner.
    """
    try:
        with open(path, encoding="utf-8") as f:
            head = [f.readline() for _ in range(5)]
    except OSError:
        return None
    for line in head:
        m = MARKER.match(line.strip())
        if m and m.group(1) in EXERCISES:
            return m.group(1)
    stem = Path(path).stem
    return stem if Path(path).suffix == ".py" and stem in EXERCISES else None


def unlock_rule(name: str) -> str:
    """What opens the reference for `name`, as `marker` and `dt judge` apply it."""
    return (f"a full `dt judge FILE` (default worlds, sizes and cases) passes, run in this folder, on a "
            f"FILE that is {name}.py or starts with the line `# dt exercise: {name}`")


def cost_lines(ex: Exercise, nbytes: int = 1 << 20, worlds: tuple[int, ...] = (2, 3, 5, 8)) -> list[str]:
    """The cost to reach, per world size, from dt.cost (what the judge checks)."""
    if ex.collective is None or ex.target is None:
        return []
    spec = SPECS[ex.collective]
    if ex.collective == "sync_gradients":
        case = JudgeCase("cost", params=((1 << 16,),) * 16, bucket_bytes=1 << 20)
        what = "16 gradients of 256 KiB, buckets of 1 MiB"
    else:
        case = JudgeCase("cost", nbytes // 4)
        what = f"{nbytes:,} bytes of float32"
    out = [f"for {what}, the busiest rank sends (dt.cost, {ex.target}):"]
    for p in worlds:
        ts = [spec.target(case, p, r, ex.target) for r in range(p)]
        out.append(f"  p={p}: {max(t.bytes_sent for t in ts):>12,} bytes in "
                   f"{plural(max(t.messages_sent for t in ts), 'message')}, "
                   f"{plural(max(t.steps for t in ts), 'step')}")
    return out


def starter(ex: Exercise) -> str:
    """The file `dt exercises start` writes: the skeleton with the statement and the cost on top."""
    skeleton = (ex.folder / "skeleton.py").read_text().splitlines(keepends=True)
    cost = cost_lines(ex)
    doc = [f'"""{ex.title}\n', "\n", ex.statement.strip() + "\n"]
    if cost:
        doc += ["\nCost to reach (the judge checks every rank's bytes against it):\n"]
        doc += [line + "\n" for line in cost]
    doc += [f"\nJudge it:      dt judge {ex.name}.py\n",
            f"A hint:        dt exercises hint {ex.name}   (one more each time)\n"]
    if ex.see:
        doc.append(f"See the idea:  {ex.see}\n")
    doc.append('"""\n')
    return skeleton[0] + "".join(doc) + "".join(skeleton[1:])
