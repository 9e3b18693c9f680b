"""`dt`: one entry point, one module per command.

    dt demo primitives        what each rank holds after each collective
    dt bench <name> [...]     dt/bench/<name>: collectives, ddp, scaling, idle
    dt tune [...]             measure this machine's alpha, beta, gamma (dt/tools/tune.py)
    dt model [...]            what-if calculator on the cost model (dt/tools/whatif.py)
    dt train [...]            train the small GPT on a dp x tp x pp mesh (dt/train)
    dt cluster up|down|list   a simulated cluster: hosts as network namespaces (dt/tools/cluster.py)
    dt selftest [--gpu]       smoke test of every layer on this machine's devices
    dt judge FILE [...]       judge a collective you wrote from send/recv (dt/learn/judge)
    dt exercises [...]        list / start / hint / solution: the exercises (dt/learn/exercises)
    dt quiz [...]             the self-test (dt/learn/quiz.py)

Each command's module has `main(argv) -> int`; this file only routes, and
ends every command the same way when a run fails or is stopped
(dt.launcher.run_command: the launcher's report, or one line; never a
traceback). Bad options and bad DT_TIMEOUT / DT_VALIDATE values are refused by
each command's parser (dt.args), in one line, with exit status 2.
"""

from __future__ import annotations

import importlib
import sys

from dt.launcher import run_command

COMMANDS = {
    "demo": "dt.tools.demo",
    "tune": "dt.tools.tune",
    "model": "dt.tools.whatif",
    "train": "dt.train",
    "cluster": "dt.tools.cluster",
    "selftest": "dt.tools.selftest",
    "judge": "dt.learn.judge",
    "exercises": "dt.learn.exercises.command",
    "quiz": "dt.learn.quiz",
}

BENCHES = {
    "collectives": "dt.bench.collectives",
    "ddp": "dt.bench.ddp",
    "scaling": "dt.bench.scaling",
    "idle": "dt.bench.idle",
}


def _run_bench(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHES:
        print(f"usage: dt bench {{{','.join(BENCHES)}}} [options]")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(BENCHES[argv[0]])
    return run_command(f"dt bench {argv[0]}", module.main, argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        return _run_bench(rest)
    if command not in COMMANDS:
        print(f"dt: unknown command {command!r}; one of: bench, {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command])
    return run_command(f"dt {command}", module.main, rest)


if __name__ == "__main__":
    sys.exit(main())
