"""A rank program for tests/test_launched_tools.py, run by torchrun: `launched_tools_script.py DIR`.

DIR/commands.json holds a list of `dt` command lines. Every rank runs each one in turn
through `dt`'s own entry point (`dt.tools.cli.main`), on the ranks torchrun launched,
as `python -m dt ...` would: one torchrun launch pays torch's import and the rendezvous
once for all of them, not once per command. Each command's stdout and stderr (file
descriptors 1 and 2, where `dt.launcher.rank_zero_output` points them) go to
DIR/<i>.<rank>.out / .err and its exit status to DIR/<i>.<rank>.rc.

The last command runs on the real stdout and stderr, and its status is the rank's: a
world conflict makes ranks other than 0 wait to be stopped (dt.launcher.command), so a
refusal can only come last, with torchrun ending the job as it would for `python -m dt`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from dt.tools.cli import main as dt_main


def _status(argv: list[str]) -> int:
    try:
        return dt_main(argv)
    except SystemExit as exc:  # argparse's exits, as `python -m dt` would end
        return exc.code if isinstance(exc.code, int) else 1
    except Exception:  # what `python -m dt` would die of: said, and the next command still runs
        traceback.print_exc()
        return 1


def _captured(argv: list[str], out: Path, err: Path) -> int:
    """Run one command with file descriptors 1 and 2 in files of its own; its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out, "w") as o, open(err, "w") as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        try:
            return _status(argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def main(directory: str) -> int:
    where = Path(directory)
    commands = json.loads((where / "commands.json").read_text())
    rank = os.environ["RANK"]
    for i, argv in enumerate(commands[:-1]):
        rc = _captured(argv, where / f"{i}.{rank}.out", where / f"{i}.{rank}.err")
        (where / f"{i}.{rank}.rc").write_text(f"{rc}\n")
    return _status(commands[-1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
