"""Table 1: ring vs naive all-reduce of a big tensor (33.55 MB) at world 2, 4, 8.

Bytes the busiest rank sent, counted by dt's transport (dt.traffic) next to
dt.cost's arithmetic, the time of each, and the ring's speedup: the ring's
bytes per rank stay under 2n as p grows, the naive root's grow as (p-1)n.
"""

from __future__ import annotations

from typing import Any

from dt.bench import report as R
from dt.bench.scaling.model import model_terms
from dt.bench.scaling.reference import T1_BYTES
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes

TITLE = "Ring vs naive all-reduce, 33.55 MB float32"


def needs(s: Any) -> Needs:
    return Needs(allreduce={w: {s.big_bytes} for w in s.coll_worlds},
                 algorithms={"ring", "naive", "gloo"})


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    nbytes = s.big_bytes
    for world in s.coll_worlds:
        m = st.coll.get((world, nbytes))
        if m is None:
            rows.append([world] + ["not measured"] + ["-"] * 7)
            continue
        ring, naive, gloo = m["ring"], m["naive"], m["gloo"]
        model_ring = model_terms("ring", nbytes, world)["bytes_sent_max"]
        model_naive = model_terms("naive", nbytes, world)["bytes_sent_max"]
        speedup = naive["time"].median / ring["time"].median
        rows.append([world, R.fmt_bytes(ring["bytes_sent_max"]), R.fmt_bytes(model_ring),
                     R.fmt_bytes(naive["bytes_sent_max"]), R.fmt_bytes(model_naive),
                     R.fmt_stat_time(ring["time"]), R.fmt_stat_time(naive["time"]),
                     R.fmt_stat_time(gloo["time"]), R.fmt_ratio(speedup)])
        data.append({"world": world, "nbytes": nbytes,
                     "ring_bytes_sent_max": ring["bytes_sent_max"], "ring_bytes_model": model_ring,
                     "naive_bytes_sent_max": naive["bytes_sent_max"], "naive_bytes_model": model_naive,
                     "ring_time": ring["time"], "naive_time": naive["time"], "gloo_time": gloo["time"],
                     "ring_speedup": speedup})
    notes = [f"{R.fmt_bytes(nbytes)} = {nbytes:,} B of float32. Bytes: what the busiest rank sent, "
             f"counted by dt.traffic() on one call, next to dt.cost's arithmetic "
             f"(ring 2(p-1)/p n on every rank, naive (p-1) n from the root).",
             "Time: median over repetitions of the slowest rank (± half the min-max spread); "
             "ring speedup = naive time / ring time. gloo: torch.distributed.all_reduce on the same "
             "processes, for reference."]
    notes += contention_notes(s.coll_worlds, st.cores)
    title = TITLE if nbytes == T1_BYTES else f"Ring vs naive all-reduce, {nbytes / 1e6:.2f} MB float32"
    return Table(1, title, ["world", "ring bytes/rank", "(model)", "naive bytes (root)", "(model)",
                            "ring time", "naive time", "gloo time", "ring speedup"], rows, notes, data)


SPEC = TableSpec(1, TITLE, needs, build)
