"""What the launcher checks in its own process before any worker starts.

A worker that dies before it runs the function (its environment is bad, its
script re-runs itself, the function cannot travel) would otherwise only say
"rank 0 exited with code 1 during start-up", with the cause buried in every
worker's raw traceback. Each of those causes can be seen from the parent,
before a process is spawned, and said in one line (a ValueError):

- DT_TIMEOUT / DT_VALIDATE that are not valid (dt.args' rule, its words);
- a script whose module-level code starts the workers outside an
  `if __name__ == "__main__":` block: workers start by re-importing the main
  script (forkserver and spawn), so each would start workers of its own;
- a function or argument that pickle cannot send: a nested function or a
  lambda (workers find functions by module and name), or anything else.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import pickle
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from dt.transport import settings

__all__ = ["check_before_start", "check_main_guard", "job_payload"]


def check_before_start() -> None:
    """Everything that must hold before the first worker is spawned (ValueError otherwise)."""
    settings.check_environment()
    check_main_guard()


def _main_frame() -> FrameType | None:
    """The frame of the main script's module-level code, if it is on the stack."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or spec is not None and spec.name.rpartition(".")[2] == "__main__":
        return None  # a package's __main__ (python -m dt): multiprocessing never re-runs it
    frame: FrameType | None = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame
        frame = frame.f_back
    return None


@functools.lru_cache(maxsize=8)
def _guarded_lines(path: str, mtime: float) -> tuple[tuple[int, int], ...]:
    """Line spans of `if __name__ == "__main__":` blocks in the script at `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return ()
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) \
                and "__main__" in ast.unparse(node.test):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return tuple(spans)


def check_main_guard() -> None:
    """ValueError if the main script starts workers from unguarded module-level code."""
    frame = _main_frame()
    if frame is None:  # started from a function called elsewhere (pytest, an import): fine
        return
    path = frame.f_code.co_filename
    if not os.path.isfile(path):  # python -c, stdin, a notebook: workers do not re-run it
        return
    line = frame.f_lineno
    if any(first <= line <= last for first, last in _guarded_lines(path, os.path.getmtime(path))):
        return
    raise ValueError(f"{os.path.basename(path)}, line {line}: the script has no "
                     "`if __name__ == '__main__':` guard, so spawned workers re-run it; put the code "
                     "that starts the workers under that guard")


def job_payload(fn: Callable[..., Any], args: tuple, kwargs: dict, *rest: Any) -> bytes:
    """The pickled job a worker runs, or ValueError saying in one line why it cannot travel."""
    qualname = getattr(fn, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname:
        what = "a lambda" if "<lambda>" in qualname else "a nested function"
        raise ValueError(f"cannot pickle {qualname}, {what}: workers find a function by its module "
                         "and name, so define it at module level")
    try:
        return pickle.dumps((fn, args, kwargs, *rest))
    except Exception as exc:  # noqa: BLE001 - whatever pickle refuses, said in one line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot pickle the job for the workers ({getattr(fn, '__name__', fn)!r} "
                         f"and its arguments): {first}") from None
