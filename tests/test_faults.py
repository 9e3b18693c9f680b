"""The fault matrix: what goes wrong in a distributed run, and what dt does about it.

Each case makes one thing go wrong, as users and schedulers do, and checks
three things: the error text (who, how, where), the time to that error (well
before the timeout: the machine is loaded, so the bounds are generous and
always set against the timeout that would otherwise fire), and that nothing
is left behind (no process, no file).

Sections, one per kind of fault (checkpoint faults join as a section of their own):

1. the launcher dies (SIGKILL, SIGTERM, Ctrl-C): every worker goes with it
2. a rank dies mid-collective (each rank in turn, worlds 2 to 4; and in `dt train`)
3. the ranks disagree (validation): the same clear text on every rank
4. late and absent ranks, and the one timeout rule
5. tensors: requires grad, meta
6. bad command lines: one line, exit 2
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dt
from dt import transport
from dt.collectives import auto
from dt.launcher import WorkerError
from dt.transport import settings

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT = 60.0  # the run's timeout in these cases; dt's own wait is 0.8 of it (48 s)
FAST = 20.0  # "well before the timeout": a failure must be reported within this


# -- helpers -----------------------------------------------------------------


def _state(pid: int) -> str | None:
    """The process's state letter, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")  # a zombie has exited: only its entry is left


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except OSError:
                pass
    return out


def _wait_gone(pids: list[int], within: float) -> float:
    """Seconds until every pid has exited; fails naming the survivors after `within`."""
    start = time.monotonic()
    while any(_alive(p) for p in pids):
        assert time.monotonic() - start < within, \
            f"still running {within:g}s later: {[p for p in pids if _alive(p)]}"
        time.sleep(0.05)
    return time.monotonic() - start


def _fails(run, world, fn, *args, timeout=RUN_TIMEOUT):
    """Run fn expecting a WorkerError; returns (error, seconds to it)."""
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        run(world, fn, *args, timeout=timeout)
    return info.value, time.monotonic() - start


def _timed(fn, *args):
    """Run fn on this rank; a CollectiveError says how long into fn it came."""
    start = time.monotonic()
    try:
        return fn(*args)
    except dt.CollectiveError as exc:
        raise type(exc)(f"{exc} [after {time.monotonic() - start:.2f}s]") from None


def _after(message: str) -> float:
    return float(message.rsplit("[after ", 1)[1].split("s]")[0])


# -- 1. the launcher dies ----------------------------------------------------


