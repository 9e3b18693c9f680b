"""One judged case, as each rank runs it inside the judge's worker processes.

Every rank, in order:

1. installs the instrumentation (once) and imports the learner's file by path (once);
2. builds the case's arguments and runs torch's own collective on a copy of
   them: the reference, computed in this process on the same inputs;
3. calls the learner's function inside a `CallWatch` (counted, bounded waits,
   collectives forbidden), with its stdout and stderr going to a file the
   judge reads, and with a watchdog armed to write the stack and end the
   process should it run past `hang_after` (a loop that never ends cannot
   outlive the judge): a thread that takes the running frame under the GIL
   (a consistent stack), then faulthandler as the backstop for code that
   never lets the GIL go;
4. gives sends the learner never waited on a moment to complete, and
   compares its result with the reference.

It returns a plain dict: status, exception, traffic, first difference. The
judge (verdict.py) combines every rank's dict with every rank's log.
"""

from __future__ import annotations

import contextlib
import copy
import faulthandler
import importlib.util
import inspect
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from dt import transport
from dt.learn.judge import instrument
from dt.learn.judge.cases import JudgeCase, members
from dt.learn.judge.compare import first_difference
from dt.learn.judge.specs import SPECS, GroupView

__all__ = ["CASE_COPIES", "Job", "judge_case", "load", "log_paths"]

CASE_COPIES = 4  # a case's tensors as a rank holds them in _judge: its own, torch's copy, the
# expected result and the outputs as they started (each at least the case's n elements)
SETTLE_S = 2.0  # how long a send nobody waited on gets to complete after the learner returned


@dataclass(frozen=True)
class Job:
    spec: str
    path: str  # absolute path of the learner's file
    function: str
    case: JudgeCase
    timeout: float  # longest wait on one message
    hang_after: float  # a rank still running after this dumps its stack and exits
    logdir: str
    allow_dt: bool = False  # may call dt's own collectives (Spec.allow_dt)


def log_paths(logdir: str, world: int, rank: int) -> tuple[str, str]:
    """(events, output) files of one rank of one world."""
    base = os.path.join(logdir, f"world{world}-rank{rank}")
    return base + ".events", base + ".out"


# ---------------------------------------------------------------------------
# The learner's file, imported once per process.
# ---------------------------------------------------------------------------

_loaded: dict[tuple[str, float], Any] = {}


