"""The judge's report: a table for the terminal, JSON for graders.

The table has one row per case and one column per world size, a cell per
verdict; below it, what is wrong in each failing case (once per case and
kind, with the other worlds it happened on), the busiest rank's traffic
against dt.cost's figure, the benchmark if one ran, and a one-line summary.
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

from dt import cost
from dt.learn.judge.judge import CaseResult, Report
from dt.units import fmt_bytes, fmt_time, plural

__all__ = ["LABELS", "as_json", "target_text", "text"]

LABELS = {"ok": "ok", "wrong": "WRONG", "traffic": "TRAFFIC", "deadlock": "DEADLOCK", "crash": "CRASH",
          "hang": "HANG", "error": "ERROR", "unmatched": "UNMATCHED", "forbidden": "FORBIDDEN",
          "import": "IMPORT", "skipped": "skip"}


def target_text(collective: str, algorithm: str) -> str:
    """The dt.cost figure the bytes are held to, in the words of its docstring."""
    base = "all_reduce" if collective == "sync_gradients" else collective
    fn = getattr(cost, f"{cost.canonical(base, algorithm)}_{base}", None)
    doc = inspect.getdoc(fn) or ""
    lines = [ln.strip() for ln in doc.splitlines() if ln.strip()]
    line = next((ln for ln in lines if ln.startswith("Bytes per rank")), lines[0] if lines else "")
    where = f"dt.cost.{fn.__name__}" if fn else "dt.cost.traffic_for"
    per = ", bucket by bucket (buckets as dt.parallel.data_parallel.make_buckets forms them)" \
        if collective == "sync_gradients" else ""
    return f"the {algorithm} algorithm's figure{per}, {where}: \"{line}\""


def _rows(report: Report) -> list[str]:
    names: list[str] = []  # in the order the largest world (which has every row) ran them
    for r in sorted(report.results, key=lambda r: -r.world):
        if r.case.name not in names:
            names.append(r.case.name)
    cell = {(r.case.name, r.world): LABELS[r.verdict.kind] for r in report.results}
    width = max([len(n) for n in names] + [4])
    head = f"  {'case':<{width}}" + "".join(f"{f'p={w}':>11}" for w in report.worlds)
    out = [head]
    for n in names:
        out.append(f"  {n:<{width}}" + "".join(f"{cell.get((n, w), '-'):>11}" for w in report.worlds))
    return out


def _failures(report: Report, most: int = 8) -> list[str]:
    """What is wrong, once per distinct message, with the cases and worlds it came from."""
    groups: dict[tuple[str, str], list[CaseResult]] = {}
    for r in report.results:
        if r.verdict.kind not in ("ok", "skipped"):
            groups.setdefault((r.verdict.kind, r.verdict.message), []).append(r)
    out = []
    for (kind, message), rs in list(groups.items())[:most]:
        names = list(dict.fromkeys(r.case.name for r in rs))
        worlds = sorted({r.world for r in rs})
        cases = names[0] if len(names) == 1 else f"{len(names)} cases ({', '.join(names[:4])}" + \
            (", ...)" if len(names) > 4 else ")")
        detail = f" [{rs[0].detail}]" if len(names) == 1 else ""
        out.append(f"  {LABELS[kind]} in {cases}{detail}, p={', '.join(map(str, worlds))}:")
        out += [f"    {line}" for line in message.splitlines()]
    if len(groups) > most:
        out.append(f"  ... and {len(groups) - most} more (--json has every case)")
    skipped = [r for r in report.results if r.verdict.kind == "skipped"]
    if skipped:
        worlds = sorted({r.world for r in skipped})
        out.append(f"  {len(skipped)} cases skipped at p={', '.join(map(str, worlds))}: "
                   f"{skipped[0].verdict.message}")
    noted: dict[str, list[CaseResult]] = {}
    for r in report.results:
        for n in r.verdict.notes:
            noted.setdefault(n.split(" (")[0], []).append(r)
    for rs in noted.values():  # one line per kind of note, with its first example
        first = rs[0]
        more = f" (in {len(rs)} cases; the first: {first.case.name} at p={first.world})" if len(rs) > 1 else \
            f" ({first.case.name} at p={first.world})"
        out.append(f"  note{more}: {first.verdict.notes[0]}")
    return out


def _traffic(report: Report) -> list[str]:
    measured = [r for r in report.results if r.verdict.traffic]
    if not measured:
        return []
    pick = next((r.case.name for r in measured if "1031" in r.case.name),
                max(measured, key=lambda r: r.verdict.traffic["target_busiest"]).case.name)
    rows = [r for r in measured if r.case.name == pick]
    out = [f"traffic in case '{pick}' (float32): the busiest rank's bytes and messages sent, "
           "measured (dt.cost's figure)"]
    for r in rows:
        t = r.verdict.traffic
        g = max(t["bytes_sent"], key=lambda k: t["bytes_sent"][k])
        figure = f"({t['target_busiest']:,})"
        out.append(f"  p={r.world:<3} {t['busiest']:>10,} B {figure:<12} {t['messages_sent'][g]:>4} messages "
                   f"({max(t['target_messages_sent'].values())})")
    return out


def _bench(bench: dict[str, Any]) -> list[str]:
    if bench.get("error"):
        return [f"bench: {bench['error']}"]
    who = bench["who"]
    out = [f"bench: {bench['collective']} on {plural(bench['world'], 'process')}, median of {bench['reps']} "
           "interleaved calls (a call's time is its slowest rank's); busbw = algbw x "
           "dt.cost.BUSBW_FACTOR",
           "  " + f"{'size':>10}" + "".join(f"{w:>24}" for w in who) + f"{'yours/torch':>13}"]
    for row in bench["rows"]:
        cells = "".join(f"{fmt_time(row[w]['seconds']):>11} {fmt_bytes(row[w]['busbw']) + '/s':>12}"
                        for w in who)
        ratio = row["yours"]["seconds"] / row["torch"]["seconds"]
        wrong = "  (yours differs from torch's here!)" if row.get("wrong") else ""
        out.append(f"  {fmt_bytes(row['bytes']):>10}{cells}{ratio:>12.2f}x{wrong}")
    out.append("  (time and busbw; on a shared machine only ratios within one run mean anything)")
    return out


def text(report: Report) -> str:
    name = report.file.rsplit("/", 1)[-1]
    head = [f"dt judge: {report.function}() in {name}, judged as {report.collective} "
            f"on p = {', '.join(map(str, report.worlds))}",
            f"  right means: equal to torch.distributed's {report.collective} on the same inputs"
            if report.collective != "sync_gradients" else
            "  right means: every .grad equal to torch's all_reduce(AVG) of it",
            f"  bytes held to {target_text(report.collective, report.algorithm)}"]
    head += [f"  note: {n}" for n in report.notes]
    if report.results and report.results[0].verdict.kind == "import":
        return "\n".join(head + ["", f"IMPORT: {report.results[0].verdict.message}", "", "FAIL"])
    if not report.results:
        return "\n".join(head + ["", "no case to judge: check --worlds, --sizes and --cases", "", "FAIL"])
    out = head + [""] + _rows(report)
    failures = _failures(report)
    if failures:
        out += ["", "what is wrong:" if not report.passed else "notes:"] + failures
    traffic = _traffic(report)
    if traffic:
        out += [""] + traffic
    if report.bench:
        out += [""] + _bench(report.bench)
    counts = Counter(r.verdict.kind for r in report.results)
    summary = ", ".join(f"{counts[k]} {k}" for k in LABELS if counts[k])
    out += ["", f"{len(report.results)} cases in {report.seconds:.1f}s: {summary}",
            "PASS" if report.passed else "FAIL"]
    return "\n".join(out)


def as_json(report: Report) -> dict[str, Any]:
    counts = Counter(r.verdict.kind for r in report.results)
    return {
        "file": report.file, "collective": report.collective, "function": report.function,
        "algorithm": report.algorithm, "worlds": report.worlds, "exercise": report.exercise,
        "passed": report.passed, "summary": dict(counts), "notes": report.notes,
        "seconds": round(report.seconds, 3),
        "cases": [{"world": r.world, "case": r.case.name, "detail": r.detail, "verdict": r.verdict.kind,
                   "message": r.verdict.message, "notes": r.verdict.notes, "traffic": r.verdict.traffic}
                  for r in report.results],
        "bench": report.bench,
    }
