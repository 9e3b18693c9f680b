"""The study's outputs: results/scaling.md, results/scaling.json, and the README's section.

Every table travels with the machine it was measured on and the notes that
say how the run differs from the original design (StudySettings.shrinkage); a
measurement that failed is listed, and its rows are missing, not invented.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from dt.bench import report as R
from dt.bench.scaling.study import Study
from dt.bench.scaling.tables import TABLES

__all__ = ["COMMAND", "command_line", "fmt_duration", "headline", "report_markdown", "write_outputs"]

COMMAND = "python -m dt.bench.scaling"  # = `dt bench scaling`
VALIDATION_NOTE = "validation off while timing (dt.transport.set_validation(False))"


def fmt_duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} minutes"


def command_line(argv: Sequence[str]) -> str:
    """The command that reproduces this run, as the report and the README quote it."""
    return COMMAND + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))


def headline(st: Study) -> str:
    """The study in one line (its record's headline): table 1's ring at the largest world, on each wire,
    beside gloo's all-reduce on the same processes; else which tables were built."""
    t1 = st.tables.get(1)
    if t1 is None or not t1.data:
        built = ", ".join(map(str, st.tables)) or "none"
        return f"tables built: {built}; {len(st.failures)} measurement(s) failed"
    world = max(d["world"] for d in t1.data)
    found = [d for d in t1.data if d["world"] == world]
    on_wires = []
    for d in found:
        ring = d["ring_time"].median
        gloo = f" ({ring / d['gloo_time'].median:.2f}x gloo's time)" if d["gloo_time"] else ""
        on_wires.append(f"{R.fmt_time(ring)} on {d['wire']}{gloo}")
    return f"ring all-reduce {R.fmt_bytes(found[0]['nbytes'])} world {world}: {', '.join(on_wires)}"


def report_markdown(st: Study, command: str, elapsed: float, for_readme: bool = False) -> str:
    m = st.machine
    head = [] if for_readme else ["# dt scaling study", ""]
    head += [f"Produced by `{command}` in {fmt_duration(elapsed)} on {R.machine_line(m)}.", ""]
    notes = list(st.s.shrinkage())
    notes.append("Cross-rank argument validation was off while timing "
                 "(dt.transport.set_validation(False)).")
    over = [w for w in st.s.worlds_used() if w > m["cores"]]
    if over:
        notes.append(f"World sizes {', '.join(map(str, over))} exceed the {m['cores']} cores: those "
                     "runs compete with themselves (oversubscribed).")
    notes += [f"FAILED (its rows are missing): {f}" for f in st.failures]
    head += [f"- {n}" for n in notes] + [""]
    tables = []
    for i, t in sorted(st.tables.items()):
        view = TABLES[i].readme if for_readme and i in TABLES else None
        tables.append(view(st, t) if view is not None else t)
    body = [t.markdown() for t in tables]
    if for_readme:
        body.append(f"Plots (time and bytes vs world size, busbw vs message size, efficiency vs "
                    f"batch, the breakdown, the bubble) and the full JSON are written to "
                    f"`{st.s.out_dir}/` by the same command.")
    return "\n".join(head) + "\n" + "\n\n".join(body) + "\n"


def write_outputs(st: Study, out_dir: Path, command: str, elapsed: float) -> list[Path]:
    """scaling.json (every figure, unformatted) and scaling.md (the tables) in out_dir."""
    payload = {
        "command": command,
        "machine": st.machine,
        "elapsed_s": elapsed,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(st.s).items()},
        "notes": st.s.shrinkage() + [VALIDATION_NOTE],
        "failures": st.failures,
        "seconds_per_measurement": st.unit_seconds,
        "tables": {str(i): {"title": t.title, "headers": t.headers, "rows": t.rows, "notes": t.notes,
                            "data": t.data, "machine": st.machine, **t.extra}
                   for i, t in sorted(st.tables.items())},
    }
    return [R.write_json(out_dir / "scaling.json", payload),
            R.write_text(out_dir / "scaling.md", report_markdown(st, command, elapsed))]
