"""What people type, checked at the door: every command line, and dt's environment variables.

Each `dt` command builds its options with `Parser` and these types, so a bad
value is refused before any process starts, in one line, with exit status 2:

    $ dt train --steps 0
    dt train: error: argument --steps: must be a whole number >= 1, got '0' (see dt train --help)

never a traceback, and never a silent exit 0 with nothing done. A check that
spans options (a batch that must split over --dp) calls `parser.error(...)`,
which says it the same way. Every DT_* variable (ENVIRONMENT) is read by the
library with the same rule (`env_value`), so `dt` refuses a bad one up front too.

A world of processes started here is bounded by what this host holds
(`max_local_world`: memory per rank, cores, a stated cap; DT_MAX_WORLD
overrides), so a typo such as --world 9999 is refused, not run out of memory.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dt.units import fmt_bytes, parse_rate, parse_size, parse_time

__all__ = ["ENVIRONMENT", "INTERNAL", "MAX_WORLD", "PRECISIONS", "SAMPLE_BYTES", "TRANSPORTS",
           "HelpFormatter", "InputError", "Parser", "Variable", "at_least", "available_memory", "boolean",
           "check_environment", "check_local_world", "cores", "did_you_mean", "duration", "env_rule",
           "env_value", "finite", "launched_by_torchrun", "link", "listed", "max_local_world",
           "memory_refusal", "non_negative", "positive", "precision", "precision_spellings", "ranks",
           "ranks_on_this_host", "rate", "register", "seconds", "shared_memory_refused", "short_precision",
           "size", "text_value", "transport", "world"]

MAX_WORLD = 4096  # ranks in one world, across hosts: beyond this it is a typo, not a plan


class InputError(argparse.ArgumentTypeError, ValueError):
    """A value people typed that dt refuses; argparse shows its text as is."""


def _number(text: Any, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(str(text).strip())
    except ValueError:
        raise InputError(f"must be {what}, got {text!r}") from None


def at_least(low: int) -> Callable[[str], int]:
    """A whole number >= low (at_least(1) for counts of steps, at_least(0) for 'none allowed')."""
    def check(text: str) -> int:
        value = _number(text, int, f"a whole number >= {low}")
        if value < low:
            raise InputError(f"must be a whole number >= {low}, got {text!r}")
        return value
    check.__name__ = f"at_least_{low}"
    return check


def ranks(text: str) -> int:
    """A world size as arithmetic (a model's, a mesh factor): 1 to MAX_WORLD."""
    value = _number(text, int, "a number of processes (1 or more)")
    if not 1 <= value <= MAX_WORLD:
        raise InputError(f"must be a number of processes from 1 to {MAX_WORLD}, got {text!r}")
    return value


def finite(text: str) -> float:
    """Any finite number (no nan, no inf)."""
    value = _number(text, float, "a number")
    if not math.isfinite(value):
        raise InputError(f"must be a finite number, got {text!r}")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (a learning rate, a factor)."""
    value = finite(text)
    if value <= 0:
        raise InputError(f"must be a number > 0, got {text!r}")
    return value


def seconds(text: Any) -> float:
    """A timeout: a positive, finite number of seconds."""
    try:
        value = float(str(text).strip())
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"must be a positive, finite number of seconds, got {text!r} (for a very "
                         "long wait give a large number, e.g. 86400)")
    return value


def size(text: str) -> int:
    """A message size people type (4096, 64KB, 1GiB): at least one byte."""
    try:
        value = parse_size(str(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if value < 1:
        raise InputError(f"must be at least 1 byte, got {text!r}")
    return value


def rate(text: str) -> float:
    """A rate people type (100GB/s, 25Gbit/s): more than 0."""
    try:
        value = parse_rate(str(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"must be a rate above 0, got {text!r}")
    return value


def link(text: str) -> float:
    """A link rate as people say it ('1Gbit', '10Gbit/s', '125MB/s'): bits per second."""
    return rate(text if text.endswith("/s") else text + "/s") * 8


def duration(text: str) -> float:
    """A time people type (5us, 2ms): 0 or more."""
    try:
        value = parse_time(str(text))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not (value >= 0 and math.isfinite(value)):
        raise InputError(f"must be a time of 0 or more, got {text!r}")
    return value


def listed(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    """A comma-separated list ('2,4,8'), each item checked by `item`, at least one item."""
    def check(text: str) -> tuple[Any, ...]:
        parts = [p for p in str(text).replace(" ", "").split(",") if p]
        if not parts:
            raise InputError(f"must be a comma-separated list, like 2,4,8, got {text!r}")
        try:
            return tuple(item(p) for p in parts)
        except InputError as exc:
            if len(parts) == 1:  # the item's own words say it all
                raise
            raise InputError(f"{exc} (in the list {text!r})") from None
    return check


def boolean(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise InputError(f"must be 1 or 0 (true/false, yes/no, on/off), got {text!r}")


# -- precisions -----------------------------------------------------------------

# Each precision once: the name dt stores (torch's dtype name; tf32 has none, it is float32
# storage whose matmuls run on TF32 tensor cores), then the spellings of NVIDIA's datasheets
# and nccl-tests (bf16, fp16, fp32), the first of them the short name.
PRECISIONS: dict[str, tuple[str, ...]] = {
    "float32": ("fp32",), "tf32": ("tf32",), "bfloat16": ("bf16",), "float16": ("fp16", "half"),
    "float64": ("fp64", "double"),
}


def precision_spellings() -> list[str]:
    """Every spelling `precision` accepts, for help texts and errors."""
    return [word for name, other in PRECISIONS.items() for word in dict.fromkeys((name, *other))]


def precision(text: str) -> str:
    """A precision in any of its spellings (bf16 or bfloat16, fp32 or float32, ...): its torch name."""
    word = str(text).strip().lower()
    for name, other in PRECISIONS.items():
        if word == name or word in other:
            return name
    known = precision_spellings()
    raise InputError(f"must be a precision, one of {', '.join(known)}; got {text!r}"
                     f"{did_you_mean(word, known)}")


def short_precision(name: str) -> str:
    """A precision's datasheet spelling (bfloat16 -> bf16), from its torch name."""
    return PRECISIONS[name][0]


# -- how many processes this machine holds --------------------------------------

LOCAL_CAP = 256  # processes dt starts on one host, whatever the memory: every pair holds sockets
RANK_FOOTPRINT = 256 << 20  # bytes one rank holds: see below
RANKS_PER_CORE = 32  # beyond this the ranks only queue for the cores, and every wait times out
# RANK_FOOTPRINT, measured: a forkserver worker that has run an all-reduce has 174 MiB resident
# (9 MiB private), and a torchrun rank imports torch itself (its 174 MiB are its own); 256 MiB
# leaves a rank room for its tensors and gloo's buffers, so the bound errs towards refusing.

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def launched_by_torchrun() -> bool:
    """Whether torchrun started this process (its environment names the world): the one rule."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def available_memory() -> int | None:
    """Bytes this process could still allocate: the kernel's MemAvailable, within the cgroup's limit."""
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:  # a container's limit, less what it already uses
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            if limit != "max":
                found.append(max(0, int(limit) - int(f.read().strip())))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_local_world() -> tuple[int, str]:
    """How many processes dt may start on this host, and why that many (DT_MAX_WORLD overrides)."""
    override = os.environ.get("DT_MAX_WORLD", "").strip()
    if override:
        return env_rule("DT_MAX_WORLD", override), f"DT_MAX_WORLD={override}"
    limits = [(LOCAL_CAP, f"dt's cap of {LOCAL_CAP} per host")]
    free = available_memory()
    if free is not None:
        limits.append((free // RANK_FOOTPRINT, f"{free / 2**30:.1f} GiB available / "
                       f"{RANK_FOOTPRINT >> 20} MiB per rank"))
    n = cores()
    limits.append((n * RANKS_PER_CORE, f"{n} cores x {RANKS_PER_CORE} ranks per core"))
    limit, why = min(limits)
    return max(1, limit), why


def check_local_world(n: int, what: str = "processes") -> None:
    """InputError when n processes would not fit on this host (one line: the limit, why, the way out)."""
    limit, why = max_local_world()
    if n > limit:
        way_out = "" if why.startswith("DT_MAX_WORLD") else "; set DT_MAX_WORLD to change the limit"
        raise InputError(f"{n} {what} on this host: at most {limit} here ({why}){way_out}")


# -- how much memory a command's sizes and counts take -------------------------------

SAMPLE_BYTES = 32  # one timing kept in a Python list: its float object (24 B) and the list's slot (8 B)


def ranks_on_this_host(world: int) -> int:
    """How many of a world's ranks share this machine's memory: under torchrun its
    LOCAL_WORLD_SIZE (the others run on other hosts), else all of them (dt starts them here)."""
    if launched_by_torchrun():
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return world


def memory_refusal(option: str, per_rank: int, ranks: int, held: str,
                   device_free: int | None = None) -> str | None:
    """None when what `option` makes each rank hold fits; else the refusal, in one line.

    `per_rank`: the bytes one rank certainly holds for it, `held` says what they are
    ("7 buffers of 8.59 GB"). On the CPU the machine's ranks share its memory, each
    with its own footprint beside (RANK_FOOTPRINT); with `device_free` (a GPU's free
    bytes) each rank holds its share on a device of its own.
    """
    if device_free is not None:
        if per_rank <= device_free:
            return None
        return (f"{option} needs {fmt_bytes(per_rank)} on each rank's GPU ({held}); "
                f"one GPU has {fmt_bytes(device_free)} free")
    free = available_memory()
    need = ranks * (per_rank + RANK_FOOTPRINT)
    if free is None or need <= free:
        return None
    one = f"{held} = {fmt_bytes(per_rank)}, + {RANK_FOOTPRINT >> 20} MiB a rank holds itself"
    each = f": {ranks} ranks x ({one})" if ranks > 1 else f" ({one})"
    return f"{option} needs {fmt_bytes(need)}{each}; this machine has {fmt_bytes(free)} available"


def world(text: str) -> int:
    """A number of processes dt starts on this host: 1 to MAX_WORLD, and what the host holds
    (max_local_world). Under torchrun the processes already run, so only the first applies."""
    value = _number(text, int, "a number of processes (1 or more)")
    if value >= 1 and not launched_by_torchrun():
        check_local_world(value)
    return ranks(text)


# -- the environment -----------------------------------------------------------

TRANSPORTS = ("auto", "shm", "torch", "gloo", "nccl")


STORE_ORDERED_CPUS = ("x86_64", "amd64", "i386", "i686")  # x86: stores seen in program order (TSO)


def shared_memory_refused() -> str | None:
    """Why this CPU may not carry the shared-memory wire, or None where it may.

    The wire (dt.transport.shm.sync) publishes data and then a counter with plain
    stores, and a peer that sees the counter move reads the data: right only where
    other cores see stores in program order, as on x86. On aarch64 (Grace, Graviton)
    a peer may see the counter before the data, and Python has no fence to put
    between them: the wire would hand out stale bytes, silently. So it is refused there.
    """
    machine = platform.machine()
    if machine.lower() in STORE_ORDERED_CPUS:
        return None
    return (f"the shared-memory wire needs x86's store order (a peer that sees a counter move must "
            f"see the data stored before it), which this {machine or 'unknown'} CPU does not keep")


def transport(text: str) -> str:
    """A wire's name: auto (shm where the CPU allows it), shm (insisted on), torch (gloo, nccl:
    torch.distributed for every peer)."""
    name = str(text).strip().lower()
    if name not in TRANSPORTS:
        raise InputError(f"must be one of {', '.join(TRANSPORTS)}, got {text!r}"
                         f"{did_you_mean(name, TRANSPORTS)}")
    why = shared_memory_refused() if name == "shm" else None
    if why is not None:
        raise InputError(f"cannot be shm here: {why}; auto or torch use the socket wire")
    return name


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """' (did you mean ring?)' for a near miss, else ''."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def non_negative(text: str) -> float:
    """A finite number >= 0 (a spin in microseconds)."""
    value = finite(text)
    if value < 0:
        raise InputError(f"must be a number >= 0, got {text!r}")
    return value


