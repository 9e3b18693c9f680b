"""`dt judge`: run a collective you wrote on the shapes that break naive code, and say what is wrong.

- cases.py       the shapes: world sizes, lengths, dtypes, ops, uneven lists, roots, a subgroup
- specs.py       each collective: torch's signature, a case's arguments, torch's result, dt.cost's figure
- instrument.py  inside each rank: counted point-to-point, bounded waits, collectives forbidden
- worker.py      one case on one rank: reference, the learner's call, the comparison
- runner.py      the judge's own processes: timeouts, restarts, none left behind
- compare.py     the first element that differs from torch's, and a guess at why
- verdict.py     every rank's result and log -> one verdict that names ranks, messages, lines
- judge.py       every case on every world: `judge(path, collective) -> Report`
- report.py      the table for the terminal, JSON for graders
- bench.py       --bench: busbw against dt's algorithm and torch's
- command.py     the `dt judge` command line
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from dt.learn.judge.command import main as run

    return run(argv)
