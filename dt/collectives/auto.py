"""algorithm="auto": the algorithm the cost model predicts (or dt tune measured) to be fastest.

For each algorithm registered for a collective, dt.cost.estimate gives
steps * alpha + bytes * beta + reduced bytes * gamma; auto runs the one with
the smallest total. alpha, beta and gamma are this machine's figures as
`dt tune` measured and saved them for this backend and group size (the
nearest tuned group size if this one was not tuned), or DEFAULT_MACHINE,
measured on the 2-core development box, when nothing was tuned.

The choice must be the same on every rank, so it depends only on what every
rank knows alike: the collective, the message size, the group size and the
saved figures (one file per machine; the cross-rank validation names the
algorithm, so ranks that disagree fail loudly rather than deadlock).

`DT_ALGO` overrides it, as NCCL_ALGO does: `DT_ALGO=ring` forces the ring
wherever a collective has one; `DT_ALGO=all_reduce=naive,broadcast=ring` sets
it per collective.
"""

from __future__ import annotations

import functools
import math
import os

import torch.distributed as dist

from dt import cost
from dt.collectives.registry import ALGORITHMS, is_alias
from dt.collectives.ring import DEFAULT_SEGMENT_BYTES
from dt.cost.machine import Machine
from dt.cost.machine import machine as saved_machine
from dt.cost.machine import winners as saved_winners


def machine(group_size: int, backend: str | None = None) -> Machine:
    """This machine's figures for a group of `group_size` (tuned, else the defaults)."""
    return saved_machine(backend or _backend(), group_size)


def _backend() -> str:
    return dist.get_backend() if dist.is_available() and dist.is_initialized() else "gloo"


def candidates(collective: str) -> list[str]:
    """Registered algorithms for `collective` that the cost model can price, sorted by name."""
    out = []
    for name in sorted(ALGORITHMS.get(collective, {})):
        if is_alias(collective, name):
            continue
        try:
            cost.formula(collective, name, 1.0, 2)
        except KeyError:
            continue
        out.append(name)
    return out


def predictions(collective: str, nbytes: int, group_size: int,
                fig: Machine) -> dict[str, cost.Estimate]:
    """Every candidate's estimate for one call."""
    return {name: cost.estimate(collective, name, nbytes, group_size, alpha=fig.alpha,
                                      beta=fig.beta, gamma=fig.gamma,
                                      segment_bytes=DEFAULT_SEGMENT_BYTES)
            for name in candidates(collective)}


@functools.lru_cache(maxsize=4096)  # called on every collective: price each size once
def best(collective: str, nbytes: int, group_size: int, fig: Machine) -> str:
    """The candidate with the smallest predicted time (ties: the first by name)."""
    pred = predictions(collective, nbytes, group_size, fig)
    if not pred:
        return next(iter(sorted(ALGORITHMS[collective])))
    return min(sorted(pred), key=lambda name: pred[name].total)


def _override(collective: str) -> str | None:
    spec = os.environ.get("DT_ALGO", "").strip()
    if not spec:
        return None
    for part in spec.split(","):
        if "=" in part:
            name, algo = (s.strip() for s in part.split("=", 1))
            if name == collective:
                return algo
        elif part.strip() in ALGORITHMS.get(collective, {}):
            return part.strip()
    return None


def measured_table(group_size: int, backend: str | None = None) -> dict:
    """`dt tune`'s measured winners for exactly this backend and group size, or {}."""
    return saved_winners(backend or _backend(), group_size)


def measured_best(collective: str, nbytes: int, group_size: int) -> str | None:
    """The algorithm measured fastest at the tuned size nearest to nbytes (log scale).

    Only inside the swept range: beyond it, the model extrapolates better
    than the last measurement does.
    """
    rows = measured_table(group_size).get(collective)
    if not rows or not (rows[0][0] / 2 <= max(nbytes, 1) <= rows[-1][0] * 2):
        return None
    target = math.log2(max(nbytes, 1))
    size, algo, _ = min(rows, key=lambda row: abs(math.log2(row[0]) - target))
    return algo if algo in ALGORITHMS.get(collective, {}) else None


def choose(collective: str, requested: str, nbytes: int, group_size: int) -> str:
    """The algorithm name to run: `requested` unless it is "auto".

    auto: DT_ALGO if set; else what `dt tune` measured fastest at this size on
    this group size; else the cost model's lowest predicted time.
    """
    if requested != "auto":
        return requested
    forced = _override(collective)
    if forced:
        return forced
    return (measured_best(collective, nbytes, group_size)
            or best(collective, nbytes, group_size, machine(group_size)))
