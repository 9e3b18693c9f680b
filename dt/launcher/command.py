"""How a `dt` command ends when its run fails or is stopped: a report and an exit status.

    sys.exit(run_command("dt train", main, argv))

- a worker raised or died (WorkerError): the launcher's report (which rank,
  how, what every rank said, the first failing rank's traceback), exit 1;
- Ctrl-C: one line, exit 130; SIGTERM or SIGHUP: one line, exit 128 + signal.
Either way every worker has been stopped before the line is printed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dt.launcher.pool import Terminated, WorkerError

__all__ = ["run_command"]


def run_command(prog: str, main: Callable[[list[str]], int | None], argv: list[str]) -> int:
    try:
        return int(main(argv) or 0)
    except WorkerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except Terminated as exc:
        print(f"{prog}: stopped by {exc.signal}; every worker was stopped", file=sys.stderr)
        return int(exc.code or 1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; every worker was stopped", file=sys.stderr)
        return 130
