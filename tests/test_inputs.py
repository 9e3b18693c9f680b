"""What people type, checked at the door (issue 20): worlds, DT_* variables, `dt` itself, memory.

Every check here happens before any process starts, so every test is quick;
the bad command lines themselves are in tests/test_faults.py's list.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import re
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from dt import args
from dt.collectives import auto
from dt.collectives.registry import ALGORITHMS, forced_algorithms
from dt.launcher import WorkerPool
from dt.tools import cli
from dt.train import fits
from dt.train.cli import parse_args

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in [*args.ENVIRONMENT, *args.TORCHRUN_VARIABLES]:
        monkeypatch.delenv(name, raising=False)


# -- the local world bound ------------------------------------------------------


def test_the_bound_is_the_least_of_memory_cores_and_the_cap(monkeypatch):
    monkeypatch.setattr(args, "cores", lambda: 2)
    monkeypatch.setattr(args, "available_memory", lambda: 10 * args.RANK_FOOTPRINT + 5)
    assert args.max_local_world() == (10, f"{(10 * args.RANK_FOOTPRINT + 5) / 2**30:.1f} GiB available / "
                                          f"{args.RANK_FOOTPRINT >> 20} MiB per rank")
    monkeypatch.setattr(args, "available_memory", lambda: 1 << 50)
    per_core = args.RANKS_PER_CORE
    assert args.max_local_world() == (2 * per_core, f"2 cores x {per_core} ranks per core")
    monkeypatch.setattr(args, "cores", lambda: 1024)
    assert args.max_local_world()[0] == args.LOCAL_CAP
    monkeypatch.setattr(args, "available_memory", lambda: 0)  # nothing free: still one process
    assert args.max_local_world()[0] == 1
    monkeypatch.setattr(args, "available_memory", lambda: None)  # unknown: the other limits
    assert args.max_local_world()[0] == args.LOCAL_CAP


def test_beyond_the_bound_is_refused_in_one_line_with_the_way_out(monkeypatch):
    monkeypatch.setattr(args, "cores", lambda: 2)
    monkeypatch.setattr(args, "available_memory", lambda: 1 << 50)
    limit = 2 * args.RANKS_PER_CORE
    assert args.world(str(limit)) == limit
    with pytest.raises(args.InputError) as info:
        args.world(str(limit + 1))
    assert str(info.value) == (f"{limit + 1} processes on this host: at most {limit} here (2 cores x "
                               f"{args.RANKS_PER_CORE} ranks per core); set DT_MAX_WORLD to change the limit")
    monkeypatch.setenv("DT_MAX_WORLD", "3")
    assert args.world("3") == 3
    refused = r"^4 processes on this host: at most 3 here \(DT_MAX_WORLD=3\)$"  # no way out: it is set
    with pytest.raises(args.InputError, match=refused):
        args.world("4")
    monkeypatch.setenv("DT_MAX_WORLD", str(limit * 4))  # the override may go above the computed bound
    assert args.world(str(limit * 4)) == limit * 4
    monkeypatch.setenv("DT_MAX_WORLD", "0")
    with pytest.raises(args.InputError, match="^DT_MAX_WORLD must be a number of processes from 1 to 4096"):
        args.world("2")


def test_under_torchrun_a_world_is_the_whole_worlds(monkeypatch):
    monkeypatch.setenv("DT_MAX_WORLD", "2")
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert args.launched_by_torchrun()
    assert args.world("8") == 8  # torchrun started the ranks, across hosts: only the typo cap applies
    with pytest.raises(args.InputError, match="from 1 to 4096"):
        args.world("9999")


def test_the_pool_refuses_a_world_before_starting_a_process(monkeypatch):
    monkeypatch.setenv("DT_MAX_WORLD", "4")
    before = multiprocessing.active_children()
    with pytest.raises(args.InputError, match="^9999 processes on this host: at most 4 here"):
        WorkerPool(9999)
    assert multiprocessing.active_children() == before


def test_available_memory_is_what_the_kernel_says():
    free = args.available_memory()
    assert free is not None and 0 < free < 1 << 50  # Linux: MemAvailable, in bytes


# -- DT_* variables ---------------------------------------------------------------

GOOD = {
    "DT_TIMEOUT": [("5", 5.0), ("0.5", 0.5)],
    "DT_VALIDATE": [("0", False), ("yes", True)],
    "DT_TRANSPORT": [("SHM", "shm"), ("torch", "torch")],
    "DT_MAX_WORLD": [("1", 1), ("4096", 4096)],
    "DT_HOST": [("node-1", "node-1")],
    "DT_SHM_STAGE_BYTES": [("4096", 4096), ("64KiB", 65536)],
    "DT_SHM_CHANNEL_BYTES": [("1", 1), ("1MiB", 1 << 20)],
    "DT_SHM_SPIN_US": [("0", 0.0), ("200", 200.0)],
    "DT_NCCL_RULES": [("1", True), ("0", False)],
    "DT_ALGO": [("ring", ((None, "ring"),)), (" ring , ", ((None, "ring"),)), ("auto", ()),
                ("all_reduce=naive,broadcast=ring", (("all_reduce", "naive"), ("broadcast", "ring")))],
}
BAD = {
    "DT_TIMEOUT": [("0", "must be a positive, finite number of seconds")],
    "DT_VALIDATE": [("maybe", "must be 1 or 0")],
    "DT_TRANSPORT": [("bogus", "must be one of auto, shm, torch, gloo, nccl, got 'bogus'"),
                     ("shmm", "(did you mean shm?)")],
    "DT_MAX_WORLD": [("0", "from 1 to 4096"), ("lots", "must be a number of processes")],
    "DT_SHM_STAGE_BYTES": [("0", "at least 1 byte"), ("1XB", "unknown size unit 'XB'")],
    "DT_SHM_CHANNEL_BYTES": [("-1", "cannot read '-1'")],
    "DT_SHM_SPIN_US": [("-1", "must be a number >= 0"), ("nan", "must be a finite number")],
    "DT_NCCL_RULES": [("2", "must be 1 or 0")],
    "DT_ALGO": [("bogus", "names no algorithm 'bogus': one of auto, "),
                ("rign", "names no algorithm 'rign' (did you mean ring?): one of"),
                ("all_reduce=bogus", "names no all_reduce algorithm 'bogus': one of "),
                ("all_reduce=bruck", "names no all_reduce algorithm 'bruck'"),  # all_gather's, not its
                ("all_reduc=ring", "names no collective 'all_reduc' in 'all_reduc=ring' (did you mean "
                                   "all_reduce?)")],
}


def test_every_variable_read_in_dt_is_listed_checked_and_documented():
    read = set()
    for path in (ROOT / "dt").rglob("*.py"):
        read |= set(re.findall(r"[\"'](DT_[A-Z_]+)[\"']", path.read_text()))
    assert read == set(args.ENVIRONMENT) | set(args.INTERNAL)
    assert set(GOOD) == set(args.ENVIRONMENT) and set(BAD) | {"DT_HOST"} == set(args.ENVIRONMENT)
    readme, helped = (ROOT / "README.md").read_text(), cli.help_text()
    for name, var in args.ENVIRONMENT.items():
        assert f"| `{name}` | {var.meaning} |" in readme
        assert re.search(rf"^  {name} +{re.escape(var.meaning)}$", helped, re.M), name


@pytest.mark.parametrize("name, text, value", [(n, t, v) for n, cases in GOOD.items() for t, v in cases])
def test_good_values_read_as_the_library_reads_them(name, text, value, monkeypatch):
    monkeypatch.setenv(name, text)
    assert args.env_value(name) == value
    args.check_environment()


@pytest.mark.parametrize("name, text, words", [(n, t, w) for n, cases in BAD.items() for t, w in cases])
def test_bad_values_are_one_line_and_exit_2_before_anything_starts(name, text, words, monkeypatch, capsys,
                                                                 tmp_path):
    monkeypatch.setenv(name, text)
    with pytest.raises(args.InputError) as info:
        args.env_value(name)
    assert str(info.value).startswith(f"{name} ") and words in str(info.value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--steps", "1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines() == [f"dt train: error: {info.value} (see dt train --help)"]
    assert list(tmp_path.iterdir()) == []


def test_dt_algo_is_what_auto_obeys(monkeypatch):
    monkeypatch.setenv("DT_ALGO", "all_reduce=naive,broadcast=ring")
    assert auto.choose("all_reduce", "auto", 1 << 20, 4) == "naive"
    assert auto.choose("broadcast", "auto", 1 << 20, 4) == "ring"
    monkeypatch.setenv("DT_ALGO", "ring")  # wherever a collective has one
    assert auto.choose("all_gather", "auto", 1 << 20, 4) == "ring"
    assert auto.choose("barrier", "auto", 0, 4) != "ring"
    monkeypatch.setenv("DT_ALGO", "one_shot")  # load/store: only on a group with shared memory
    assert auto.choose("all_reduce", "auto", 1 << 20, 4) != "one_shot"
    monkeypatch.setenv("DT_ALGO", "rign")  # the library refuses it too, in the same words
    with pytest.raises(args.InputError, match=r"^DT_ALGO names no algorithm 'rign' \(did you mean ring\?\)"):
        auto.choose("all_reduce", "auto", 1 << 20, 4)


def test_dt_algo_lists_the_registrys_names():
    with pytest.raises(args.InputError) as info:
        forced_algorithms("all_reduce=x")
    assert str(info.value).endswith(", ".join(sorted(ALGORITHMS["all_reduce"]) + ["auto"]))


def _nothing() -> None:
    return None


@pytest.mark.parametrize("name, text", [("DT_TRANSPORT", "bogus"), ("DT_ALGO", "all_reduce=bogus")])
def test_a_script_outside_the_cli_gets_one_error_not_one_per_rank(name, text, pools, monkeypatch):
    pool = pools(2)
    monkeypatch.setenv(name, text)
    with pytest.raises(args.InputError, match=f"^{name} "):
        pool.run(_nothing)
    monkeypatch.delenv(name)
    assert pool.run(_nothing) == [None, None]  # nothing was sent: the pool is as it was


def test_a_bad_transport_stops_dt_demo_at_once(tmp_path, monkeypatch, capsys):
    # in this process: `python -m dt` itself ending in one line is test_faults.py's
    # test_a_bad_environment_is_one_line_and_exit_2
    monkeypatch.setenv("DT_TRANSPORT", "bogus")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "primitives"])
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    assert out.err.splitlines() == ["dt demo: error: DT_TRANSPORT must be one of auto, shm, torch, gloo, "
                                    "nccl, got 'bogus' (see dt demo --help)"]
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


# -- dt itself ----------------------------------------------------------------------


def test_dt_help_is_for_users(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name, (_, follows, what) in cli.COMMANDS.items():  # one line each: name, what follows, what it does
        assert any(line.startswith(f"  {name} {follows}".rstrip()) and line.endswith(what) for line in lines)
    assert "exercises ACTION [NAME]" in out and "show" in out and "dp x cp x ep x tp x pp" in out
    assert "`" not in out and "dt/tools" not in out  # no markdown, no internals
    assert "--version" in out and "README.md" in out


def test_dt_alone_is_argparses_convention(capsys):
    assert cli.main([]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.startswith("usage: dt COMMAND")


def test_dt_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == (f"dt {importlib.metadata.version(cli.DISTRIBUTION)}, "
                                       f"torch {torch.__version__}\n")


def test_dt_bench_help_lists_the_benches(capsys):
    assert cli.main(["bench", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: dt bench {collectives,ddp,scaling,idle}")


# -- dt train: what fits in memory --------------------------------------------------


def test_the_memory_bound_counts_attention_and_the_blocks():
    a = parse_args(["--steps", "1"])  # defaults: batch 16, 2 micro-batches, 4 heads, 4 layers of 64
    need = fits.memory_needed(Namespace(**{**vars(a), "block_size": 100_000}))
    assert need["scores"] == 8 * 4 * 100_000 ** 2 * 4  # the allocation the traceback names
    assert need["kept"] == 4 * need["scores"]
    assert need["state"] == 4 * 4 * 12 * 64 ** 2 * 4  # params, grads, Adam's two moments: 4 B each
    ring = Namespace(**{**vars(a), "cp": 4, "block_size": 1024})
    ulysses = Namespace(**{**vars(ring), "cp_attention": "ulysses"})
    assert fits.memory_needed(ulysses)["scores"] == 4 * fits.memory_needed(ring)["scores"]


def test_what_fits_is_not_refused():
    a = parse_args(["--long-context", "--cp", "4"])
    assert fits.why_it_cannot_fit(a, 4, on_gpu=False) is None
    big = Namespace(**{**vars(a), "block_size": 100_000})
    line = fits.why_it_cannot_fit(big, 4, on_gpu=False)
    assert line is not None and "\n" not in line and "4 ranks on this machine" in line


def main(argv: list[str]) -> int:
    """A command whose library refuses its world (as `dt model --measured` would): for the router."""
    WorkerPool(int(argv[0]))
    return 0


def test_a_world_the_library_refuses_ends_a_command_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "pooled", (__name__, "", "a test's command"))
    monkeypatch.setenv("DT_MAX_WORLD", "2")
    assert cli.main(["pooled", "3"]) == 2
    err = capsys.readouterr().err
    assert err == "dt pooled: error: 3 processes on this host: at most 2 here (DT_MAX_WORLD=2)\n"
