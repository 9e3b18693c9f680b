"""The judge against deliberately broken collectives: each caught, with a message that says what.

The broken files live in tests/learn_broken/ (one bug each, described in its
docstring); a few more are written on the fly. Every test that makes the
judge fail a run (deadlock, crash, hang) also checks that every process the
judge started is gone afterwards. The reference solutions' passes are in
test_learn_exercises.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dt.learn.judge import instrument
from dt.learn.judge.cases import blocks, cases_for, matrix
from dt.learn.judge.command import main as judge_main
from dt.learn.judge.judge import judge
from dt.learn.judge.report import as_json, text
from dt.learn.judge.runner import Runner

BROKEN = Path(__file__).parent / "learn_broken"
RING = Path(__file__).parent.parent / "dt" / "learn" / "exercises" / "ring_all_reduce" / "solution.py"


def _descendants() -> set[int]:
    """Every live process below this one (the judge's workers are the forkserver's children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


@pytest.fixture
def no_process_left():
    judge(str(RING), "all_reduce", worlds=[1], sizes=[1])  # the forkserver exists before counting
    before = _descendants()
    yield
    deadline = time.monotonic() + 10
    while (left := _descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {sorted(left)}"


@pytest.fixture(scope="module")
def runner():
    with Runner(timeout=10.0) as r:
        yield r


def _only(report, kind=None):
    return [r for r in report.results if kind is None or r.verdict.kind == kind]


# ---------------------------------------------------------------------------
# The five from the issue.
# ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_deadlock_at_33_over_5_names_the_waiting_ranks_and_messages(no_process_left):
    report = judge(str(BROKEN / "ring_segments_sized_like_own_chunk.py"), "all_reduce", worlds=[5],
                   sizes=[33], timeout=2.0)
    (result,) = report.results
    v = result.verdict
    assert v.kind == "deadlock", v.message
    assert "still waiting after 2s" in v.message
    waiting = [line for line in v.message.splitlines() if line.startswith("rank ")]
    assert len(waiting) >= 2
    for line in waiting:  # who, on what, which message, how big, where, and what the peer did
        assert " waits in " in line and "message" in line and "bytes" in line
        assert "ring_segments_sized_like_own_chunk.py:" in line
        assert f"sent rank {line.split()[1]} only" in line or "posted only" in line
    assert not report.passed


@pytest.mark.timeout(120)
def test_even_lengths_do_not_deadlock_that_ring(runner):
    report = judge(str(BROKEN / "ring_segments_sized_like_own_chunk.py"), "all_reduce", worlds=[5],
                   sizes=[0, 40], runner=runner)
    assert [r.verdict.kind for r in report.results] == ["ok", "ok"]


@pytest.mark.timeout(120)
def test_a_receive_smaller_than_its_message_is_a_crash_with_both_sizes(no_process_left):
    report = judge(str(BROKEN / "ring_receives_into_own_chunk.py"), "all_reduce", worlds=[5],
                   sizes=[33], timeout=2.0)
    v = report.results[0].verdict
    assert v.kind == "crash", v.message
    first = v.message.splitlines()[0]
    assert "is 28 bytes" in first and "into 24 bytes" in first and "gloo aborts" in first
    assert "crashed (signal SIGABRT)" in v.message


@pytest.mark.timeout(120)
def test_forgotten_avg_division_is_wrong_and_says_so(runner):
    report = judge(str(BROKEN / "ring_forgets_avg.py"), "all_reduce", worlds=[2, 5], only=["AVG", "n=33"],
                   runner=runner)
    kinds = {(r.world, r.case.name): r.verdict.kind for r in report.results}
    assert kinds == {(2, "n=33"): "ok", (2, "AVG"): "wrong", (5, "n=33"): "ok", (5, "AVG"): "wrong"}
    for r in _only(report, "wrong"):
        assert "that is the sum: ReduceOp.AVG divides it by the group size" in r.verdict.message
        assert f"({r.world})" in r.verdict.message
        assert "rank 0: tensor[0] is" in r.verdict.message


@pytest.mark.timeout(120)
def test_calling_torch_all_reduce_inside_is_forbidden(runner):
    report = judge(str(BROKEN / "calls_torch_all_reduce.py"), "all_reduce", worlds=[1, 3], runner=runner)
    first = report.results[0].verdict
    assert first.kind == "forbidden"
    assert "called torch.distributed.all_reduce at calls_torch_all_reduce.py:8" in first.message
    # One forbidden case ends its world: the rest are skipped, not run again and again.
    assert {r.verdict.kind for r in report.results} == {"forbidden", "skipped"}
    assert {r.world for r in _only(report, "forbidden")} == {1, 3}


@pytest.mark.timeout(120)
def test_twice_the_bytes_is_right_but_over_the_rings_figure(runner):
    report = judge(str(BROKEN / "ring_sends_twice.py"), "all_reduce", worlds=[5, 8], sizes=[33, 1031],
                   runner=runner)
    assert {r.verdict.kind for r in report.results} == {"traffic"}
    for r in report.results:
        t = r.verdict.traffic
        assert t["busiest"] == 2 * t["target_busiest"] and t["total"] == 2 * t["target_total"]
        assert "right, but" in r.verdict.message and "(2.00x" in r.verdict.message
        assert "dt.cost.traffic_for('all_reduce', 'ring'" in r.verdict.message


@pytest.mark.timeout(120)
def test_data_corrupted_on_odd_worlds_only(runner):
    report = judge(str(BROKEN / "doubling_without_fold.py"), "all_reduce", worlds=[2, 3, 5, 8], sizes=[13],
                   runner=runner)
    kinds = {r.world: r.verdict.kind for r in report.results}
    # Right on powers of two (at 8 it sends lg p times the tensor: more than the ring), wrong on 3 and 5.
    assert kinds == {2: "ok", 3: "wrong", 5: "wrong", 8: "traffic"}
    for r in _only(report, "wrong"):
        assert "differ from torch's all_reduce on the same inputs" in r.verdict.message
        assert r.verdict.message.startswith("rank ")


# ---------------------------------------------------------------------------
# What else a learner's file can do.
# ---------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def _judged_all_reduce(tmp_path: Path, name: str, body: str, hang_after: float, sizes: list[int]):
    """The judge's report on the all_reduce in `body` at world 2, a rank that stops for `hang_after`
    seconds counted as hung."""
    with Runner(timeout=1.0, hang_after=hang_after) as r:
        return judge(_write(tmp_path, name, body), "all_reduce", worlds=[2], sizes=sizes, runner=r)


@pytest.mark.timeout(120)
def test_an_endless_loop_is_a_hang_with_its_line(tmp_path, no_process_left):
    report = _judged_all_reduce(tmp_path, "spin.py", (
        "import torch.distributed as dist\n\n\n"
        "def all_reduce(tensor, op=None, group=None):\n"
        "    while dist.get_rank() == 1:\n"
        "        pass\n"), hang_after=3.0, sizes=[5, 7])
    kinds = [x.verdict.kind for x in report.results]
    assert kinds == ["hang", "skipped"]
    message = report.results[0].verdict.message
    assert "rank 1 neither returned nor waited on a message for 3s" in message
    assert "spin.py:5 in all_reduce" in message


@pytest.mark.timeout(120)
def test_a_loop_in_c_that_holds_the_gil_is_still_a_hang_with_its_line(tmp_path, no_process_left):
    """The watchdog thread cannot run while C code holds the GIL (a backtracking regex): faulthandler,
    which needs no GIL, dumps the stack a moment later and ends the rank."""
    report = _judged_all_reduce(tmp_path, "regex.py", (
        "import re\n\nimport torch.distributed as dist\n\n\n"
        "def all_reduce(tensor, op=None, group=None):\n"
        "    if dist.get_rank() == 1:\n"
        "        re.match(r'(a+)+$', 'a' * 64 + 'b')\n"), hang_after=2.0, sizes=[5])
    assert [x.verdict.kind for x in report.results] == ["hang"]
    assert "regex.py:8 in all_reduce" in report.results[0].verdict.message


@pytest.mark.timeout(120)
def test_a_send_nobody_receives_is_unmatched(tmp_path, runner):
    path = _write(tmp_path, "extra.py", (
        "import torch.distributed as dist\n\n\n"
        "def all_reduce(tensor, op=None, group=None):\n"
        "    if dist.get_rank() == 0:\n"
        "        dist.isend(tensor, 1)  # never waited on, never received\n"))
    report = judge(path, "all_reduce", worlds=[2], sizes=[3], timeout=2.0, runner=runner)
    v = report.results[0].verdict
    assert v.kind == "unmatched"
    assert "rank 0's send to rank 1 (its 1st message to rank 1, 12 bytes) (at extra.py:6)" in v.message
    assert "nobody received it" in v.message


@pytest.mark.timeout(120)
def test_an_exception_names_rank_line_and_who_it_left_waiting(tmp_path, runner):
    path = _write(tmp_path, "raises.py", (
        "import torch.distributed as dist\n\n\n"
        "def all_reduce(tensor, op=None, group=None):\n"
        "    if dist.get_rank() == 1:\n"
        "        raise IndexError('chunk 5 of 2')\n"
        "    dist.recv(tensor, 1)\n"))
    report = judge(path, "all_reduce", worlds=[2], sizes=[3], timeout=2.0, runner=runner)
    v = report.results[0].verdict
    assert v.kind == "error"
    assert "rank 1 raised IndexError: chunk 5 of 2 at raises.py:6" in v.message
    waiting = v.message.splitlines()[1]
    assert waiting.startswith("rank 0 waits in recv from rank 1") and "raised IndexError" in waiting


@pytest.mark.timeout(60)
def test_a_file_that_does_not_import_or_lacks_the_function(tmp_path):
    broken = _write(tmp_path, "syntax.py", "def all_reduce(tensor:\n")
    report = judge(broken, "all_reduce", worlds=[2])
    assert [r.verdict.kind for r in report.results] == ["import"]
    assert "SyntaxError" in report.results[0].verdict.message
    other = _write(tmp_path, "other.py", "def all_gather(tensor_list, tensor, group=None):\n    pass\n")
    report = judge(other, "all_reduce", worlds=[2])
    assert "defines no function all_reduce() (it defines: all_gather)" in report.results[0].verdict.message
    failing = _write(tmp_path, "boom.py", "raise RuntimeError('at import')\n\ndef all_reduce(t):\n    pass\n")
    report = judge(failing, "all_reduce", worlds=[2], sizes=[1])
    assert report.results[0].verdict.kind == "import"
    assert "importing boom.py raised RuntimeError: at import" in report.results[0].verdict.message


@pytest.mark.timeout(120)
def test_a_function_without_op_or_group_is_judged_on_what_it_takes(tmp_path, runner):
    path = _write(tmp_path, "plain.py", RING.read_text().replace(
        "def all_reduce(tensor, op=ReduceOp.SUM, group=None):", "def all_reduce(tensor, group=None):")
        .replace("name = op_name(op)", "name = 'SUM'"))
    report = judge(path, "all_reduce", worlds=[3], only=["AVG", "n=13", "subgroup"], runner=runner)
    assert [r.case.name for r in report.results] == ["n=13 (prime)", "subgroup"]
    assert report.passed
    assert any("takes no `op`" in n for n in report.notes)


@pytest.mark.timeout(120)
def test_gradients_synced_one_by_one_send_too_many_messages(tmp_path, runner):
    path = _write(tmp_path, "per_param.py", (
        "from torch.distributed import ReduceOp\n\nimport dt\n\n\n"
        "def sync_gradients(params, bucket_bytes, group=None):\n"
        "    for p in params:\n"
        "        if p.grad is not None:\n"
        "            dt.all_reduce(p.grad, ReduceOp.AVG, group, algorithm='ring')\n"))
    report = judge(path, "sync_gradients", worlds=[3], only=["one bucket"], runner=runner)
    v = report.results[0].verdict
    assert v.kind == "traffic", v.message
    assert "right, but more messages than the ring algorithm sends" in v.message
    assert "1 bucket, one ring all-reduce each" in v.message


@pytest.mark.timeout(120)
def test_dt_own_collective_inside_is_forbidden(tmp_path, runner):
    path = _write(tmp_path, "uses_dt.py", (
        "import dt\n\n\n"
        "def all_reduce(tensor, op=None, group=None):\n"
        "    dt.all_reduce(tensor, group=group, algorithm='ring')\n"))
    report = judge(path, "all_reduce", worlds=[2], sizes=[4], runner=runner)
    v = report.results[0].verdict
    assert v.kind == "forbidden" and "called dt's own dt.collectives.api.all_reduce" in v.message


# ---------------------------------------------------------------------------
# The command line, the report, the pieces.
# ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_command_line_json_and_exit_status(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert judge_main([str(RING), "--worlds", "2,3", "--sizes", "0,33", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["passed"] and data["collective"] == "all_reduce" and data["algorithm"] == "ring"
    assert len(data["cases"]) == 4 and {c["verdict"] for c in data["cases"]} == {"ok"}
    assert "PASS" in capsys.readouterr().out
    assert judge_main([str(BROKEN / "ring_forgets_avg.py"), "--worlds", "2", "--cases", "AVG",
                       "--json", "-"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert not data["passed"] and data["cases"][0]["verdict"] == "wrong"
    assert judge_main([str(tmp_path / "missing.py")]) == 2


@pytest.mark.timeout(120)
def test_text_report_shows_the_table_failures_and_traffic(runner):
    report = judge(str(BROKEN / "doubling_without_fold.py"), "all_reduce", worlds=[2, 3], sizes=[13, 1031],
                   runner=runner)
    shown = text(report)
    assert "p=2" in shown and "p=3" in shown and "WRONG" in shown and "FAIL" in shown.splitlines()[-1]
    assert "traffic in case 'n=1031'" in shown
    assert json.dumps(as_json(report))  # serialisable as it is


@pytest.mark.timeout(120)
def test_bench_times_yours_dt_and_torch(runner):
    from dt.learn.judge.bench import bench

    result = bench(runner, "all_reduce", str(RING), "all_reduce", "ring", 2, sizes=(4_000,), reps=2)
    (row,) = result["rows"]
    assert result["who"] == ["yours", "dt ring", "torch"] and not row["wrong"]
    assert all(row[w]["seconds"] > 0 and row[w]["busbw"] > 0 for w in result["who"])


def test_cases_cover_the_shapes_that_break_things():
    names = [c.name for c in cases_for("all_reduce", 5)]
    for want in ("n=0", "n=1", "n=p-1 (fewer than ranks)", "n=13 (prime)", "AVG", "bool", "subgroup"):
        assert want in names
    assert "subgroup" not in [c.name for c in cases_for("all_reduce", 2)]
    uneven = next(c for c in cases_for("all_gather", 5) if c.layout == "uneven")
    assert 0 in blocks(uneven, 5) and len(set(blocks(uneven, 5))) > 2
    m = matrix(next(c for c in cases_for("all_to_all", 3) if c.layout == "uneven"), 3)
    assert any(m[i][j] != m[j][i] for i in range(3) for j in range(3))


def test_messages_are_described_by_peer_ordinal_and_size():
    e = {"kind": "recv", "peer": 2, "k": 5, "bytes": 132, "tag": 0}
    assert instrument.describe(e) == "recv from rank 2 (its 5th message from rank 2, 132 bytes)"
    assert [instrument.ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd"]
