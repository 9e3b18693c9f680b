"""This machine's figures: alpha, beta, gamma and the measured winners, as `dt tune` saved them.

`dt tune` (dt/tools/tune.py) measures; this module only stores and reads, so
that the collectives' `auto` can read the figures without importing the tool
that measures them.

The figures live in a small JSON file in the user's cache directory
($XDG_CACHE_HOME/dt/tune.json, else ~/.cache/dt/tune.json), keyed by
"backend:world" (backend "shm": the shared-memory wire), or "backend:HxG"
for figures measured across H hosts of G ranks (the topology, not only the
world size: a loopback figure must not price a link between hosts).
`figures(backend, world)` returns the entry for that world, else the nearest
tuned world's, else None; with a topology spanning hosts only that
topology's entry. A group spanning hosts prices with rank 0's figures, sent
to every rank (dt.collectives.agreed), so ranks with different files agree.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_MACHINE", "DEFAULT_SHM_MACHINE", "Machine", "REVISION", "cache_path", "entries",
           "figures", "forget", "key", "machine", "reset", "save", "spans_hosts", "winners"]


@dataclass(frozen=True)
class Machine:
    """alpha: seconds per message step; beta: seconds per byte; gamma: seconds per reduced byte.

    On the shared-memory wire ("shm" figures) alpha and beta are those of its
    point-to-point channels, and two more price the load/store algorithms:
    sync, seconds per synchronisation of the group; mem, seconds per byte
    copied (memcpy: the physical bound of anything inside one host).
    """

    alpha: float
    beta: float
    gamma: float
    source: str = "default"
    sync: float = 0.0
    mem: float = 0.0


# `dt tune` on the 2-core development machine (gloo over loopback, world 2,
# quiet): one exchange step of a tiny message ~200 us, ~1.25 GB/s per rank
# through the kernel's loopback copy, ~10 GB/s for an add. Under load the
# step time grows to milliseconds (the scheduler's time slice), which moves
# the switch points up; `dt tune` on the loaded machine records that.
DEFAULT_MACHINE = Machine(alpha=200e-6, beta=0.8e-9, gamma=0.1e-9)
# The shared-memory wire on the same machine, world 2 (dt bench collectives and
# the study's table 10, loaded): memcpy ~4.7 GB/s by every rank at once out of
# cache (mem); a synchronisation ~20 us when the peer is running (sync); a
# channel message ~50 us and ~1 GB/s through two copies and the slot handshake
# (alpha, beta). The load/store algorithms' reads from peers are priced as
# bytes at mem (dt.cost.loadstore), so gamma is the arithmetic of the
# reduction on top: ~0.24 ns per reduced byte, which with the reads' 0.21
# makes the 0.45 ns per byte measured for reducing a peer's freshly written
# memory, and puts the one-shot / two-shot switch near 80 KB at world 2,
# where it was measured.
DEFAULT_SHM_MACHINE = Machine(alpha=50e-6, beta=1.0e-9, gamma=0.24e-9, sync=20e-6, mem=0.21e-9)


def cache_path() -> Path:
    """Where the figures live: $XDG_CACHE_HOME/dt/tune.json or ~/.cache/dt/tune.json."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dt" / "tune.json"


def _read_all() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def entries() -> dict[str, Any]:
    """Every saved entry by its key (`dt tune --show`); {} when nothing is saved."""
    return _read_all()


def reset() -> int:
    """Delete the saved figures (`dt tune --reset`): auto and `dt model` use the defaults again.

    Returns how many entries the file held (0: there was none).
    """
    count = len(_read_all())
    try:
        cache_path().unlink()
    except FileNotFoundError:
        pass
    forget()
    return count


def spans_hosts(topology: str | None) -> bool:
    """Whether a topology shape ("2x4", "3+1", "1x8") has more than one host."""
    if not topology:
        return False
    return "+" in topology or int(topology.split("x")[0]) > 1


def key(entry: dict[str, Any]) -> str:
    """Where an entry is filed: "backend:world" on one host, "backend:HxG" (its topology) across hosts."""
    topology = entry.get("topology")
    return f"{entry['backend']}:{topology if spans_hosts(topology) else entry['world']}"


def figures(backend: str, world: int, topology: str | None = None) -> dict[str, Any] | None:
    """Saved figures for (backend, world); else those of the nearest tuned world; else None.

    With a `topology` spanning hosts ("2x2": dt.transport.Topology.shape) only
    figures measured on that topology count: a loopback figure says nothing
    about the link between two hosts.
    """
    if spans_hosts(topology):
        return _read_all().get(f"{backend}:{topology}")
    saved = {k: v for k, v in _read_all().items()
             if v.get("backend") == backend and not spans_hosts(v.get("topology"))}
    if not saved:
        return None
    exact = f"{backend}:{world}"
    if exact in saved:
        return saved[exact]
    # Nearest world size (ties: the smaller one): the same file gives every rank the same answer.
    key = min(saved, key=lambda k: (abs(saved[k]["world"] - world), saved[k]["world"]))
    return saved[key]


def save(entry: dict[str, Any]) -> Path:
    """Store one `dt tune` result (it names its backend and world) and drop the cached reads."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_all()
    data[key(entry)] = entry
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one writer per temporary file
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    forget()
    return path


_machines: dict[tuple[str, int], Machine] = {}
# Bumped by forget(): a choice made from the figures read before (a group's cached plans,
# dt.collectives.plan) is made again. A one-item list, so readers see it without a call.
REVISION = [0]
_winners: dict[tuple[str, int], dict[str, Any]] = {}


def machine(backend: str, world: int) -> Machine:
    """alpha, beta, gamma for a group of `world` (tuned, else the defaults); read once."""
    key = (backend, world)
    if key not in _machines:
        saved = figures(backend, world)
        default = DEFAULT_SHM_MACHINE if backend == "shm" else DEFAULT_MACHINE
        _machines[key] = (Machine(saved["alpha"], saved["beta"], saved["gamma"],
                                  source=f"dt tune ({backend}, world {saved['world']})",
                                  sync=saved.get("sync", default.sync), mem=saved.get("mem", default.mem))
                          if saved else default)
    return _machines[key]


def winners(backend: str, world: int) -> dict[str, Any]:
    """`dt tune`'s measured fastest algorithm per collective and size, for exactly this world, or {}."""
    key = (backend, world)
    if key not in _winners:
        saved = figures(backend, world)
        exact = saved is not None and saved.get("world") == world
        _winners[key] = saved.get("winners", {}) if exact else {}
    return _winners[key]


def forget() -> None:
    """Drop the figures read so far (after `dt tune` saves new ones)."""
    _machines.clear()
    _winners.clear()
    REVISION[0] += 1
