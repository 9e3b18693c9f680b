"""`dt quiz`: the chapter's self-test, in the terminal.

    dt quiz                              asks each question, checks each answer, explains it
    dt quiz --answers b,c,b,a,1.5MiB,14,175,a,a,d     all at once (or one per line on stdin)

What each primitive leaves on each rank, why all-reduce is reduce-scatter +
all-gather, what a ring sends per rank, busbw against algbw, and why small
messages are slow. Every answer is checked, or explained when wrong, and
each question names the `dt` command that shows it. The numbers are not
written here: they are computed from dt.cost, the same model `dt model`
and the judge use. Exit status 0 when every answer is right, 1 otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

from dt import cost
from dt.units import fmt_bytes, fmt_time, parse_rate, parse_size, parse_time

__all__ = ["QUESTIONS", "Question", "check", "main"]

ALPHA, BANDWIDTH = "5us", "450GB/s"  # the chapter's machine
DEMO = "dt demo primitives"


@dataclass(frozen=True)
class Question:
    prompt: str
    choices: tuple[str, ...]  # a) b) c) ...; empty: the answer is a number
    answer: Callable[[], str | float]  # the right letter, or the number
    why: Callable[[], str]
    see: str
    parse: Callable[[str], float] = float  # numbers: the reply as a number in the answer's unit


def _doc_line(fn: Callable[..., object], starts: str) -> str:
    lines = [ln.strip() for ln in (inspect.getdoc(fn) or "").splitlines()]
    return next((ln for ln in lines if ln.startswith(starts)), "")


def _estimate(algorithm: str, size: str, p: int = 8) -> cost.Estimate:
    return cost.estimate("all_reduce", algorithm, parse_size(size), p, alpha=parse_time(ALPHA),
                         beta=1 / parse_rate(BANDWIDTH))


def _ring_bytes() -> float:
    return cost.ring_all_reduce((1 << 20) // 4, 4, 4, 0).bytes_sent


def _busbw() -> float:
    return cost.bus_bandwidth("all_reduce", parse_size("1GB"), 0.010, 8)[1] / 1e9


_SMALL = ("ring", "recursive_doubling", "rabenseifner", "naive")


def _fastest_small() -> str:
    best = min(_SMALL, key=lambda a: _estimate(a, "1KB").total)
    return "abcd"[_SMALL.index(best)]


def _gbps(reply: str) -> float:
    reply = reply.strip()
    return parse_rate(reply) / 1e9 if reply[-2:].lower() == "/s" else float(reply)


QUESTIONS = (
    Question(
        "After all_gather, what does each rank hold?",
        ("the sum of every rank's tensor", "every rank's tensor, side by side in rank order",
         "its own slice of the sum (rank r: slice r)", "rank 0's tensor"),
        lambda: "b",
        lambda: "all-gather concatenates, nothing is reduced: every rank ends with all p pieces "
                "(the sum is all-reduce, a slice of the sum reduce-scatter, rank 0's tensor broadcast)",
        DEMO),
    Question(
        "After reduce_scatter, what does rank r hold?",
        ("the sum of every rank's tensor", "every rank's slice r", "slice r of the sum over all ranks",
         "rank r's own tensor, unchanged"),
        lambda: "c",
        lambda: "each rank keeps one slice, reduced over everyone: 1/p of an all-reduce's result",
        DEMO),
    Question(
        "In all_to_all, where does block j of rank i go?",
        ("to every rank", "to rank j, where it becomes block i: the block matrix is transposed",
         "to rank i + j", "it is summed into block j of every rank"),
        lambda: "b",
        lambda: "row i of the blocks lives on rank i before, column i after: a transpose "
                "(expert routing, sequence <-> head parallel)",
        DEMO + "   (and: dt exercises start all_to_all_transpose)"),
    Question(
        "Why is all-reduce = reduce-scatter followed by all-gather?",
        ("reduce-scatter leaves rank r with slice r reduced over every rank; all-gather then gives "
         "every rank every reduced slice",
         "all-gather first collects every tensor and reduce-scatter then adds them",
         "they are two names for one algorithm",
         "only when p is a power of two"),
        lambda: "a",
        lambda: "after reduce-scatter the p reduced slices are spread over the p ranks; gathering them "
                "is the all-reduce. The ring does exactly this, one lap each: "
                + _doc_line(cost.ring_all_reduce, "Bytes per rank"),
        DEMO + "   (it checks reduce_scatter + all_gather == all_reduce on 4 ranks)"),
    Question(
        "A ring all-reduce of 1 MiB of float32 runs on 4 ranks. How many bytes does each rank send?",
        (), _ring_bytes,
        lambda: f"{_doc_line(cost.ring_all_reduce, 'Bytes per rank')} Here: "
                f"{_ring_bytes():,.0f} B = {fmt_bytes(_ring_bytes())} (dt.cost.ring_all_reduce)",
        DEMO + " --world 4 --bytes 1048576   (measured bytes per rank next to the model)",
        parse=lambda s: float(parse_size(s.replace(" ", "")))),
    Question(
        "How many sequential steps does a ring all-reduce take on 8 ranks?",
        (), lambda: float(cost.formula("all_reduce", "ring", 1, 8)[0]),
        lambda: f"p-1 for the reduce-scatter lap and p-1 for the all-gather lap: "
                f"{cost.formula('all_reduce', 'ring', 1, 8)[0]}; each pays the latency once",
        f"dt model all_reduce --size 1MB --world 8 --latency {ALPHA}   (the steps column)"),
    Question(
        "An all-reduce of 1 GB (1e9 bytes) takes 10 ms on 8 ranks. What is its busbw, in GB/s?",
        (), _busbw,
        lambda: f"algbw = S / t = 100 GB/s; busbw = algbw x {cost.BUSBW_FACTOR['all_reduce'](8):g} "
                f"(dt.cost.BUSBW_FACTOR['all_reduce'](8): the share of S each rank's link carries) = "
                f"{_busbw():g} GB/s",
        "dt bench collectives --collective all_reduce --world 4 -b 1MB -e 16MB   (algbw and busbw)",
        parse=_gbps),
    Question(
        "Why do benchmarks report busbw rather than algbw?",
        ("busbw can be compared with the link's speed whatever the collective and p: it counts what "
         "each rank's link carries, while algbw = S/t falls as p grows on the same link",
         "busbw includes the latency, algbw does not", "busbw is always larger, so it looks better",
         "algbw ignores the reduction"),
        lambda: "a",
        lambda: "a ring all-reduce near the link's speed shows busbw near that speed on 2 ranks or 200; "
                "its algbw would halve from 2 ranks to many",
        "dt bench collectives --collective all_reduce --world 4"),
    Question(
        f"Why is a 1 MB all-reduce slow on 8 ranks of {BANDWIDTH} links with {ALPHA} per step?",
        ("every step pays a fixed latency whatever its size, and the ring takes two laps of steps",
         "gloo compresses small messages", "a small tensor cannot be cut into chunks",
         "reducing a small tensor is slower per byte"),
        lambda: "a",
        lambda: (lambda e: f"the ring's {e.steps} steps cost {fmt_time(e.latency)}, its bytes "
                           f"{fmt_time(e.bandwidth)}: {e.latency / e.total:.0%} of the time is waiting "
                           "on steps")(_estimate("ring", "1MB")),
        f"dt model all_reduce --size 1MB,1GB --world 8 --bandwidth {BANDWIDTH} --latency {ALPHA}"),
    Question(
        f"Which all-reduce is fastest for 1 KB on 8 ranks ({BANDWIDTH}, {ALPHA} per step)?",
        _SMALL, _fastest_small,
        lambda: "; ".join(f"{a}: {fmt_time(_estimate(a, '1KB').total)}" for a in _SMALL)
                + " (dt.cost.estimate): at 1 KB the fewest steps win",
        f"dt model all_reduce --size 1KB --world 8 --bandwidth {BANDWIDTH} --latency {ALPHA}"),
)


def check(q: Question, reply: str) -> tuple[bool, str]:
    """(right?, what to tell the learner) for one reply."""
    right = q.answer()
    reply = reply.strip()
    if q.choices:
        ok = reply.lower()[:1] == right
        shown = f"{right}) {q.choices['abcd'.index(right)]}"
        return ok, ("right: " if ok else f"not quite: the answer is {shown}. ") + q.why()
    try:
        got = q.parse(reply)
    except ValueError:
        return False, f"not a number ({reply!r}); the answer is {_fmt(right)}: {q.why()}"
    ok = abs(got - right) <= 0.01 * abs(right)
    return ok, ("right: " if ok else f"not quite ({_fmt(got)}); the answer is {_fmt(right)}: ") + q.why()


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dt quiz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", help="comma-separated answers, in order (else asked one by one)")
    args = parser.parse_args(argv)
    given = args.answers.split(",") if args.answers is not None else None
    interactive = given is None and sys.stdin.isatty()
    score = 0
    for i, q in enumerate(QUESTIONS, 1):
        print(f"\n{i}/{len(QUESTIONS)}. {q.prompt}")
        for letter, choice in zip("abcd", q.choices):
            print(f"   {letter}) {choice}")
        if given is not None:
            reply = given[i - 1] if i <= len(given) else ""
        elif interactive:
            try:
                reply = input("your answer: ")
            except EOFError:
                reply = ""
        else:
            reply = sys.stdin.readline().rstrip("\n")
        if not interactive:
            print(f"your answer: {reply}")
        ok, message = check(q, reply) if reply.strip() else (False, "no answer; " + check(q, "?")[1])
        score += ok
        print(f"   {message}\n   see it: {q.see}")
    print(f"\nscore: {score}/{len(QUESTIONS)}")
    return 0 if score == len(QUESTIONS) else 1
