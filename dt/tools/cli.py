"""`dt`: one entry point, one module per command; this file only routes.

Each command's module has `main(argv) -> int`. Every command ends the same
way when a run fails or is stopped (dt.launcher.run_command: the launcher's
report, or one line; never a traceback). Bad options and bad DT_* values are
refused by each command's parser (dt.args), in one line, with exit status 2;
a world the library refuses later (dt.args.InputError, e.g. more processes
than this host holds) ends the same way here.

`dt` alone follows argparse's convention for a missing argument: the help on
stderr, exit status 2. `dt --help` prints it on stdout, exit status 0.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable

from dt.args import ENVIRONMENT, InputError
from dt.launcher import run_command

__all__ = ["BENCHES", "COMMANDS", "help_text", "main", "version"]

DISTRIBUTION = "dt-sendrecv"  # pyproject.toml's project name

# command: (module, what follows it, what it does)
COMMANDS = {
    "demo": ("dt.tools.demo", "primitives", "what each rank holds after each collective"),
    "bench": ("", "NAME", "benchmarks: " + ", ".join(("collectives", "ddp", "scaling", "idle"))),
    "tune": ("dt.tools.tune", "", "measure this machine's latency, bandwidth and reduction speed"),
    "model": ("dt.tools.whatif", "COLLECTIVE", "what-if calculator on the cost model"),
    "train": ("dt.train", "", "train the small GPT on a dp x cp x ep x tp x pp mesh"),
    "sample": ("dt.train.sample", "", "generate text from a dt train checkpoint"),
    "plan": ("dt.plan.cli", "", "predict every layout's step time and memory, ranked; --check runs them"),
    "cluster": ("dt.tools.cluster", "up|down|list", "a simulated cluster: hosts as network namespaces"),
    "selftest": ("dt.tools.selftest", "", "smoke test of every layer on this machine's devices"),
    "records": ("dt.tools.records", "[DIR]", "the runs kept by --record (benchmarks/), the results table"),
    "judge": ("dt.learn.judge", "FILE", "judge a collective you wrote from send/recv"),
    "exercises": ("dt.learn.exercises.command", "ACTION [NAME]",
                  "the exercises: list, show, start, hint, solution"),
    "quiz": ("dt.learn.quiz", "", "the self-test"),
}

BENCHES = {
    "collectives": "dt.bench.collectives",
    "ddp": "dt.bench.ddp",
    "scaling": "dt.bench.scaling",
    "idle": "dt.bench.idle",
}


def version() -> str:
    """dt's version (the installed distribution's) and torch's."""
    try:
        ours = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        import dt

        ours = f"{dt.__version__} (not installed)"
    import torch

    return f"dt {ours}, torch {torch.__version__}"


def help_text() -> str:
    commands = [f"  {f'{name} {follows}'.strip():<24} {what}" for name, (_, follows, what)
                in COMMANDS.items()]
    variables = [f"  {name:<24} {var.meaning}" for name, var in sorted(ENVIRONMENT.items())]
    return "\n".join([
        "usage: dt COMMAND [options]        dt COMMAND --help: that command's options",
        "",
        "Distributed training from point-to-point send/recv: every collective, the parallelisms,",
        "what each costs, and exercises to write them yourself.",
        "",
        "commands:",
        *commands,
        "",
        "environment (checked before any process starts; a bad value is refused in one line):",
        *variables,
        "",
        "options:",
        "  -h, --help               this text",
        "  --version                dt's version and torch's",
        "",
        "more: README.md (quick start, what each command prints, the layout of the code)",
    ])


def _run_bench(argv: list[str]) -> int:
    usage = f"usage: dt bench {{{','.join(BENCHES)}}} [options]   (dt bench NAME --help)"
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if not argv or argv[0] not in BENCHES:
        said = f"unknown bench {argv[0]!r}" if argv else "which bench?"
        print(f"dt bench: error: {said}: one of {', '.join(BENCHES)} (see dt bench --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[argv[0]])
    return _run(f"dt bench {argv[0]}", module.main, argv[1:])


def _run(prog: str, command_main: Callable[[list[str]], int | None], argv: list[str]) -> int:
    try:
        return run_command(prog, command_main, argv)
    except InputError as exc:  # refused by the library before anything started
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(help_text(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(help_text())
        return 0
    if argv[0] == "--version":
        print(version())
        return 0
    command, rest = argv[0], argv[1:]
    if command == "bench":
        return _run_bench(rest)
    if command not in COMMANDS:
        print(f"dt: error: unknown command {command!r}: one of {', '.join(COMMANDS)} (see dt --help)",
              file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return _run(f"dt {command}", module.main, rest)


if __name__ == "__main__":
    sys.exit(main())
