"""`dt exercises`: list them, start one, ask for a hint, see the reference once you have passed.

    dt exercises list
    dt exercises show NAME            statement, cost to reach, how to see the idea
    dt exercises start NAME           write NAME.py here (the skeleton, statement on top)
    dt exercises hint NAME [--all]    the next hint (remembered in .dt-learn.json)
    dt exercises solution NAME        after `dt judge NAME.py` passed here, or with --give-up
                                      (NAME.py, or a file starting `# dt exercise: NAME`)
"""

from __future__ import annotations

import argparse
import os
import sys

from dt import args as args_
from dt.learn.exercises import EXERCISES, all_exercises, cost_lines, find, starter, state, unlock_rule

__all__ = ["main"]


def _list() -> int:
    done = state.load()["passed"]
    print(f"  {'exercise':<30} {'judged as':<16} {'bytes held to':<20} title")
    for ex in all_exercises():
        mark = "passed " if ex.name in done else ""
        judged = ex.collective or "numbers"
        print(f"  {ex.name:<30} {judged:<16} {ex.target or '-':<20} {mark}{ex.title}")
    print("\nstart one: dt exercises start NAME   (then: dt judge NAME.py)")
    return 0


def _show(name: str) -> int:
    ex = find(name)
    print(f"{ex.title}\n\n{ex.statement}\n")
    for line in cost_lines(ex):
        print(line)
    if ex.see:
        print(f"\nsee the idea: {ex.see}")
    return 0


def _start(name: str, to: str | None, force: bool) -> int:
    ex = find(name)
    path = to or f"{ex.name}.py"
    if os.path.exists(path) and not force:
        print(f"dt exercises: {path} exists; judge it (dt judge {path}) or pass --force to start over",
              file=sys.stderr)
        return 2
    with open(path, "w", encoding="utf-8") as f:
        f.write(starter(ex))
    print(f"wrote {path}: {ex.title}\n\n{ex.statement}\n")
    for line in cost_lines(ex):
        print(line)
    print(f"\nnext: edit {path}, then: dt judge {path}")
    return 0


def _hint(name: str, every: bool) -> int:
    ex = find(name)
    data = state.load()
    shown = len(ex.hints) if every else min(data["hints"].get(name, 0) + 1, len(ex.hints))
    data["hints"][name] = max(shown, data["hints"].get(name, 0))
    state.save(data)
    for i, hint in enumerate(ex.hints[:shown], 1):
        print(f"hint {i}/{len(ex.hints)}: {hint}")
    if shown < len(ex.hints):
        print(f"\n(`dt exercises hint {name}` again for the next)")
    return 0


def _solution(name: str, give_up: bool) -> int:
    ex = find(name)
    data = state.load()
    if name not in data["passed"] and not give_up:
        print(f"dt exercises: the reference for {name} opens once {unlock_rule(name)} "
              f"(or: dt exercises solution {name} --give-up)", file=sys.stderr)
        return 1
    if name not in data["passed"]:
        data["gave_up"][name] = True
        state.save(data)
    print(ex.solution, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = args_.Parser(prog="dt exercises", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list")
    for action in ("show", "start", "hint", "solution"):
        p = sub.add_parser(action)
        p.add_argument("name", choices=EXERCISES, metavar="NAME")
        if action == "start":
            p.add_argument("--to", help="file to write (default: NAME.py here)")
            p.add_argument("--force", action="store_true", help="overwrite it")
        if action == "hint":
            p.add_argument("--all", action="store_true", help="every hint at once")
        if action == "solution":
            p.add_argument("--give-up", action="store_true", help="show it without a passing judge")
    args = parser.parse_args(argv)
    if args.action == "list":
        return _list()
    if args.action == "show":
        return _show(args.name)
    if args.action == "start":
        return _start(args.name, args.to, args.force)
    if args.action == "hint":
        return _hint(args.name, args.all)
    return _solution(args.name, args.give_up)