def _park(directory: str) -> None:
    Path(directory, f"{dist.get_rank()}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def _start_launcher(directory: Path, world: int, **extra: str) -> subprocess.Popen:
    """A launcher process (its own process group, as a shell job is) running run_workers(_park)."""
    directory.mkdir()
    code = ("import sys; from dt.launcher import run_workers; from tests.test_faults import _park; "
            "run_workers(_park, int(sys.argv[1]), sys.argv[2], timeout=300)")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return subprocess.Popen([sys.executable, "-c", code, str(world), str(directory)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=default_sigint)


def default_sigint() -> None:
    """Ctrl-C as a terminal delivers it: a test run started in the background (`cmd &`, nohup)
    inherits SIGINT ignored, and an ignored signal stays ignored across exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(240)
def test_workers_die_with_their_launcher(tmp_path):
    """SIGKILL (nothing runs in the launcher), SIGTERM (a scheduler), Ctrl-C (the terminal
    signals the whole process group): within seconds no worker, fork server or helper is left.

    The pool's rendezvous is a file: a launcher killed outright cannot remove it, its workers
    do as they die with it. The SIGKILLed launcher's temporary directory is its own, to see
    that; a short one: the fork server's socket lives in TMPDIR, and a socket path is at most
    107 bytes (pytest's tmp_path under the suite's TMPDIR is longer)."""
    world, signals = 2, ("SIGKILL", "SIGTERM", "SIGINT")
    own_tmp = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    launchers: dict[str, subprocess.Popen] = {}
    try:
        launchers = {how: _start_launcher(tmp_path / how, world, **({"TMPDIR": str(own_tmp)}
                                                                     if how == "SIGKILL" else {}))
                     for how in signals}  # start together
        deadline = time.monotonic() + 180
        for how, launcher in launchers.items():
            while len(list((tmp_path / how).glob("*.pid"))) < world:
                assert launcher.poll() is None and time.monotonic() < deadline, f"{how}: no start"
                time.sleep(0.1)
        assert len(list(own_tmp.glob("dt-pool-*"))) == 1  # the store's directory, while it runs
        for how, launcher in launchers.items():
            _stop_launcher(how, launcher, tmp_path / how, world)
        assert list(own_tmp.glob("dt-pool-*")) == []  # removed by the SIGKILLed launcher's workers
    finally:
        for launcher in launchers.values():  # only if the test failed
            if launcher.poll() is None:
                launcher.kill()
        shutil.rmtree(own_tmp, ignore_errors=True)


def _stop_launcher(how: str, launcher: subprocess.Popen, directory: Path, world: int) -> None:
    workers = [int(p.read_text()) for p in directory.glob("*.pid")]
    helpers = _children(launcher.pid)  # the fork server and the resource tracker
    if how == "SIGINT":
        os.killpg(launcher.pid, signal.SIGINT)
    else:
        os.kill(launcher.pid, getattr(signal, how))
    code = launcher.wait(30)
    assert _wait_gone(workers + helpers, within=15) < 15, how  # "a few seconds", loaded
    if how == "SIGTERM":
        assert code == 128 + signal.SIGTERM  # stopped its workers, then exited as asked
    assert sorted(p.name for p in directory.iterdir()) == [f"{r}.pid" for r in range(world)]


@pytest.mark.timeout(240)
def test_a_job_sigkilled_whole_leaves_nothing_after_the_next_start(tmp_path):
    """SIGKILL of the launcher's whole process group (a scheduler's kill): nothing runs to
    clean up, so its rendezvous and multiprocessing's directory stay, each named after its
    dead owner (dt-pool-<pid>-..., dt-mp-<pid>-...; never an anonymous pymp-...). The next
    start, and its own exit, leave the temporary directory empty."""
    own_tmp = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))  # short: the fork server's socket
    launcher = None
    try:
        launcher = _start_launcher(tmp_path / "ranks", 2, TMPDIR=str(own_tmp))
        deadline = time.monotonic() + 180
        while len(list((tmp_path / "ranks").glob("*.pid"))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "no start"
            time.sleep(0.1)
        workers = [int(p.read_text()) for p in (tmp_path / "ranks").glob("*.pid")]
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(30)
        assert _wait_gone(workers, within=15) < 15
        left = sorted(p.name.split("-")[1] for p in own_tmp.iterdir())
        assert left == ["mp", "pool"], sorted(p.name for p in own_tmp.iterdir())
        code = "import os; from dt.launcher import run_workers; print(run_workers(os.getpid, 2, timeout=100))"
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=str(own_tmp))
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stderr[-2000:]
        assert list(own_tmp.iterdir()) == []
    finally:
        if launcher is not None and launcher.poll() is None:  # only if the test failed
            os.killpg(launcher.pid, signal.SIGKILL)
        shutil.rmtree(own_tmp, ignore_errors=True)


def test_a_stopped_command_says_so_in_one_line(capsys):
    from dt.launcher import RemoteError, Terminated, run_command

    def stopped(exc: BaseException):
        def main(argv):
            raise exc
        return main

    assert run_command("dt train", stopped(KeyboardInterrupt()), []) == 130
    assert run_command("dt train", stopped(Terminated(signal.SIGTERM)), []) == 143
    failed = WorkerError("train_worker: rank 2 died (signal SIGKILL) during train_worker", 2,
                         {2: RemoteError("died", "rank 2 died (signal SIGKILL) during train_worker")})
    assert run_command("dt train", stopped(failed), []) == 1
    assert capsys.readouterr().err.splitlines() == [
        "dt train: interrupted; every worker was stopped",
        "dt train: stopped by SIGTERM; every worker was stopped",
        "dt train: train_worker: rank 2 died (signal SIGKILL) during train_worker"]


# -- 2. a rank dies mid-collective ---------------------------------------------


def _die_mid_all_reduce(victim: int) -> None:
    # Validation off: the survivors are inside all_reduce[ring] itself, some waiting on
    # the victim, the others on a live rank that has given up.
    dt.set_validation(False)
    x = torch.ones(10_000)
    for i in range(1_000_000):
        if dist.get_rank() == victim and i == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        dt.all_reduce(x, algorithm="ring")


@pytest.mark.timeout(240)
def test_each_rank_killed_in_turn_mid_collective(run, pools):
    """Worlds 2 to 4, every rank in turn: every survivor names the dead rank, fast."""
    for world in (2, 3, 4):
        for victim in range(world):
            run(world, _fine)  # a started pool: the time measured is the failure's
            old = pools(world).pids
            err, _ = _fails(run, world, _timed, _die_mid_all_reduce, victim)
            assert err.rank == victim
            assert str(err).splitlines()[0].endswith(f"rank {victim} died (signal SIGKILL) "
                                                     "during _timed")
            for r in set(range(world)) - {victim}:
                e = err.errors[r]
                assert e.kind == "CollectiveError", (world, victim, r, e.message)
                assert f"rank {victim} died (signal SIGKILL)" in e.message
                assert "in all_reduce[ring] at step" in e.message
                assert _after(e.message) < FAST, f"{e.message}: not well before {RUN_TIMEOUT:g}s"
            _wait_gone(old, within=10)


def _fine() -> list[float]:
    x = torch.ones(4)
    dt.all_reduce(x)
    return x.tolist()


def _train_and_die(victim: int) -> None:
    from dt.train import parse_args, train_worker

    if dist.get_rank() == victim:
        threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
    train_worker(parse_args(["--dp", "2", "--pp", "2", "--steps", "100000", "--no-progress",
                             "--n-layer", "2", "--batch-size", "8", "--block-size", "8"]))


@pytest.mark.timeout(180)
def test_a_killed_trainer_is_named_not_its_survivors(run):
    err, seconds = _fails(run, 4, _train_and_die, 3)
    assert err.rank == 3 and "rank 3 died (signal SIGKILL)" in str(err).splitlines()[0]
    for r in (0, 1, 2):
        assert err.errors[r].kind in ("CollectiveError", "stopped"), err.errors[r].line()
        if err.errors[r].kind == "CollectiveError":
            assert "rank 3 died (signal SIGKILL)" in err.errors[r].message
    assert seconds < RUN_TIMEOUT / 2


# -- 3. the ranks disagree -----------------------------------------------------


def _two_groups_two_threads() -> list[float]:
    # Two groups with the same members, each used from its own thread.
    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    out: dict[int, float] = {}
    failures: list[BaseException] = []

    def work(k: int) -> None:
        try:
            x = torch.zeros(1)
            for _ in range(20):
                x += 1
                dt.all_reduce(x, group=groups[k])
            out[k] = x.item()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return [out[0], out[1]]


def test_two_groups_with_the_same_members_count_their_calls_apart(run):
    results = run(2, _two_groups_two_threads)
    expected = 0.0
    for _ in range(20):
        expected = 2 * (expected + 1)
    assert results == [[expected, expected]] * 2


def _mismatch(kind: str) -> None:
    r = dist.get_rank()
    if kind == "dtype":
        dt.all_reduce(torch.ones(8, dtype=torch.float64 if r == 1 else torch.float32))
    elif kind == "op":
        dt.all_reduce(torch.ones(8), op=dist.ReduceOp.MAX if r == 1 else dist.ReduceOp.SUM)
    elif kind == "size":
        dt.all_reduce(torch.ones(2_000_000 if r == 1 else 4))


@pytest.mark.parametrize("kind, text", [
    ("dtype", "ranks disagree on the dtype: rank 0 has torch.float32, rank 1 has torch.float64"),
    ("op", "ranks disagree on the op: rank 0 has SUM, rank 1 has MAX"),
    ("size", "rank 0 would send 4 elements to rank 1, which expects 2000000 from it: tensor sizes "
             "disagree across ranks"),
])
def test_disagreements_read_the_same_on_every_rank(run, kind, text):
    if kind == "size":  # the mismatch is big enough that auto picks differently on each rank
        assert auto.choose("all_reduce", "auto", 16, 3) != auto.choose("all_reduce", "auto", 8e6, 3)
    err, seconds = _fails(run, 3, _mismatch, kind)
    messages = {err.errors[r].message for r in range(3)}
    assert messages == {f"all_reduce: {text}"}  # one text, every field decoded, on every rank
    assert seconds < FAST


def _local_error_without_validation() -> None:
    dt.set_validation(False)
    src = 7 if dist.get_rank() == 1 else 0  # rank 1's own argument is wrong
    dt.broadcast(torch.ones(1000), src=src, algorithm="flat")


def test_without_validation_a_local_error_is_raised_there_and_named_elsewhere(run):
    err, seconds = _fails(run, 3, _timed, _local_error_without_validation)
    assert err.rank == 1 and err.errors[1].kind == "ValueError"
    assert "src=7 is not a rank of the group" in err.errors[1].message
    root = err.errors[0]  # stuck sending to rank 1: it hears why, long before its timeout
    assert root.kind == "CollectiveError", root.line()
    # Stuck where it waits on rank 1: its send (the torch wire), or the group's first
    # collective connecting it (dt.transport.connect), before any data moves.
    assert ("broadcast[flat] at step 0: send of 4000 bytes to rank 1 failed" in root.message
            or "at its first collective (broadcast)" in root.message), root.line()
    assert "rank 1 raised ValueError: broadcast: rank 1: src=7" in root.message
    assert _after(root.message) < FAST
    if 2 in err.errors:  # had rank 0 not sent to it yet when rank 0 gave up, it says why too
        assert "rank 1 raised ValueError" in err.errors[2].message, err.errors[2].line()
    assert seconds < FAST


# -- 4. late and absent ranks; the timeout rule -------------------------------


def _late(seconds: float) -> list[float]:
    dt.set_timeout(seconds + 30)
    if dist.get_rank() == 1:
        time.sleep(seconds)
    return _fine()


def test_a_late_rank_is_waited_for(run):
    assert run(3, _late, 3.0) == [[3.0] * 4] * 3


def _absent() -> None:
    dt.set_timeout(120)  # dt's own wait would outlast the run: the run's deadline must speak
    # Every run starts unconnected (dt.transport.reset): connected here by all three ranks,
    # so the wait on the absent rank is the all-reduce's own (its validation), not the
    # connection's (it relied on an earlier test's connection, and failed run alone).
    dt.barrier()
    if dist.get_rank() != 2:
        dt.all_reduce(torch.ones(5))


def test_an_absent_rank_is_named_when_the_run_times_out(run):
    err, seconds = _fails(run, 3, _absent, timeout=4)
    assert 2 not in err.errors  # it returned: it is the one the others wait on
    for r in (0, 1):
        assert err.errors[r].kind == "CollectiveTimeout", err.errors[r].line()
        assert "in validate(all_reduce call " in err.errors[r].message
        assert "rank 2" in err.errors[r].message
        assert "the run passed its 4s timeout" in err.errors[r].message
    assert seconds < 4 + 15  # the deadline plus the launcher's short grace, not 120 s


def _timeouts() -> dict[str, float]:
    out = {"env": transport.timeout_for(None)}
    g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=9))
    dt.set_timeout(7)
    out["set_timeout"] = transport.timeout_for(None)
    out["group"] = transport.timeout_for(g)
    out["plain group"] = transport.timeout_for(dist.new_group([0, 1]))
    return out


def test_one_timeout_rule(run, monkeypatch):
    monkeypatch.setenv("DT_TIMEOUT", "5")
    got = run(2, _timeouts)[0]
    assert got == {"env": 5.0, "set_timeout": 7.0, "group": 9.0, "plain group": 7.0}
    monkeypatch.delenv("DT_TIMEOUT")
    assert run(2, _timeouts)[0]["env"] == pytest.approx(0.8 * 120)  # the launcher's, last


def test_bad_timeouts_are_refused_alike(monkeypatch):
    with pytest.raises(ValueError) as by_call:
        settings.set_timeout(0)
    monkeypatch.setenv("DT_TIMEOUT", "0")
    with pytest.raises(ValueError) as by_env:
        settings.timeout_for(None)
    rule = "must be a positive, finite number of seconds, got "
    assert str(by_call.value).startswith(f"timeout {rule}0 ")
    assert str(by_env.value).startswith(f"DT_TIMEOUT {rule}'0' ")  # the same rule, the same words
    for bad in ("abc", "-1", "nan", "inf"):
        monkeypatch.setenv("DT_TIMEOUT", bad)
        with pytest.raises(ValueError, match="DT_TIMEOUT must be a positive, finite number"):
            settings.get_timeout()
    env = dict(os.environ, DT_TIMEOUT="abc", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", "import dt, dt.transport"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]  # refused when used, not at import


# -- 5. tensors ----------------------------------------------------------------


def _requires_grad(which: str) -> list[float]:
    r = dist.get_rank()
    x = torch.full((5,), float(r + 1), requires_grad=which == "all" or r == 1)
    dt.all_reduce(x)
    parts = [torch.empty(2) for _ in range(dist.get_world_size())]
    dt.all_gather(parts, torch.ones(2, requires_grad=True))
    return x.detach().tolist() + [float(x.requires_grad)]


@pytest.mark.parametrize("which", ["all", "one"])
def test_tensors_that_require_grad_are_reduced_on_every_rank(run, which):
    results = run(3, _requires_grad, which)
    for r, res in enumerate(results):
        assert res[:5] == [6.0] * 5
        assert res[5] == float(which == "all" or r == 1)  # untouched, as torch leaves it


def _meta(validate: bool) -> None:
    dt.set_validation(validate)
    dt.all_reduce(torch.empty(4, device="meta"))


@pytest.mark.parametrize("validate", [True, False])
def test_meta_tensors_are_refused_on_every_rank(run, validate):
    err, seconds = _fails(run, 2, _meta, validate)
    for r in (0, 1):
        assert err.errors[r].kind == "ValueError"
        assert err.errors[r].message == (f"all_reduce: rank {r}: a meta tensor cannot go over this "
                                         "gloo group, which moves cpu tensors (a meta tensor has no data)")
    assert seconds < FAST


# -- 6. bad command lines ------------------------------------------------------


BAD_COMMAND_LINES = [
    (["bench", "collectives", "-b", "64MB", "-e", "1KB"], "larger than -e"),
    (["bench", "collectives", "--world", "0"], "argument --world"),
    (["bench", "collectives", "-b", "abc"], "cannot read 'abc'"),
    (["bench", "collectives", "--algorithms", "telepathy"], "--algorithms 'telepathy'"),
    (["bench", "collectives", "-e", "4Q"], "K, M, G (1024s)"),
    (["bench", "collectives", "--collective", "barrier", "--plot", "b.png"], "a barrier has neither"),
    (["bench", "collectives", "--compare", "deepspeed", "--collective", "gather"], "needs all_reduce"),
    (["bench", "ddp", "--world", "0"], "argument --world"),
    (["bench", "ddp", "--buckets", "0"], "argument --buckets"),
    (["bench", "scaling", "--worlds", "0,2"], "argument --worlds"),
    (["bench", "scaling", "--tables", "99"], "no table 99"),
    (["model", "all_reduce", "--world", "0"], "argument --world"),
    (["model", "all_reduce", "--world", "-1"], "argument --world"),
    (["model", "all_reduce", "--bandwidth", "0GB/s"], "must be a rate above 0"),
    (["model", "all_reduce", "--size", "0"], "at least 1 byte"),
    (["tune", "--world", "0"], "argument --world"),
    (["train", "--steps", "0"], "argument --steps"),
    (["train", "--steps", "-3"], "argument --steps"),
    (["train", "--lr", "nan"], "must be a finite number"),
    (["train", "--dp", "0"], "argument --dp"),
    (["train", "--pp", "0"], "argument --pp"),
    (["train", "--tp", "3"], "--n-head 4 must be divisible by --tp 3"),
    (["selftest", "--world", "0"], "argument --world"),
    (["selftest", "--checks", "nope"], "unknown check(s) nope"),
    (["demo", "primitives", "--bytes", "0"], "at least 1 byte"),
    # issue 20: worlds held to what this host holds, the judge on dt.args, the router's own refusals
    (["demo", "primitives", "--world", "9999"], "9999 processes on this host: at most"),
    (["bench", "collectives", "--world", "4096"], "set DT_MAX_WORLD to change the limit"),
    (["bench", "idle", "--world", "0"], "argument --world"),
    (["tune", "--world", "9999"], "processes on this host: at most"),
    (["selftest", "--world", "9999"], "processes on this host: at most"),
    (["train", "--dp", "64", "--tp", "64", "--n-head", "64"], "(--dp x --cp x --tp x --pp) on this host"),
    (["train", "--block-size", "100000"], "cannot fit in memory: each attention score tensor is "
                                          "micro-batch 8 x heads 4 x 100000 x 100000"),
    (["cluster", "up", "--hosts", "100", "--per-host", "100", "--", "true"], "ranks (--hosts x --per-host)"),
    (["judge", "ring.py", "--worlds", "9999"], "argument --worlds: 9999 processes on this host: at most"),
    (["judge", "ring.py", "--worlds", "0"], "argument --worlds: must be a number of processes from 1"),
    (["judge", "ring.py", "--worlds", "abc"], "argument --worlds: must be a number of processes"),
    (["judge", "ring.py", "--bench", "--bench-world", "0"], "argument --bench-world"),
    (["judge", "ring.py", "--bench", "--reps", "0"], "argument --reps: must be a whole number >= 1"),
    (["judge", "ring.py", "--bench-sizes", "1XB"], "unknown size unit 'XB'"),
    (["judge", "ring.py", "--timeout", "-5"], "argument --timeout: must be a positive"),
    (["judge", "ring.py", "--timeout", "0"], "argument --timeout: must be a positive"),
    (["judge"], "the following arguments are required: file"),
    (["judge", "nosuch.py"], "no such file: nosuch.py"),
    (["exercises", "start", "nosuch"], "invalid choice: 'nosuch'"),
    (["exercises"], "the following arguments are required: action"),
    (["bench", "foo"], "unknown bench 'foo': one of collectives"),
    (["bench"], "which bench?"),
    (["nosuch"], "unknown command 'nosuch'"),
]


@pytest.mark.parametrize("argv, text", BAD_COMMAND_LINES, ids=[" ".join(a) for a, _ in BAD_COMMAND_LINES])
def test_bad_command_lines_are_one_line_and_exit_2(argv, text, capsys, tmp_path, monkeypatch):
    from dt.tools.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DT_MAX_WORLD", raising=False)
    try:  # a parser's refusal exits; the router's own returns its status
        code = main(argv)
    except SystemExit as info:
        code = info.code
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and text in err, err
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_a_bad_environment_is_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, DT_TIMEOUT="abc", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "dt", "train", "--steps", "2"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "dt train: error: DT_TIMEOUT must be a positive, finite number of seconds, got 'abc' (for a very "
        "long wait give a large number, e.g. 86400) (see dt train --help)"]
    assert list(tmp_path.iterdir()) == []
