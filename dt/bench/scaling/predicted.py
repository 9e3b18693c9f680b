"""The cost model's predictions the tables set beside their timings, from `dt tune`'s saved figures.

Nothing is priced here: an all-reduce is priced by dt.collectives.auto.tuned_predictions
(what `dt model all_reduce --measured` prints), the data-parallel gradient sync by
dt.plan (its buckets: dt.plan.stage.bucket_ready; each bucket: dt.plan.comm.collective_seconds,
as `dt plan` prices DDP on this machine; overlap: dt.plan.sync.thread_end). This module
only finds the figures (`dt tune --world N` for exactly this world and wire: a figure
borrowed from another world would hide what the prediction misses) and says what is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from dt import cost

__all__ = ["PRICED_TABLES", "all_reduce", "ddp_step", "ddp_sync", "fmt", "how_to_tune", "seconds", "tuned",
           "wire_of"]

PRICED_TABLES = (1, 2, 3, 4, 5, 7)  # the tables with a (model) column: each needs its worlds tuned


def wire_of(impl: str) -> str:
    """'ring@shm' -> 'shm'; a plain name runs on the torch wire (workers.py)."""
    return "shm" if impl.endswith("@shm") else "torch"


def tuned(world: int, wire: str, backend: str = "gloo") -> dict[str, Any] | None:
    """What `dt tune --world N` saved for exactly this world and wire (shm, else the torch
    wire's backend), or None."""
    from dt.cost import machine

    try:
        got = machine.figures("shm" if wire == "shm" else backend, world)
    except Exception:  # noqa: BLE001 - an unreadable cache is the same as none
        return None
    if not got or got.get("world") != world or not all(
            isinstance(got.get(k), (int, float)) for k in ("alpha", "beta", "gamma")):
        return None
    return got


def how_to_tune(worlds: Iterable[int], backend: str = "gloo") -> str | None:
    """One line saying how to get the predictions the tables leave '-': the `dt tune` commands for
    the worlds (of more than one rank) not tuned on both wires; None when every one is."""
    missing = sorted(w for w in set(worlds)
                     if w > 1 and (tuned(w, "shm") is None or tuned(w, "torch", backend) is None))
    if not missing:
        return None
    commands = " && ".join(f"dt tune --world {w}" for w in missing)
    return (f"the (model) columns show '-' for world {', '.join(map(str, missing))}: this machine's "
            f"figures are not saved yet; `{commands}` saves them (a few minutes each), then run the "
            f"study again")


def all_reduce(saved: dict[str, Any] | None, impl: str, nbytes: int, world: int) -> cost.Estimate | None:
    """The estimate of one timed all-reduce ('ring', 'two_shot@shm') with its wire's tuned entry
    (tuned()), or None without one."""
    if saved is None:
        return None
    from dt.collectives.auto import tuned_predictions

    return tuned_predictions("all_reduce", nbytes, world, saved).get(impl.partition("@")[0])


def seconds(impl: str, nbytes: int, world: int, backend: str = "gloo") -> float | None:
    """The predicted seconds of one timed all-reduce from its world's and wire's `dt tune` figures,
    or None (not tuned)."""
    e = all_reduce(tuned(world, wire_of(impl), backend), impl, nbytes, world)
    return None if e is None else e.total


def fmt(t: float | None) -> str:
    """A predicted time as the tables print it: '-' where there is none."""
    from dt.bench import report as R

    return "-" if t is None else R.fmt_time(t)


@functools.lru_cache(maxsize=16)
def _dense(hidden: int, layers: int) -> tuple[int, ...]:
    from dt.bench.ddp import reference_model

    return tuple(p.numel() for p in reference_model(hidden, layers).parameters())


def ddp_sync(world: int, hidden: int, layers: int, algorithm: str = "auto",
             backward: float | None = None) -> dict[str, float] | None:
    """The reference model's gradient sync at this world as dt.plan prices dt's DDP on this
    machine (buckets of 25 MB, first 1 MB, on the shared-memory wire; algorithm auto: what dt's
    auto runs, at the sweep's measured time where it covers a bucket, else the model with
    its terms), or None when this world was not tuned on that wire.

    comm: the buckets' seconds one after another (the DDP's comm timer); with `backward`
    (the measured backward compute of the overlap-on step), exposed_on: what runs past it
    when each bucket starts as its last gradient arrives.
    """
    if world < 2 or tuned(world, "shm") is None:
        return None
    from dt.plan.cluster import local_cluster
    from dt.plan.comm import collective_seconds
    from dt.plan.stage import bucket_ready
    from dt.plan.sync import thread_end

    cluster = local_cluster(world)
    ranks = tuple(range(world))
    buckets = [(collective_seconds(cluster, "all_reduce", nbytes, ranks, algorithm), ready)
               for nbytes, ready in bucket_ready(list(_dense(hidden, layers)), cluster.itemsize)]
    out = {"comm": sum(s for s, _ in buckets), "buckets": float(len(buckets))}
    if backward is not None:
        out["exposed_on"] = max(0.0, thread_end(0.0, backward, buckets) - backward)
    return out


def ddp_step(sync: dict[str, float] | None, compute: float, overlap: bool) -> float | None:
    """A DDP step predicted from the same ranks' measured step without communication (`compute`):
    plus every bucket's seconds with overlap off, plus only what runs past backward with it on."""
    if sync is None:
        return None
    return compute + (sync.get("exposed_on", sync["comm"]) if overlap else sync["comm"])
