"""Rank 0's progress through the steps, on stderr: stdout carries only the report.

On a terminal it is a tqdm bar redrawn in place. Anywhere else (stderr piped
or sent to a file) a redrawn bar would leave a carriage-return frame per step
in the log, so it is a plain line about every tenth of the run instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["LINES", "Progress"]

LINES = 10  # plain lines per run when there is no terminal (plus the last step's)


class Progress:
    """update(loss, extra) once per step; close() at the end. `stream` defaults to sys.stderr.

    `extra` is shown after the loss, in order (validation loss, lr, tokens/s, MFU ...).
    """

    def __init__(self, total: int, initial: int, desc: str, stream: TextIO | None = None):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.done, self.first, self.desc = total, initial, initial, desc
        self.every = max(1, (total - initial) // LINES)
        self.t0 = time.monotonic()
        self.bar: Any = None
        if _is_terminal(self.stream):
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", file=self.stream)

    def update(self, loss: float, extra: dict[str, str] | None = None) -> None:
        self.done += 1
        extra = extra or {}
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix({"loss": f"{loss:.4f}", **extra})
        elif (self.done - self.first) % self.every == 0 or self.done == self.total:
            more = "".join(f", {k} {v}" for k, v in extra.items())
            print(f"dt train: {self.desc}: step {self.done}/{self.total}, loss {loss:.4f}{more}, "
                  f"{time.monotonic() - self.t0:.1f} s", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal
        return False