def text_value(text: str) -> str:
    """Any text (a name people choose)."""
    return str(text).strip()


@dataclass(frozen=True)
class Variable:
    rule: Callable[[str], Any]  # the parser the library reads the value with
    meaning: str  # one line, for the README table and `dt --help`


# The environment variables dt reads, each with the rule its value follows: the library reads
# them with these rules (env_value), so a command refuses up front exactly what a run would.
# DT_ALGO is added by dt.collectives.auto, whose registry knows the algorithms' names.
ENVIRONMENT: dict[str, Variable] = {
    "DT_TIMEOUT": Variable(seconds, "seconds one wait on a peer may take (default: the launcher's)"),
    "DT_VALIDATE": Variable(boolean, "0: skip the cross-rank argument check (default 1)"),
    "DT_TRANSPORT": Variable(transport, f"the wire between ranks of one host: {', '.join(TRANSPORTS)}"),
    "DT_MAX_WORLD": Variable(ranks, "processes dt may start on this host (default: what it holds)"),
    "DT_HOST": Variable(text_value, "this process's host name (ranks with the same one share memory)"),
    "DT_SHM_STAGE_BYTES": Variable(size, "each rank's shared-memory staging half (default 32 MiB)"),
    "DT_SHM_CHANNEL_BYTES": Variable(size, "what a group's shared-memory channels share (default 64 MiB)"),
    "DT_SHM_SPIN_US": Variable(non_negative, "microseconds a shared-memory wait spins before it sleeps"),
    "DT_NCCL_RULES": Variable(boolean, "1: record and check NCCL's point-to-point rules (tests)"),
}
INTERNAL = {"DT_LAUNCHER_RANK": "set by the launcher in each worker: its rank (not for users)",
            "DT_RECORD_HEADLINE": "set by --record in the run it records: its headline's file (dt.record)"}


