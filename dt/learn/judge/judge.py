"""Judge a learner's collective: every case on every world size, one verdict each.

    report = judge("ring.py", "all_reduce", worlds=(1, 2, 3, 5, 8))
    report.passed, report.results[0].verdict.kind

Worlds run smallest first, cases in the order cases.py lists them. A case
that crashes, hangs or deadlocks ends its world (the rest are skipped,
unless `keep_going`); a file that does not import ends everything. The
processes are the judge's own (runner.py): every one of them is gone when
`judge` returns, whatever the learner's code did.
"""

from __future__ import annotations

import ast
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dt.learn.judge.cases import JudgeCase, cases_for, members
from dt.learn.judge.runner import Runner
from dt.learn.judge.specs import SPECS
from dt.learn.judge.verdict import FATAL, Context, Verdict, decide
from dt.learn.judge.worker import Job, judge_case

__all__ = ["DEFAULT_WORLDS", "CaseResult", "Report", "judge", "signature_of"]

DEFAULT_WORLDS = (1, 2, 3, 5, 8)


@dataclass
class CaseResult:
    world: int
    case: JudgeCase
    verdict: Verdict
    seconds: float = 0.0

    @property
    def detail(self) -> str:
        return self.case.detail(self.world)


@dataclass
class Report:
    file: str
    collective: str
    function: str
    algorithm: str
    worlds: list[int]
    results: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bench: dict[str, Any] | None = None
    exercise: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.verdict.passed for r in self.results)


def signature_of(path: str, function: str) -> tuple[list[str] | None, str | None]:
    """(parameter names of `function` in the file, None), read without running it, or (None, why not)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror}"
    except SyntaxError as exc:
        return None, f"{os.path.basename(path)}:{exc.lineno}: SyntaxError: {exc.msg}"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            return names + (["**"] if a.kwarg else []), None
    for node in tree.body:  # all_reduce = make(...), from mine import all_reduce: the import will tell
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == function for t in node.targets):
            return ["**"], None
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == function for a in node.names):
            return ["**"], None
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    return None, (f"{os.path.basename(path)} defines no function {function}() "
                  f"(it defines: {', '.join(defined) or 'no functions'})")


def _usable(cases: list[JudgeCase], params: list[str],
            spec_takes_op: bool) -> tuple[list[JudgeCase], list[str]]:
    notes, keep = [], cases
    anything = "**" in params
    if spec_takes_op and "op" not in params and not anything:
        keep = [c for c in keep if c.op == "SUM"]
        notes.append("your function takes no `op`: judged on ReduceOp.SUM only "
                     "(add op=ReduceOp.SUM to be judged on AVG, PRODUCT, MIN, MAX)")
    if "group" not in params and not anything:
        keep = [c for c in keep if not c.subgroup]
        notes.append("your function takes no `group`: the subgroup case is left out "
                     "(add group=None, and name peers by group rank)")
    return keep, notes


def judge(path: str, collective: str, *, function: str | None = None,
          worlds: tuple[int, ...] | list[int] = DEFAULT_WORLDS, sizes: list[int] | None = None,
          algorithm: str | None = None, timeout: float | None = None, keep_going: bool = False,
          runner: Runner | None = None, only: list[str] | None = None,
          progress: Callable[[CaseResult], None] | None = None) -> Report:
    """Run `function` (default: the collective's name) from `path` on every case; see the module doc.

    `sizes` keeps only float32 SUM cases of those lengths; `only` keeps the cases whose
    name contains one of its strings ("AVG", "subgroup"). `timeout` bounds one wait on a
    message (default: the runner's, 10 s).
    """
    spec = SPECS[collective]
    path = os.path.abspath(path)
    function = function or collective
    report = Report(path, collective, function, algorithm or spec.optimal, sorted(set(worlds)))
    t0 = time.perf_counter()
    params, problem = signature_of(path, function)
    if params is None:
        report.results.append(CaseResult(0, JudgeCase("import"), Verdict("import", problem or "")))
        return report
    own = runner is None
    runner = runner or Runner(timeout or 10.0)
    timeout = timeout or runner.timeout
    try:
        for world in report.worlds:
            cases, notes = _usable(cases_for(collective, world, sizes), params, spec.takes_op)
            if only:
                cases = [c for c in cases if any(o in c.name for o in only)]
            report.notes += [n for n in notes if n not in report.notes]
            stop = None
            for case in cases:
                if stop is not None:
                    result = CaseResult(world, case, Verdict("skipped", stop))
                else:
                    result = _one(runner, spec.name, path, function, case, world, report.algorithm,
                                  timeout)
                    if result.verdict.kind == "import":
                        report.results.append(result)
                        return report
                    if result.verdict.kind in FATAL and not keep_going:
                        stop = (f"not run after the {result.verdict.kind} in case '{case.name}' "
                                "(--keep-going runs them)")
                report.results.append(result)
                if progress:
                    progress(result)
    finally:
        if own:
            runner.close()
        report.seconds = time.perf_counter() - t0
    return report


def _one(runner: Runner, spec: str, path: str, function: str, case: JudgeCase, world: int, algorithm: str,
         timeout: float) -> CaseResult:
    t0 = time.perf_counter()
    hang_after = max(runner.hang_after, timeout)
    job = Job(spec, path, function, case, timeout, hang_after, runner.logdir, SPECS[spec].allow_dt)
    results, failure = runner.run(world, judge_case, job, hang_after=hang_after)
    ctx = Context(SPECS[spec], case, world, algorithm, timeout, hang_after, function, os.path.basename(path))
    verdict = decide(ctx, results, failure, runner.logs(world))
    # A connection that timed out, or still carries a message, is not reused: new processes.
    # (A raise before any message, or after every message completed, leaves it clean.)
    group = members(case, world)
    if failure is not None or any(results[r]["status"] not in ("ok", "raised", "forbidden")
                                  or results[r].get("open") for r in group):
        runner.restart(world)
    return CaseResult(world, case, verdict, time.perf_counter() - t0)
