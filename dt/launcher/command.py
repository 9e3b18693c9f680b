"""How a `dt` command ends when its run fails or is stopped: a report and an exit status.

    sys.exit(run_command("dt train", main, argv))

- a worker raised or died (WorkerError): the launcher's report (which rank,
  how, what every rank said, the first failing rank's traceback), exit 1;
- Ctrl-C: one line, exit 130; SIGTERM or SIGHUP: one line, exit 128 + signal.
Either way every worker has been stopped before the line is printed.
- the world asked for is not the one torchrun launched (WorldConflict): one line, exit 2
  (rank 0 says it; the others wait to be stopped, so rank 0 is never killed before it speaks).

Under torchrun every rank runs the command and holds the same gathered
results and errors: rank 0 alone prints them (dt.launcher.world), or, when
rank 0 is the rank stuck, the lowest rank that is not.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable

from dt.launcher.pool import Terminated, WorkerError
from dt.launcher.world import WorldConflict, launched_rank, rank_zero_output

__all__ = ["run_command"]


def _reports(exc: WorkerError) -> bool:
    """Whether this rank prints the report: every launched rank gathered the same one, and the
    lowest rank that is not stuck prints it (rank 0, unless rank 0 is the one stuck)."""
    stuck = {r for r, e in exc.errors.items() if e.kind == "stopped"}
    return launched_rank() == next(r for r in itertools.count() if r not in stuck)


# torchrun stops every rank as soon as one exits non-zero: a rank other than 0 that exited first
# could have rank 0 killed before it printed the line. So they wait (bounded) to be stopped.
_SPEAKER_GRACE_S = 30.0


def _let_rank_zero_speak() -> None:
    """Wait for torchrun to stop this rank once rank 0 has said the error and exited."""
    time.sleep(_SPEAKER_GRACE_S)


def run_command(prog: str, main: Callable[[list[str]], int | None], argv: list[str]) -> int:
    try:
        with rank_zero_output():
            return int(main(argv) or 0)
    except WorldConflict as exc:
        if launched_rank() == 0:
            print(f"{prog}: error: {exc}", file=sys.stderr)
        else:
            _let_rank_zero_speak()
        return 2
    except WorkerError as exc:
        if _reports(exc):
            print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except Terminated as exc:
        print(f"{prog}: stopped by {exc.signal}; every worker was stopped", file=sys.stderr)
        return int(exc.code or 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; every worker was stopped", file=sys.stderr)
        return 130
