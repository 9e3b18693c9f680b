"""`dt quiz`: answered non-interactively, every answer checked or explained, every pointer a real command."""

from __future__ import annotations

import io

from dt import cost
from dt.learn import quiz
from dt.tools import cli


def _right() -> list[str]:
    return [str(q.answer()) for q in quiz.QUESTIONS]


def test_all_right_scores_full_marks(capsys):
    assert quiz.main(["--answers", ",".join(_right())]) == 0
    out = capsys.readouterr().out
    assert f"score: {len(quiz.QUESTIONS)}/{len(quiz.QUESTIONS)}" in out
    assert out.count("right: ") == len(quiz.QUESTIONS)


def test_answers_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(_right()) + "\n"))
    assert quiz.main([]) == 0
    assert f"score: {len(quiz.QUESTIONS)}" in capsys.readouterr().out


def test_a_wrong_answer_is_explained_with_the_right_one(capsys):
    answers = _right()
    answers[0] = "a"  # "the sum" for all_gather
    answers[4] = "2MiB"  # ring bytes per rank
    assert quiz.main(["--answers", ",".join(answers)]) == 1
    out = capsys.readouterr().out
    assert "not quite: the answer is b) every rank's tensor, side by side in rank order" in out
    ring = cost.ring_all_reduce((1 << 20) // 4, 4, 4, 0).bytes_sent
    assert f"the answer is {ring:,}" in out and "Bytes per rank: 2(p-1)/p * n" in out
    assert f"score: {len(quiz.QUESTIONS) - 2}/" in out


def test_missing_answers_are_explained_not_skipped(capsys):
    assert quiz.main(["--answers", "b"]) == 1
    out = capsys.readouterr().out
    assert out.count("no answer; ") == len(quiz.QUESTIONS) - 1


def test_numbers_accept_units_and_come_from_the_model():
    q = quiz.QUESTIONS[4]
    assert quiz.check(q, "1.5MiB")[0] and quiz.check(q, "1572864")[0] and not quiz.check(q, "1MiB")[0]
    busbw = quiz.QUESTIONS[6]
    assert quiz.check(busbw, "175")[0] and quiz.check(busbw, "175GB/s")[0]
    assert busbw.answer() == cost.bus_bandwidth("all_reduce", 10**9, 0.01, 8)[1] / 1e9


def test_every_question_points_at_a_dt_command_that_exists():
    for q in quiz.QUESTIONS:
        words = q.see.split("(")[0].split()
        assert words[0] == "dt", q.see
        if words[1] == "bench":
            assert words[2] in cli.BENCHES, q.see
        else:
            assert words[1] in cli.COMMANDS, q.see
        if words[1] == "demo":
            assert words[2] == "primitives"


def test_the_docstrings_answers_are_the_right_ones(capsys):
    """`dt quiz --answers ...` as its help shows it scores full marks: the example is the answer key."""
    shown = next(line.split()[3] for line in quiz.__doc__.splitlines() if "--answers" in line)
    replies = shown.split(",")
    assert len(replies) == len(quiz.QUESTIONS)
    assert [q.prompt for q, reply in zip(quiz.QUESTIONS, replies) if not quiz.check(q, reply)[0]] == []
