"""`dt judge FILE`: judge a collective you wrote, from the command line.

    dt judge ring.py                                 the function named like a collective in it
    dt judge ring.py --collective all_reduce --worlds 2,5 --sizes 33
    dt judge ring.py --cases AVG,subgroup            only the cases named so
    dt judge ring.py --target recursive_doubling     hold the bytes to another dt.cost figure
    dt judge ring.py --bench                         busbw against dt's algorithm and torch's
    dt judge ring.py --json report.json              for graders (- for stdout)
    dt judge ring_all_reduce.py                      a file from `dt exercises start` says what it is

Exit status: 0 when every case passes, 1 when any fails, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
from typing import Any

from dt import args as args_
from dt.learn import exercises
from dt.learn.exercises import state
from dt.learn.judge.bench import DEFAULT_SIZES, bench
from dt.learn.judge.cases import JudgeCase
from dt.learn.judge.judge import DEFAULT_WORLDS, Report, judge, signature_of
from dt.learn.judge.report import LABELS, as_json, text
from dt.learn.judge.runner import Runner
from dt.learn.judge.specs import SPECS

__all__ = ["main"]


def _parser() -> args_.Parser:
    p = args_.Parser(prog="dt judge", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a Python file defining the collective, with torch's signature")
    p.add_argument("--collective", choices=sorted(SPECS), help="what it implements (default: guessed)")
    p.add_argument("--function", help="the function's name (default: the collective's)")
    # every world is started here, one pool each: each is held to what this host holds (dt.args.world)
    p.add_argument("--worlds", type=args_.listed(args_.world), default=tuple(DEFAULT_WORLDS),
                   help="world sizes: 1,2,3,5,8")
    p.add_argument("--sizes", type=args_.listed(args_.at_least(0)), default=None,
                   help="judge only these lengths (float32 SUM), e.g. 0,33: a quick look")
    p.add_argument("--cases", type=args_.listed(args_.text_value),
                   help="only the cases whose name contains one of these: AVG,subgroup")
    p.add_argument("--target", help="the dt.cost algorithm the bytes are held to "
                                    "(default: the bandwidth-optimal one, or the exercise's)")
    p.add_argument("--timeout", type=args_.seconds, default=10.0,
                   help="seconds one wait on a message may take before it is a deadlock (10)")
    p.add_argument("--keep-going", action="store_true",
                   help="after a deadlock, crash or hang, run the world's remaining cases anyway")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON (- for stdout)")
    p.add_argument("--bench", action="store_true", help="time it against dt's algorithm and torch's")
    p.add_argument("--bench-world", type=args_.world, default=4, help="ranks for --bench (4)")
    p.add_argument("--bench-sizes", type=args_.listed(args_.size), default=tuple(DEFAULT_SIZES),
                   help="bytes, e.g. 4KiB,256KiB,4MiB")
    p.add_argument("--reps", type=args_.at_least(1), default=10, help="timed calls per size (--bench)")
    return p


def _guess(path: str) -> str | None:
    found = [name for name in SPECS if signature_of(path, name)[0] is not None]
    return found[0] if len(found) == 1 else None


def _numeric(path: str, ex: exercises.Exercise, as_json_to: str | None) -> int:
    try:
        values = runpy.run_path(path)
    except Exception as exc:  # noqa: BLE001 - the learner's file; say what it raised
        print(f"dt judge: running {path} raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    answers = ex.check(values)
    passed = all(ok for _, ok, _ in answers)
    if as_json_to:
        _write_json({"file": os.path.abspath(path), "exercise": ex.name, "passed": passed,
                     "answers": [{"name": n, "passed": ok, "message": m} for n, ok, m in answers]},
                    as_json_to)
    if as_json_to != "-":
        print(f"dt judge: {ex.title}\n")
        for name, ok, message in answers:
            print(f"  {'ok   ' if ok else 'WRONG'} {name}: {message}")
        print(f"\nthe same numbers: {ex.see}\n\n{'PASS' if passed else 'FAIL'}")
    if passed:
        state.record_pass(ex.name, path)
    return 0 if passed else 1


def _write_json(data: dict[str, Any], to: str) -> None:
    body = json.dumps(data, indent=2, default=str)
    if to == "-":
        print(body)
    else:
        with open(to, "w", encoding="utf-8") as f:
            f.write(body + "\n")


def _run(args: argparse.Namespace, collective: str, function: str | None, target: str | None,
         live: bool) -> Report:
    def progress(result: Any) -> None:
        if live:
            print(f"\r  p={result.world}: {result.case.name:<30} {LABELS[result.verdict.kind]:<10}",
                  end="", flush=True, file=sys.stderr)

    with Runner(args.timeout) as runner:
        report = judge(args.file, collective, function=function, worlds=list(args.worlds),
                       sizes=None if args.sizes is None else list(args.sizes),
                       algorithm=target, timeout=args.timeout, keep_going=args.keep_going, runner=runner,
                       only=None if args.cases is None else list(args.cases), progress=progress)
        if live:
            print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
        if args.bench:
            if report.passed and collective != "sync_gradients":
                report.bench = bench(runner, collective, report.file, report.function, report.algorithm,
                                     args.bench_world, args.bench_sizes, args.reps)
            else:
                report.bench = {"error": "not run: the judge benchmarks collectives that pass every case"}
    return report


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not os.path.isfile(args.file):
        print(f"dt judge: no such file: {args.file}", file=sys.stderr)
        return 2
    ex = exercises.find(name) if (name := exercises.marker(args.file)) else None
    if ex is not None and ex.check is not None:
        return _numeric(args.file, ex, args.json)
    collective = args.collective or (ex.collective if ex else None) or _guess(args.file)
    if collective is None:
        print(f"dt judge: which collective does {args.file} implement? Say --collective "
              f"({', '.join(sorted(SPECS))})", file=sys.stderr)
        return 2
    function = args.function or (ex.function if ex and ex.collective == collective else None)
    target = args.target or (ex.target if ex and ex.collective == collective else None)
    if target is not None:
        try:
            SPECS[collective].target(JudgeCase("check", 4, params=((4,),), bucket_bytes=4), 2, 0, target)
        except KeyError:
            print(f"dt judge: dt.cost has no {collective} {target!r} to hold the bytes to",
                  file=sys.stderr)
            return 2
    quiet = args.json == "-"
    # A terminated judge still ends its processes: SIGTERM unwinds through Runner's `with`.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = _run(args, collective, function, target, live=not quiet and sys.stderr.isatty())
    finally:
        signal.signal(signal.SIGTERM, previous)
    report.exercise = ex.name if ex else None
    if args.json:
        _write_json(as_json(report), args.json)
    if not quiet:
        print(text(report))
    full = args.sizes is None and args.cases is None and set(DEFAULT_WORLDS) <= set(args.worlds)
    if report.passed and ex is not None and full:
        state.record_pass(ex.name, args.file)
        if not quiet:
            print(f"\nexercise {ex.name} passed: `dt exercises solution {ex.name}` shows the reference")
    return 0 if report.passed else 1
