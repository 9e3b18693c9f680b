"""`dt`: one entry point, one module per command.

    dt demo primitives        what each rank holds after each collective
    dt bench <name> [...]     bench/<name>.py: collectives, ddp, pipeline, scaling
    dt tune [...]             measure this machine's alpha, beta, gamma (dt/tune.py)
    dt model [...]            what-if calculator on the cost model (dt/whatif.py)
    dt train [...]            train the small GPT on a dp x tp x pp mesh (dt/train.py)

Each command's module has `main(argv) -> int`; this file only routes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

COMMANDS = {
    "demo": "dt.demo",
    "tune": "dt.tune",
    "model": "dt.whatif",
    "train": "dt.train",
}

BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def _bench_names() -> list[str]:
    if not BENCH_DIR.is_dir():
        return []
    return sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_"))


def _run_bench(argv: list[str]) -> int:
    names = _bench_names()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names:
        print(f"usage: dt bench {{{','.join(names)}}} [options]   (bench/ of a source checkout)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if str(BENCH_DIR.parent) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR.parent))
    module = importlib.import_module(f"bench.{argv[0]}")
    return int(module.main(argv[1:]) or 0)


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
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
