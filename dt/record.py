"""A command's run kept as a dated record: what it printed, under a header saying where and when.

    dt bench collectives --world 2 --record     # benchmarks/collectives_cpu2_YYYYMMDD_all-reduce-w2.md
    dt train --dp 2 --tp 2 --record runs/       # runs/train_cpu2_YYYYMMDD_dp2-tp2.md
    python -m dt.record gpu ci gpu-out -- bash .ci/gpu   # any command (how .ci/gpu records itself)

A figure is true of one run: one commit, one machine, one load. So with
--record the command runs again as a child process, unchanged, and what it
prints (stdout and stderr, in the order a terminal shows them) goes to the
terminal and, verbatim, into the record below a header table of FIELDS:

    command   the command line as typed
    headline  the run's one figure, declared by the command (`headline`): the README's results table
    commit    `git rev-parse --short HEAD` of dt's checkout, +dirty when a tracked file changed
    machine   CPU model, cores, memory, GPUs
    versions  python, torch, dt; CUDA and NCCL when torch has them
    date      when it started, UTC
    load      the 1-minute load average at the start and at the end
    exit      the command's exit status, and how long it ran

Its name says the rest: <topic>_<hardware>_<YYYYMMDD>_<entity>.md (RECORD_NAME), the
hardware cpu2 for 2 cores, h200 for one H200, h100x8 for eight H100s, the entity what
was run (all-reduce-w2, dp2-tp2-pp2). A record is never overwritten: a later one of the
same name gets -2, -3, ... Records written by hand have the same header, REQUIRED at least.

The child learns where its headline goes from DT_RECORD_HEADLINE (a file the
parent made). It takes the variable out of its own environment, so processes
it starts in turn (dt plan --check's dt train runs) cannot write there.
dt.tools.records reads the records back and builds the README's results table.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from dt import args as args_
from dt.launcher import launched_rank

__all__ = ["DEFAULT_DIRECTORY", "FIELDS", "RECORD_NAME", "REQUIRED", "add_option", "commit", "cpu_model",
           "gpu_names", "hardware", "headline", "machine", "read_header", "record_name", "rerun",
           "run_recorded", "take_headline_file", "versions", "write_record"]

DEFAULT_DIRECTORY = "benchmarks"
FIELDS = ("command", "headline", "commit", "machine", "versions", "date", "load", "exit")
REQUIRED = ("command", "commit", "machine", "versions", "date", "load")  # of every record, by hand too
RECORD_NAME = re.compile(r"(?P<topic>[a-z0-9]+)_(?P<hardware>[a-z0-9]+)_(?P<day>\d{8})"
                         r"_(?P<entity>[a-z0-9.-]+)\.md")
HEADLINE_VARIABLE = "DT_RECORD_HEADLINE"
_WORD = re.compile(r"[a-z0-9]+")
_FIELD_ROW = re.compile(r"\| ([a-z]+) \| (.*) \|")

_headline_file: str | None = None  # this process's, taken from HEADLINE_VARIABLE (see `rerun`)


# -- the hook every recording command has ----------------------------------------------------------


def add_option(parser: argparse.ArgumentParser) -> None:
    """--record [DIR]: run again as a child and keep its output as a record in DIR."""
    parser.add_argument("--record", nargs="?", const=DEFAULT_DIRECTORY, default=None, metavar="DIR",
                        help=f"keep this run's output as a dated record in DIR (default "
                             f"{DEFAULT_DIRECTORY}/): the command, commit, machine, versions, date and "
                             "load above it")


def rerun(prog: str, argv: Sequence[str], directory: str | None, topic: str, entity: str,
          hardware_tag: str | None = None) -> int | None:
    """With --record DIR: this command run again as a child, recorded; its exit status.

    None means run here: no --record, or this process is the run being recorded
    (or a rank of torchrun's other than 0, which runs as it would unrecorded).
    `prog` is the command as `dt` routes it ("dt bench scaling"); `topic` and `entity` name the record;
    `hardware_tag` names what it is about where that is not this machine (`dt plan --published`'s
    figures are the catalogue's, the same on any machine: "catalogue").
    """
    global _headline_file
    if HEADLINE_VARIABLE in os.environ:
        _headline_file = os.environ.pop(HEADLINE_VARIABLE)
        return None
    if directory is None or launched_rank() != 0:
        return None
    words = prog.split()
    child = [sys.executable, "-m", "dt", *words[1:], *argv]
    status, path = run_recorded(child, shlex.join([*words, *argv]), topic, entity, Path(directory),
                                hardware_tag)
    print(f"record: {path}", file=sys.stderr)
    return status


def headline(text: str, to: str | None = None) -> None:
    """Declare this run's headline (one line): the record's `headline` field, when it is recorded
    (`to`: a file taken with take_headline_file, else this process's own)."""
    path = to if to is not None else _headline_file
    if path is not None:
        Path(path).write_text(" ".join(text.split()) + "\n")


def take_headline_file() -> str | None:
    """This run's headline file, taken from later `headline` calls in this process: a recorded test
    suite declares its own headline, never one of the commands its tests run in-process."""
    global _headline_file
    taken, _headline_file = _headline_file, None
    return taken


# -- running and keeping -----------------------------------------------------------------------------


def run_recorded(command: Sequence[str], shown: str, topic: str, entity: str,
                 directory: Path, hardware_tag: str | None = None) -> tuple[int, Path]:
    """Run `command`, its output to the terminal and into a record in `directory`: (exit status, path).

    SIGTERM and SIGHUP are passed on to the child, and Ctrl-C reaches it from the
    terminal, so a stopped run is recorded too, with the status it ended with.
    """
    entity = "-".join(_WORD.findall(entity.lower())) or "run"
    if not _WORD.fullmatch(topic):
        raise ValueError(f"record topic {topic!r}: lowercase letters and digits")
    fd, headline_path = tempfile.mkstemp(prefix="dt-record-", suffix=".txt")
    os.close(fd)
    try:
        started, load_start = time.time(), os.getloadavg()[0]
        env = {**os.environ, HEADLINE_VARIABLE: headline_path, "PYTHONUNBUFFERED": "1"}
        status, output = _tee(command, env)
        took, load_end = time.time() - started, os.getloadavg()[0]
        declared = Path(headline_path).read_text().strip()
    finally:
        os.unlink(headline_path)
    gpus = gpu_names()
    fields = {
        "command": f"`{shown}`",
        "headline": declared,  # none when the run ended before its command declared one
        "commit": commit(),
        "machine": machine(gpus),
        "versions": versions(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "load": f"{load_start:.2f} at the start, {load_end:.2f} at the end (1-minute average)",
        "exit": f"{status} after {took:.1f} s",
    }
    name = record_name(topic, hardware_tag or hardware(gpus, args_.cores()),
                       time.strftime("%Y%m%d", time.gmtime(started)), entity)
    return status, write_record(directory / name, fields, output)


def _tee(command: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    """Run it; every byte it prints goes to our stdout as it comes, and is kept: (status, output)."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    passed = {s: signal.signal(s, lambda sig, _frame: child.send_signal(sig))
              for s in (signal.SIGTERM, signal.SIGHUP)}
    # Ctrl-C reaches the child from the terminal; here it only must not stop the parent. A handler,
    # not SIG_IGN: an ignored signal would stay ignored in the child.
    passed[signal.SIGINT] = signal.signal(signal.SIGINT, lambda _sig, _frame: None)
    kept = bytearray()
    sys.stdout.flush()
    try:
        while chunk := os.read(child.stdout.fileno(), 65536):
            kept += chunk
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        status = child.wait()
    finally:
        child.stdout.close()
        for s, handler in passed.items():
            signal.signal(s, handler)
    return (128 - status if status < 0 else status), as_shown(kept.decode(errors="replace"))


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def as_shown(text: str) -> str:
    """What a terminal would leave on screen: colour codes dropped, a line redrawn after \\r (a
    progress bar) kept as last drawn."""
    lines = [_ESCAPE.sub("", line.rstrip("\r")).rsplit("\r", 1)[-1] for line in text.split("\n")]
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def record_name(topic: str, hardware_tag: str, day: str, entity: str) -> str:
    """<topic>_<hardware>_<YYYYMMDD>_<entity>.md (torchtitan's benchmarks/ naming)."""
    return f"{topic}_{hardware_tag}_{day}_{entity}.md"


def write_record(path: Path, fields: dict[str, str], output: str) -> Path:
    """The record at `path`, or at its first free -2, -3 ... name: the command as its title, the
    header table (FIELDS), then the output, fenced. Returns where it went."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", output)), default=0))
    rows = [f"| {name} | {_cell(fields[name])} |" for name in FIELDS if fields.get(name)]
    text = "\n".join([f"# {_cell(fields['command'])}", "", "| field | value |", "|---|---|", *rows, "",
                      "The whole output (stdout and stderr, as the terminal showed them):", "",
                      f"{fence}text", output, fence, ""])
    path.parent.mkdir(parents=True, exist_ok=True)
    copy, free = 1, path
    while True:
        try:
            with open(free, "x", encoding="utf-8") as f:  # "x": never over an existing record
                f.write(text)
            return free
        except FileExistsError:
            copy += 1
            free = path.with_name(f"{path.stem}-{copy}{path.suffix}")


def _cell(value: str) -> str:
    """A header value in its table cell: one line, its own | escaped."""
    return value.replace("\r", "\\r").replace("\n", "\\n").replace("|", "\\|")


def read_header(path: Path) -> dict[str, str]:
    """A record's header: the `| name | value |` rows of the table under its title (backticks
    around the command and escaped | undone)."""
    fields: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        found = _FIELD_ROW.fullmatch(line.strip())
        if found:
            fields[found[1]] = found[2].replace("\\|", "|")
        elif fields and not line.startswith("|"):
            break  # the table ended
    fields.pop("field", None)  # the table's own heading row
    if "command" in fields:
        fields["command"] = fields["command"].strip("`")
    return fields


# -- the header's facts ------------------------------------------------------------------------------


def commit() -> str:
    """dt's checkout: its short commit, +dirty when a tracked file changed; or 'not a git checkout'."""
    here = Path(__file__).resolve().parent.parent

    def git(*words: str) -> str:
        return subprocess.run(["git", "-C", str(here), *words], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != here:
            return "not a git checkout"  # dt installed inside some other repository
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpu_names() -> list[str]:
    """The name of every GPU torch sees here (asked after the child ran: no CUDA context beside its)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def machine(gpus: Sequence[str]) -> str:
    gpu = ", ".join(f"{n}x {name}" for name, n in Counter(gpus).items()) or "no GPU"
    return f"{cpu_model()}, {args_.cores()} cores, {_memory_bytes() / 2**30:.1f} GiB memory, {gpu}"


_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro", "amd", "radeon", "instinct"}


def hardware(gpus: Sequence[str], cores: int) -> str:
    """The name's hardware: cpu2 (2 cores and no GPU), h200 (one NVIDIA H200), h100x8 (eight)."""
    if not gpus:
        return f"cpu{cores}"
    words = [w for w in re.findall(r"[a-z0-9]+", gpus[0].lower()) if w not in _VENDOR_WORDS]
    model = next((i for i, w in enumerate(words) if any(c.isdigit() for c in w)), len(words) - 1)
    tag = "".join(words[: model + 1]) or "gpu"  # "RTX 4090" -> rtx4090, "A100-SXM4-80GB" -> a100
    return tag if len(gpus) == 1 else f"{tag}x{len(gpus)}"


def versions() -> str:
    import torch

    import dt

    found = [f"python {platform.python_version()}", f"torch {torch.__version__}", f"dt {dt.__version__}"]
    if torch.version.cuda:
        found.append(f"CUDA {torch.version.cuda}")
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = torch.cuda.nccl.version()
        found.append("NCCL " + (".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)))
    return ", ".join(found)


# -- python -m dt.record TOPIC DIR -- COMMAND ... --------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = args_.Parser(prog="python -m dt.record",
                          description="run COMMAND, its output kept as a dated record in DIR (dt.record)")
    parser.add_argument("topic", help="what the record is about: lowercase letters and digits (gpu)")
    parser.add_argument("entity", help="what was run, in the record's name (ci)")
    parser.add_argument("directory", metavar="DIR")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    a = parser.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        parser.error("no command to run: python -m dt.record TOPIC ENTITY DIR -- COMMAND ...")
    if not _WORD.fullmatch(a.topic):
        parser.error(f"topic {a.topic!r}: lowercase letters and digits")
    if shutil.which(command[0]) is None:
        parser.error(f"no command {command[0]!r} to run (nothing recorded): "
                     "python -m dt.record TOPIC ENTITY DIR -- COMMAND ...")
    status, path = run_recorded(command, shlex.join(command), a.topic, a.entity, Path(a.directory))
    print(f"record: {path}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