def register(name: str, rule: Callable[[str], Any], meaning: str) -> None:
    """Add a variable whose rule lives in a higher layer (DT_ALGO: the algorithm registry)."""
    ENVIRONMENT[name] = Variable(rule, meaning)


def env_rule(name: str, text: str) -> Any:  # noqa: ANN401 - each variable's own type
    """`text` read by the variable's rule; InputError naming the variable when it is bad."""
    try:
        return ENVIRONMENT[name].rule(text)
    except InputError as exc:
        raise InputError(f"{name} {exc}") from None


def env_value(name: str, default: Any = None) -> Any:  # noqa: ANN401 - each variable's own type
    """The variable read by its rule; default when unset or empty; InputError naming it when bad."""
    text = os.environ.get(name, "").strip()
    return env_rule(name, text) if text else default


def check_environment() -> None:
    """InputError naming the first of dt's environment variables that holds a bad value."""
    for name in ENVIRONMENT:
        env_value(name)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description and epilog as written, and each option's default after its help, unless
    the help names its default already or there is none to show (None, a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if not action.option_strings or "default" in text or nothing:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """argparse, with every refusal in one line (exit 2) and the environment checked too."""

    def error(self, message: str) -> Any:  # noqa: ANN401 - argparse's signature (never returns)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def check_memory(self, option: str, per_rank: int, ranks: int, held: str,
                     device_free: int | None = None) -> None:
        """Refuse (one line, exit 2) what would not fit in memory: dt.args.memory_refusal."""
        why = memory_refusal(option, per_rank, ranks, held, device_free)
        if why is not None:
            self.error(why)

    def _check_value(self, action: argparse.Action, value: Any) -> None:  # noqa: ANN401 - any choice
        """A value outside an option's choices, refused with the nearest choice ('did you mean')."""
        if action.choices is not None and value not in action.choices:
            known = [str(c) for c in action.choices]
            near = did_you_mean(str(value), known)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{near} "
                                                 f"(choose from {', '.join(known)})")
        super()._check_value(action, value)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # noqa: ANN401
        parsed = super().parse_args(args, namespace)
        try:
            check_environment()
        except InputError as exc:
            self.error(str(exc))
        return parsed
