"""algorithm="auto": the algorithm the cost model predicts (or dt tune measured) to be fastest.

For each algorithm registered for a collective, dt.cost.estimate gives
steps * alpha + bytes * beta + reduced bytes * gamma; auto runs the one with
the smallest total. alpha, beta and gamma are this machine's figures as
`dt tune` measured and saved them for this backend and group size (the
nearest tuned group size if this one was not tuned), or DEFAULT_MACHINE,
measured on the 2-core development box, when nothing was tuned.

The choice must be the same on every rank, so it depends only on what every
rank knows alike: the collective, the message size, the group size, the
group's wire (its topology, agreed when it connected) and the saved figures
(one file per machine; the cross-rank validation names the algorithm, so
ranks that disagree fail loudly rather than deadlock).

Wire and algorithm are chosen together: a group whose ranks all share one
host segment prices the point-to-point algorithms with the shared-memory
wire's figures ("shm": its channels' alpha and beta) and also has the
load/store algorithms (one_shot, two_shot), priced at `sync` per
synchronisation and `mem` per byte copied; any other group prices the
point-to-point algorithms on torch.distributed's figures and has no
load/store candidates. Only CPU tensors take shared memory.

A group spanning hosts is priced from rank 0's figures, agreed once per
group (dt.collectives.agreed), with the two-level model (dt.cost.levels):
every rank decides alike whatever its own tune file says (`across_hosts`).

`DT_ALGO` overrides it, as NCCL_ALGO does: `DT_ALGO=ring` forces the ring
wherever a collective has one; `DT_ALGO=all_reduce=naive,broadcast=ring` sets
it per collective.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch
import torch.distributed as dist

from dt import cost
from dt.args import env_rule
from dt.collectives.registry import ALGORITHMS, names, needs_shared_memory
from dt.collectives.ring_engine import DEFAULT_SEGMENT_BYTES
from dt.cost.levels import Levels, two_level
from dt.cost.machine import Machine
from dt.cost.machine import machine as saved_machine
from dt.cost.machine import winners as saved_winners
from dt.cost.overheads import Overheads
from dt.cost.records import LEVELED, family, record_for
from dt.transport import Group


def machine(group_size: int, backend: str | None = None) -> Machine:
    """This machine's figures for a group of `group_size` (tuned, else the defaults)."""
    return saved_machine(backend or _backend(), group_size)


def _backend() -> str:
    return dist.get_backend() if dist.is_available() and dist.is_initialized() else "gloo"


def candidates(collective: str, shared_memory: bool | None = None) -> list[str]:
    """Registered algorithms for `collective` whose record has a formula, sorted by name.

    shared_memory: True on a group with a shared segment (load/store algorithms
    included), False elsewhere (excluded), None: all of them (for listing).
    """
    listed = names(collective, loadstore=False if shared_memory is False else None)
    return [name for name in listed if record_for(collective, name).formula is not None]


def predictions(collective: str, nbytes: int, group_size: int, fig: Machine,
                shared_memory: bool = False, stage_bytes: int | None = None,
                overheads: Overheads | None = None) -> dict[str, cost.Estimate]:
    """Every candidate's estimate for one call (load/store ones at fig.sync and fig.mem);
    with `overheads` (dt tune's terms, dt.cost.overheads) each carries the terms too."""
    out = {}
    for name in candidates(collective, shared_memory):
        if needs_shared_memory(collective, name):
            out[name] = cost.estimate(collective, name, nbytes, group_size, alpha=fig.sync,
                                      beta=fig.mem, gamma=fig.gamma, stage_bytes=stage_bytes,
                                      overheads=overheads)
        else:
            out[name] = cost.estimate(collective, name, nbytes, group_size, alpha=fig.alpha,
                                      beta=fig.beta, gamma=fig.gamma,
                                      segment_bytes=DEFAULT_SEGMENT_BYTES, overheads=overheads)
    return out


def tuned_predictions(collective: str, nbytes: int, group_size: int,
                      saved: dict[str, Any]) -> dict[str, cost.Estimate]:
    """Every candidate priced with one wire's `dt tune` entry (dt.cost.machine.figures), its terms
    included: what `dt model --measured` prints and the scaling study sets beside its timings.

    An entry with `sync` and `mem` is the shared-memory wire's (the load/store algorithms
    too, staged as the host segment stages them); one without is the torch wire's.
    """
    from dt.transport.shm.host import DEFAULT_STAGE_BYTES

    shared = isinstance(saved.get("sync"), (int, float)) and isinstance(saved.get("mem"), (int, float))
    fig = Machine(saved["alpha"], saved["beta"], saved["gamma"], sync=saved.get("sync") or 0.0,
                  mem=saved.get("mem") or 0.0)
    return predictions(collective, nbytes, group_size, fig, shared, DEFAULT_STAGE_BYTES if shared else None,
                       Overheads.from_saved(saved))


