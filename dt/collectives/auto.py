"""algorithm="auto": which algorithm a collective runs when the caller does not say.

The choice must be the same on every rank, so it depends only on what every
rank knows alike: the collective, the message size and the group size (and,
once `dt tune` has run, this machine's measured alpha, beta, gamma).
`DT_ALGO` overrides it, as NCCL_ALGO does: `DT_ALGO=ring` forces the ring
wherever a collective has one; `DT_ALGO=all_reduce=naive,broadcast=ring` sets
it per collective.
"""

from __future__ import annotations

import os

from dt.collectives.registry import ALGORITHMS

# Below this many bytes a flat exchange's 2 hops beat the ring's 2(p-1);
# measured on loopback gloo (bench/collectives.py shows the crossover).
SMALL_MESSAGE_BYTES = 64 * 1024

_DEFAULTS = {
    "reduce": "flat",
    "gather": "flat",
    "scatter": "flat",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "reduce_scatter_tensor": "ring",
    "all_to_all": "pairwise",
    "barrier": "dissemination",
}


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


def choose(collective: str, requested: str, nbytes: int, group_size: int) -> str:
    """The algorithm name to run: `requested` unless it is "auto"."""
    if requested != "auto":
        return requested
    forced = _override(collective)
    if forced:
        return forced
    small = nbytes < SMALL_MESSAGE_BYTES
    if collective == "all_reduce":
        return "naive" if small or group_size <= 2 and nbytes < 4 * SMALL_MESSAGE_BYTES else "ring"
    if collective == "broadcast":
        return "flat" if small or group_size <= 2 else "ring"
    if collective == "all_gather_into_tensor":
        return "bruck" if small else "ring"
    return _DEFAULTS[collective]
