"""`dt train`'s output: the report on stdout, progress on stderr, a redrawn bar only on a terminal.

`dt train > log` must not fill the log with carriage-return frames, and the
report names a pipeline schedule only when there is a pipeline (pp > 1).
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from dt.train.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--steps", "3", "--batch-size", "4", "--block-size", "8", "--n-layer", "2", "--n-embd", "16",
         "--threads", "1"]


def _train(options: list[str], tmp_path: Path, stderr: int = subprocess.PIPE) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dt", "train", *options, *SMALL], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=250)


@pytest.mark.timeout(300)
def test_piped_train_draws_no_bar_and_names_no_schedule_without_a_pipeline(tmp_path):
    out = _train(["--tp", "2"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\r" not in out.stdout and "\r" not in out.stderr
    assert out.stdout.startswith("mesh dp=1 tp=2 pp=1 (2 processes), global batch 4 x 8 tokens\n"), out.stdout
    assert "1f1b" not in out.stdout and "micro-batch" not in out.stdout
    prefix = "dt train: dp1 cp1 ep1 tp2 pp1: step"
    steps = [line for line in out.stderr.splitlines() if line.startswith(prefix)]
    assert [line.split(",")[0].rsplit(" ", 1)[1] for line in steps] == ["1/3", "2/3", "3/3"], out.stderr


@pytest.mark.timeout(300)
def test_the_bar_is_drawn_on_a_terminal_stderr_and_never_on_stdout(tmp_path):
    master, slave = pty.openpty()
    # A terminal of 24 x 100 (a new pty has 0 columns, and tqdm draws nothing in 0 columns).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    drawn = bytearray()

    def read() -> None:  # drain the terminal as it is written, so a full pty never blocks the run
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the slave side closed: the run is over
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        out = _train(["--pp", "2"], tmp_path, stderr=slave)
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    assert out.returncode == 0, drawn.decode(errors="replace")[-2000:]
    assert "\r" not in out.stdout
    assert b"\r" in drawn and b"3/3" in drawn  # tqdm's frames, on the terminal
    assert "pp=2 (2 processes), 1f1b, 4 micro-batches, global batch" in out.stdout.splitlines()[0]


def test_plain_lines_about_every_tenth_of_the_run():
    stream = io.StringIO()
    progress = Progress(100, 40, "dp1", stream=stream)
    for step in range(60):
        progress.update(1.0 + step)
    progress.close()
    lines = stream.getvalue().splitlines()
    want = [f"dt train: dp1: step {s}/100" for s in range(46, 101, 6)]  # every 6th of 60 steps
    assert [line.split(",")[0] for line in lines] == want
