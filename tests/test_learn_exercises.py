"""The exercises: every reference solution passes the judge; start, hint and solution behave.

Each reference is judged on the full case list, on a few world sizes chosen
to cover what its algorithm cares about (a fold at 3, a power of two at 8, odd
and uneven at 5); together they cover 1, 2, 3, 5 and 8. Byte counts are held
to the exercise's own dt.cost figure, so a reference that drifts from dt's
algorithm fails here.
"""

from __future__ import annotations

import pytest

from dt import cost
from dt.launcher import WorkerPool
from dt.learn import exercises
from dt.learn.exercises import command, cost_estimate, state
from dt.learn.judge.command import main as judge_main
from dt.learn.judge.judge import judge
from dt.learn.judge.runner import Runner

WORLDS = {
    "ring_all_reduce": (1, 2, 5, 8),
    "ring_reduce_scatter": (3, 8),
    "ring_all_gather": (5,),
    "chain_broadcast": (2, 5),
    "tree_broadcast": (3, 8),
    "all_to_all_transpose": (5,),
    "recursive_doubling_all_reduce": (3, 8),
    "bucketed_gradient_sync": (1, 3, 5),
}


def _alive() -> bool:
    return True


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Work in a fresh folder, as a learner does (the state file lands there).

    The worker processes fork from multiprocessing's forkserver, which imports dt once, from
    the folder it starts in: start it here first, so it finds this checkout's dt.
    """
    with WorkerPool(1) as pool:
        pool.run(_alive, timeout=120)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def runner():
    with Runner(timeout=20.0) as r:
        yield r


def test_every_exercise_is_listed_and_complete():
    judged = [e for e in exercises.all_exercises() if e.collective]
    assert sorted(WORLDS) == sorted(e.name for e in judged)
    for ex in exercises.all_exercises():
        assert ex.statement and ex.hints and ex.title and ex.see
        assert (ex.folder / "skeleton.py").exists() and "raise NotImplementedError" not in ex.solution
        compile(exercises.starter(ex), f"{ex.name}.py", "exec")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(WORLDS))
def test_reference_solution_passes_the_judge(name, runner):
    ex = exercises.find(name)
    report = judge(str(ex.folder / "solution.py"), ex.collective, function=ex.function, worlds=WORLDS[name],
                   algorithm=ex.target, runner=runner)
    failing = [f"p={r.world} {r.case.name}: {r.verdict.kind} {r.verdict.message}"
               for r in report.results if not r.verdict.passed]
    assert not failing, "\n".join(failing)
    assert len(report.results) >= 5 * len(WORLDS[name])
    for r in report.results:  # exactly dt.cost's figure, not merely under it
        assert r.verdict.traffic["busiest"] == r.verdict.traffic["target_busiest"], r.case.name


def test_the_skeleton_is_found_by_its_marker_and_fails_until_written(here):
    assert command.main(["start", "ring_all_reduce"]) == 0
    assert exercises.marker("ring_all_reduce.py") == "ring_all_reduce"
    text = (here / "ring_all_reduce.py").read_text()
    p8 = cost.ring_all_reduce((1 << 20) // 4, 4, 8, 0)  # the cost to reach, from dt.cost
    assert f"p=8: {p8.bytes_sent:>12,} bytes in {p8.messages_sent} messages" in text
    assert command.main(["start", "ring_all_reduce"]) == 2  # never overwrites work
    assert judge_main(["ring_all_reduce.py", "--worlds", "2", "--sizes", "5"]) == 1
    assert "ring_all_reduce" not in state.load()["passed"]


def test_solution_opens_after_a_pass_or_on_giving_up(here, capsys):
    ex = exercises.find("chain_broadcast")
    assert command.main(["solution", "chain_broadcast"]) == 1
    assert "opens once" in capsys.readouterr().err
    assert command.main(["solution", "chain_broadcast", "--give-up"]) == 0
    assert capsys.readouterr().out == ex.solution
    assert state.load()["gave_up"] == {"chain_broadcast": True}
    state.record_pass("tree_broadcast", "tree_broadcast.py")
    assert command.main(["solution", "tree_broadcast"]) == 0
    assert "lowest_bit" in capsys.readouterr().out


def test_a_passing_file_named_like_its_exercise_unlocks_without_the_header(here, capsys):
    solution = exercises.find("cost_estimate").solution
    assert not solution.lstrip().startswith("# dt exercise")  # the header is what this file lacks
    # Named otherwise and headerless, the judge cannot tell which exercise it is: nothing opens,
    # and the refusal says what would have made it count.
    (here / "mine.py").write_text(solution)
    assert exercises.marker("mine.py") is None
    judge_main(["mine.py"])
    assert command.main(["solution", "cost_estimate"]) == 1
    refusal = capsys.readouterr().err
    assert "cost_estimate.py" in refusal and "# dt exercise: cost_estimate" in refusal
    assert "cost_estimate" not in state.load()["passed"]
    # The file `dt exercises start` writes, rewritten without its first line, is still the exercise.
    (here / "cost_estimate.py").write_text(solution)
    assert exercises.marker("cost_estimate.py") == "cost_estimate"
    assert judge_main(["cost_estimate.py"]) == 0
    assert command.main(["solution", "cost_estimate"]) == 0
    assert capsys.readouterr().out.endswith(solution)
    # The header wins over the name.
    (here / "ring_all_reduce.py").write_text("# dt exercise: chain_broadcast\n")
    assert exercises.marker("ring_all_reduce.py") == "chain_broadcast"
    (here / "ring_all_reduce.txt").write_text(solution)  # only a Python file is judged by its name
    assert exercises.marker("ring_all_reduce.txt") is None


@pytest.mark.timeout(240)
def test_only_a_full_passing_judge_records_the_pass(here, monkeypatch):
    monkeypatch.setattr("dt.learn.judge.command.DEFAULT_WORLDS", (2, 3))  # "full" made cheap
    ex = exercises.find("chain_broadcast")
    (here / "mine.py").write_text("# dt exercise: chain_broadcast\n" + ex.solution)
    assert judge_main(["mine.py", "--sizes", "0,13"]) == 0  # a subset of the cases: no record
    assert judge_main(["mine.py", "--worlds", "3"]) == 0  # a subset of the worlds: no record
    assert "chain_broadcast" not in state.load()["passed"]
    assert judge_main(["mine.py"]) == 0
    assert state.load()["passed"]["chain_broadcast"]["file"] == str(here / "mine.py")


def test_hints_come_one_at_a_time(here, capsys):

    def shown() -> int:
        return sum(line.startswith("hint ") for line in capsys.readouterr().out.splitlines())

    command.main(["hint", "ring_all_gather"])
    assert shown() == 1
    command.main(["hint", "ring_all_gather"])
    assert shown() == 2
    command.main(["hint", "ring_all_gather", "--all"])
    assert shown() == len(exercises.find("ring_all_gather").hints)


def test_cost_estimate_checks_numbers_against_the_model(here, capsys):
    want = cost_estimate.expected()
    e = cost.estimate("all_reduce", "ring", 1e9, 8, alpha=5e-6, beta=1 / 450e9)  # `dt model`'s figure
    assert want["steps"] == e.steps and want["time_1GB"] == pytest.approx(e.total)
    assert want["latency_bound_1MB"] is True
    assert all(ok for _, ok, _ in cost_estimate.check(want))
    off = cost_estimate.check({**want, "time_1MB": 2 * want["time_1MB"]})
    assert [name for name, ok, _ in off if not ok] == ["time_1MB"]
    # As a learner meets it: the skeleton fails, the worked answers pass and record the pass.
    assert command.main(["start", "cost_estimate"]) == 0
    assert judge_main(["cost_estimate.py"]) == 1
    assert "not answered yet" in capsys.readouterr().out
    solution = exercises.find("cost_estimate").solution
    (here / "cost_estimate.py").write_text("# dt exercise: cost_estimate\n" + solution)
    assert judge_main(["cost_estimate.py"]) == 0
    out = capsys.readouterr().out
    assert "dt model all_reduce --size 1GB,1MB --world 8" in out and "PASS" in out
    assert "cost_estimate" in state.load()["passed"]


def test_list_and_show(here, capsys):
    assert command.main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in exercises.EXERCISES)
    assert command.main(["show", "tree_broadcast"]) == 0
    shown = capsys.readouterr().out
    root = max(cost.binomial_broadcast((1 << 20) // 4, 4, 8, r, 0).bytes_sent for r in range(8))
    assert f"p=8: {root:>12,} bytes" in shown


def test_the_doubling_exercise_and_the_quiz_agree_on_small_all_reduces():
    """The quiz's last question (computed from dt.cost) and the exercise name the same winner at 1 KB."""
    from dt.learn import quiz
    from dt.units import fmt_time

    last = quiz.QUESTIONS[-1]
    fastest = last.choices["abcd".index(last.answer())]
    statement = " ".join(exercises.find("recursive_doubling_all_reduce").statement.split())
    at_1kb = {a: fmt_time(quiz._estimate(a, "1KB").total) for a in quiz._SMALL}  # noqa: SLF001
    assert fastest == "naive" and f"At 1 KB naive is faster still ({at_1kb['naive']} against " \
                                  f"{at_1kb['recursive_doubling']}" in statement
    assert "small messages" not in exercises.find("recursive_doubling_all_reduce").title


def test_a_mistyped_exercise_name_gets_a_did_you_mean(capsys):
    with pytest.raises(SystemExit) as stop:
        command.main(["hint", "ring_alreduce"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1
    assert "invalid choice: 'ring_alreduce' (did you mean ring_all_reduce?)" in err