def load(path: str, function: str) -> tuple[Callable[..., Any] | None, str | None]:
    """(the learner's function, None) or (None, why not)."""
    key = (path, os.path.getmtime(path))
    if key not in _loaded:
        instrument.install()
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # the learner's own helpers, next to the file
        spec = importlib.util.spec_from_file_location(f"_dt_learner_{len(_loaded)}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - any failure is the learner's to read
            return None, f"importing {os.path.basename(path)} raised {_located(exc, path)}"
        _loaded[key] = module
    fn = getattr(_loaded[key], function, None)
    if not callable(fn):
        return None, f"{os.path.basename(path)} defines no function {function}()"
    return fn, None


def _located(exc: BaseException, path: str) -> str:
    """'IndexError: list index out of range at ring.py:17 (chunks[r + 1])'."""
    head = f"{type(exc).__name__}: {exc}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{head.splitlines()[0]}"
    if not frames:
        return head
    f = frames[-1]
    return f"{head} at {os.path.basename(path)}:{f.lineno}" + (f" ({f.line})" if f.line else "")


# ---------------------------------------------------------------------------
# Output capture and the hang guard.
# ---------------------------------------------------------------------------

_fds: dict[str, int] = {}


def _open(path: str) -> int:
    if path not in _fds:
        _fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.ftruncate(_fds[path], 0)
    return _fds[path]


BACKSTOP_S = 2.0  # faulthandler's dump this long after the watchdog's, for a thread holding the GIL


def _watchdog(out_fd: int, hang_after: float, stop: threading.Event) -> threading.Thread:
    """A thread that, unless `stop` is set within `hang_after` seconds, writes the calling thread's
    stack to `out_fd` in faulthandler's format (the judge reads a "Timeout (" header and the
    learner's `File "...", line N in name`) and ends the process. The frames are taken under the GIL,
    so the stack is whole; faulthandler's own dump reads them from another thread without it and
    can catch a frame half made."""
    target = threading.get_ident()

    def watch() -> None:
        if stop.wait(hang_after):
            return
        frame = sys._current_frames().get(target)
        seconds = int(hang_after)
        lines = [f"Timeout ({seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d})!",
                 "Thread (most recent call first):"]
        lines += [f'  File "{f.f_code.co_filename}", line {lineno} in {f.f_code.co_name}'
                  for f, lineno in traceback.walk_stack(frame)]
        os.write(out_fd, ("\n".join(lines) + "\n").encode())
        os._exit(1)

    thread = threading.Thread(target=watch, name="dt-judge-watchdog", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _captured(out_fd: int, hang_after: float) -> Iterator[None]:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    was_enabled = faulthandler.is_enabled()
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    faulthandler.enable(file=out_fd, all_threads=True)  # a crash leaves its stack in the file
    stop = threading.Event()
    watchdog = _watchdog(out_fd, hang_after, stop)
    faulthandler.dump_traceback_later(hang_after + BACKSTOP_S, exit=True, file=out_fd)
    try:
        yield
    finally:
        stop.set()
        watchdog.join()
        faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        if was_enabled:
            faulthandler.enable(file=sys.stderr, all_threads=True)
        else:
            faulthandler.disable()


# ---------------------------------------------------------------------------


def _group(case: JudgeCase, world: int) -> tuple[Any, tuple[int, ...]]:
    ranks = tuple(members(case, world))
    if len(ranks) == world:
        return None, ranks
    return transport.shared_group(ranks), ranks  # every rank of the world asks for it, in the same order


def call_learner(fn: Callable[..., Any], args: list[Any], op: Any, group: Any) -> Any:
    """fn(*args, op=op, group=group), passing op and group only where fn takes them."""
    params = inspect.signature(fn).parameters
    anything = any(p.kind == p.VAR_KEYWORD for p in params.values())
    kwargs = {}
    if op is not None and ("op" in params or anything):
        kwargs["op"] = op
    if group is not None and ("group" in params or anything):
        kwargs["group"] = group
    return fn(*args, **kwargs)


def judge_case(job: Job) -> dict[str, Any]:
    world, rank = dist.get_world_size(), dist.get_rank()
    events_path, out_path = log_paths(job.logdir, world, rank)
    events, out = _open(events_path), _open(out_path)
    transport.set_validation(False)  # dt's own messages only, where an exercise allows dt's collectives
    # every message through torch's point-to-point, to be counted (instrument.install says so
    # once per process; dt's worker resets the wire to auto before each run)
    transport.set_transport("torch")
    with _captured(out, job.hang_after):
        return _judge(job, world, rank, events)


def _judge(job: Job, world: int, rank: int, events: int) -> dict[str, Any]:
    fn, problem = load(job.path, job.function)
    if fn is None:
        return {"status": "import", "error": problem}
    pg, ranks = _group(job.case, world)
    if rank not in ranks:
        return {"status": "idle"}
    spec = SPECS[job.spec]
    g = GroupView(pg, ranks, ranks.index(rank))
    args, op = spec.make(job.case, g)
    reference = _copy(args)
    spec.torch_call(reference, op, g)
    expected = [t.clone() for _, t in spec.outputs(reference)]
    started = [t.clone() for _, t in spec.outputs(args)]
    if job.allow_dt:
        # dt connects a group at its first collective (finds which ranks share a host):
        # setup, like gloo's rendezvous, not the learner's traffic, so it happens here,
        # before the messages are counted.
        transport.connect(transport.resolve_group(pg))
    error = None
    with instrument.watching(learner_file=job.path, what=job.function, timeout=job.timeout,
                             log_fd=events, allow_dt=job.allow_dt) as w:
        try:
            call_learner(fn, args, op, pg)
            w.log(e="return")
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the learner's exception is the verdict
            error = _located(exc, job.path)
            w.log(e="raise", error=error)
    result: dict[str, Any] = {"status": "ok", "traffic": w.counts(), "group_rank": g.rank,
                              "open": len(w.open)}
    if w.forbidden:
        result.update(status="forbidden", error=w.forbidden)
    elif w.stuck:
        result.update(status="deadlock", error=error, stuck=w.stuck)
    elif w.lost:
        result.update(status="lost", error=error)
    elif error:
        result.update(status="raised", error=error)
    else:
        unfinished = w.settle(min(SETTLE_S, job.timeout))
        if unfinished:
            result.update(status="unfinished", unfinished=unfinished)
        result["difference"] = first_difference(spec.outputs(args), expected, started=started,
                                                 op=job.case.op if spec.takes_op else None,
                                                 group_size=g.size)
    return result


def _copy(args: list[Any]) -> list[Any]:
    return copy.deepcopy(args)