@functools.lru_cache(maxsize=4096)  # called on every collective: price each size once
def best(collective: str, nbytes: int, group_size: int, fig: Machine, shared_memory: bool = False,
         stage_bytes: int | None = None) -> str:
    """The candidate with the smallest predicted time (ties: the first by name)."""
    pred = predictions(collective, nbytes, group_size, fig, shared_memory, stage_bytes)
    if not pred:
        return next(iter(sorted(ALGORITHMS[collective])))
    return min(sorted(pred), key=lambda name: pred[name].total)


def wire_of(group: Group | int, device: Any = None) -> str:
    """The wire auto prices a group's collectives on: "shm" for a CPU group on one shared
    segment, else its backend ("gloo", "nccl"). An int (a group size) means the torch wire."""
    if isinstance(group, Group):
        on_cpu = device is None or torch.device(device).type == "cpu"
        if group.links.board is not None and on_cpu:
            return "shm"
        return group.backend
    return _backend()


def stage_bytes(group: Group | int) -> int | None:
    """The group's staging half (what dt.cost's load/store traffic counts rounds by), or None."""
    board = group.links.board if isinstance(group, Group) else None
    return board.capacity if board is not None else None


def _override(collective: str, shared_memory: bool) -> str | None:
    """DT_ALGO's choice for `collective` (a load/store one only where the group has shared memory)."""
    for name, algo in _forced(os.environ.get("DT_ALGO", "").strip()):
        if name is None and algo not in ALGORITHMS.get(collective, {}):
            continue
        runnable = shared_memory or not needs_shared_memory(collective, algo)
        if (name or collective) == collective and runnable:
            return algo
    return None


@functools.lru_cache(maxsize=8)
def _forced(text: str) -> tuple[tuple[str | None, str], ...]:
    # every auto choice asks: parse each value once (a bad one raises each time, naming DT_ALGO)
    return env_rule("DT_ALGO", text) if text else ()


def measured_table(group_size: int, backend: str | None = None) -> dict:
    """`dt tune`'s measured winners for exactly this wire (backend) and group size, or {}."""
    return saved_winners(backend or _backend(), group_size)


def measured_best(collective: str, nbytes: int, group_size: int, wire: str | None = None) -> str | None:
    """The algorithm measured fastest at the tuned size nearest to nbytes (log scale).

    Only inside the swept range: beyond it, the model extrapolates better
    than the last measurement does. Only one the group can run.
    """
    return _nearest(measured_table(group_size, wire).get(collective), collective, nbytes, wire == "shm")


def _nearest(rows: list | None, collective: str, nbytes: int, shared: bool) -> str | None:
    """The winner at the measured size nearest to nbytes, inside the swept range, that can run here."""
    if not rows or not (rows[0][0] / 2 <= max(nbytes, 1) <= rows[-1][0] * 2):
        return None
    target = math.log2(max(nbytes, 1))
    size, algo, _ = min(rows, key=lambda row: abs(math.log2(row[0]) - target))
    if algo not in ALGORITHMS.get(collective, {}):
        return None
    if needs_shared_memory(collective, algo) and not shared:
        return None
    return algo


def choose(collective: str, requested: str, nbytes: int, group: Group | int,
           device: Any = None) -> str:
    """The algorithm name to run: `requested` unless it is "auto".

    auto: DT_ALGO if set; else what `dt tune` measured fastest at this size
    on this wire and group size; else the cost model's lowest predicted time.
    `group` is the (connected) Group; a plain group size prices the torch wire.
    """
    if requested != "auto":
        return requested
    if isinstance(group, Group) and group.links.agreed is not None:
        return across_hosts(collective, nbytes, group)
    wire = wire_of(group, device)
    shared = wire == "shm"
    p = group.size if isinstance(group, Group) else group
    forced = _override(collective, shared)
    if forced:
        return forced
    stage = stage_bytes(group) if shared else None
    return (measured_best(collective, nbytes, p, wire)
            or best(collective, nbytes, p, machine(p, wire), shared, stage))


def across_hosts(collective: str, nbytes: int, group: Group) -> str:
    """auto on a group spanning hosts: from rank 0's figures only (dt.collectives.agreed).

    DT_ALGO first; then the winners `dt tune` measured on this topology; then the
    two-level model (dt.cost.levels) for all-reduce, reduce-scatter and
    all-gather, the flat model on the slower (inter-host) figures for the rest.
    """
    forced = _override(collective, False)
    if forced:
        return forced
    agreed = group.links.agreed
    hosts = tuple(group.links.topology.hosts)
    measured = _nearest(agreed.winners.get(collective), collective, nbytes, False)
    if measured:
        return measured
    base = family(collective)
    if base in LEVELED:
        return best_two_level(collective, nbytes, hosts, agreed.levels)
    return best(collective, nbytes, group.size, agreed.levels.inter)


@functools.lru_cache(maxsize=4096)
def best_two_level(collective: str, nbytes: int, hosts: tuple[int, ...], levels: Levels) -> str:
    """The algorithm the two-level model prices lowest (ties: the first by name); bytes as 1-byte elements."""
    base = family(collective)
    names = [a for a in LEVELED[base] if a in ALGORITHMS.get(collective, {})]
    numels = nbytes if base == "all_reduce" else nbytes // len(hosts)
    return min(sorted(names), key=lambda a: two_level(base, a, numels, 1, hosts, levels).total)
