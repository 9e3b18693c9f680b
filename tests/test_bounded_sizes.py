"""Every size and count a command takes is held to what the machine holds, before any process starts.

A typed size (`dt bench collectives -e 64G`, `dt judge --sizes 1000000000`) or count (`-n
1000000000`) that the ranks' memory cannot hold is refused in one line, exit status 2,
naming the option, the bytes it needs and what the machine has (dt.args.memory_refusal).
The machine is made to hold 16 GiB here (available_memory patched), so the bounds are the
same on any machine, and no worker may start (WorkerPool._start raises).
"""

from __future__ import annotations

import re

import pytest

from dt import args
from dt.bench import collectives, collectives_percall
from dt.launcher import WorkerPool
from dt.tools import cli

GIB = 1 << 30


@pytest.fixture(autouse=True)
def sixteen_gib_and_no_workers(monkeypatch):
    monkeypatch.setattr(args, "available_memory", lambda: 16 * GIB)
    monkeypatch.delenv("DT_MAX_WORLD", raising=False)

    def start(self: WorkerPool) -> None:
        raise AssertionError("a worker started: the command was not refused up front")

    monkeypatch.setattr(WorkerPool, "_start", start)


def _refused(capsys, main, argv: list[str]) -> str:
    """The one line `main(argv)` is refused with (exit status 2)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _names_the_bytes_and_the_limit(line: str) -> None:
    assert re.search(r" needs \d[\d.]* [KMG]?B.*; this machine has 17\.2 GB available", line), line


@pytest.mark.parametrize("argv, option", [
    (["bench", "collectives", "-e", "64G"], "-e 68,719,476,736 B"),
    (["bench", "collectives", "-b", "8G", "-e", "8G"], "-e 8,589,934,592 B"),
    (["bench", "collectives", "-n", "1000000000"], "-n 1,000,000,000"),
    (["demo", "primitives", "--bytes", "8G"], "--bytes 8,589,934,592"),
    (["judge", "ring.py", "--collective", "all_reduce", "--sizes", "1000000000"], "--sizes 1,000,000,000"),
    (["judge", "ring.py", "--bench", "--bench-sizes", "8G"], "--bench-sizes 8,589,934,592 B"),
    (["judge", "ring.py", "--bench", "--reps", "10000000000"], "--reps 10,000,000,000"),
    (["model", "all_reduce", "--measured", "--size", "8G"], "--size 8,589,934,592 B"),
    (["model", "all_reduce", "--measured", "--reps", "1000000000"], "--reps 1,000,000,000"),
    (["bench", "ddp", "--hidden", "100000"], "--hidden 100,000 --layers 6 --batch 1,024"),
    (["bench", "ddp", "--steps", "1000000000"], "--steps 1,000,000,000"),
    (["bench", "scaling", "--big", "64G"], "an all-reduce of 68,719,476,736 B (--big, --small)"),
    (["bench", "scaling", "--tables", "3", "--hidden", "100000"],
     "--hidden 100,000 --layers 6 at world 1, batch 16,384"),
    (["bench", "scaling", "--reps", "10000000000"], "--reps 10,000,000,000"),
    (["tune", "--reps", "10000000000"], "--reps 10,000,000,000"),
    (["tune", "--sweep-reps", "10000000000"], "--sweep-reps 10,000,000,000"),
    (["train", "--steps", "1000000000000"], "--steps 1,000,000,000,000"),
])
def test_a_size_or_count_beyond_the_machine_is_refused_in_one_line(capsys, argv, option):
    line = _refused(capsys, cli.main, argv)
    prog = "dt " + " ".join(argv[:2] if argv[0] == "bench" else argv[:1])
    assert line.startswith(f"{prog}: error: {option} needs "), line
    _names_the_bytes_and_the_limit(line)


def test_the_standalone_per_call_bench_is_bounded_too(capsys):
    line = _refused(capsys, collectives_percall.main, ["--sizes", "4KiB,64G"])
    assert "--sizes 68,719,476,736 B needs " in line
    _names_the_bytes_and_the_limit(line)
    line = _refused(capsys, collectives_percall.main, ["--calls", "10000000000"])
    assert "--calls 10,000,000,000 needs " in line


def test_dt_train_counts_the_experts_weights(capsys):
    line = _refused(capsys, cli.main, ["train", "--experts", "100000", "--n-embd", "128"])
    assert "the weights, gradients and Adam's moments of its blocks" in line
    assert re.search(r"are \d[\d.]* GB per rank.*; 1 rank on this machine, 17\.2 GB available", line), line
    assert "--experts" in line and "raise --tp, --pp, --ep or --zero" in line


def test_the_bound_is_the_sum_of_the_ranks_buffers_not_a_cap():
    """-e of a float32 all-reduce at world 2, checked: a rank holds its case's 2 buffers and
    the check's exact float64 result (3 buffers of 8-byte elements, a pattern and a byte mask:
    7.25 buffers of the size), and its own 256 MiB. 0.8 GiB fits in 16 GiB (15.3 GiB), 0.9 GiB
    does not (17.2 GiB); unchecked (-c 0) a rank holds 4 buffers (7.7 GiB)."""
    assert collectives.parse_args(["-e", "0.8GiB"]).e == int(0.8 * GIB)
    with pytest.raises(SystemExit):
        collectives.parse_args(["-e", "0.9GiB"])
    assert collectives.parse_args(["-e", "0.9GiB", "-c", "0"]).e > int(0.8 * GIB)


def test_the_defaults_fit_a_small_machine():
    """What the commands run by default stays within 16 GiB: the bounds refuse typos, not runs."""
    from dt.bench.scaling.cli import parse_args as scaling_args
    from dt.train.cli import parse_args as train_args

    assert collectives.parse_args([]).e == 16 << 20
    scaling_args([])  # the full study's sizes
    train_args([])
