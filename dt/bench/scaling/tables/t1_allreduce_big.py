"""Table 1: ring vs naive all-reduce of a big tensor (33.55 MB) at world 2, 4, 8, on both wires.

Bytes the busiest rank sent, counted by dt's transport (dt.traffic) next to
dt.cost's arithmetic, the time of each next to the cost model's prediction
from `dt tune`'s figures for that world and wire (predicted.py), and the
ring's speedup: the ring's bytes per rank stay under 2n as p grows, the
naive root's grow as (p-1)n.
"""

from __future__ import annotations

from typing import Any

from dt.bench import report as R
from dt.bench.scaling import predicted as P
from dt.bench.scaling.model import model_terms
from dt.bench.scaling.reference import T1_BYTES
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes, ring_and_naive

TITLE = "Ring vs naive all-reduce, 33.55 MB float32"


def needs(s: Any) -> Needs:
    return Needs(allreduce={w: {s.big_bytes} for w in s.coll_worlds},
                 algorithms={"ring", "naive", "gloo", "ring@shm", "naive@shm"})


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    nbytes = s.big_bytes
    for world, found in ring_and_naive(st, nbytes):
        if found is None:
            rows.append([world, "-", "not measured"] + ["-"] * 9)
            continue
        model_ring = model_terms("ring", nbytes, world)["bytes_sent_max"]
        model_naive = model_terms("naive", nbytes, world)["bytes_sent_max"]
        for f in found:
            wire, ring, naive, gloo, pred_ring, pred_naive = (f.wire, f.ring, f.naive, f.gloo, f.pred_ring,
                                                              f.pred_naive)
            speedup = naive["time"].median / ring["time"].median
            rows.append([world, wire, R.fmt_bytes(ring["bytes_sent_max"]), R.fmt_bytes(model_ring),
                         R.fmt_bytes(naive["bytes_sent_max"]), R.fmt_bytes(model_naive),
                         R.fmt_stat_time(ring["time"]), P.fmt(pred_ring),
                         R.fmt_stat_time(naive["time"]), P.fmt(pred_naive),
                         R.fmt_stat_time(gloo["time"]) if gloo else "-",
                         R.fmt_ratio(speedup)])
            data.append({"world": world, "wire": wire, "nbytes": nbytes,
                         "ring_bytes_sent_max": ring["bytes_sent_max"], "ring_bytes_model": model_ring,
                         "naive_bytes_sent_max": naive["bytes_sent_max"], "naive_bytes_model": model_naive,
                         "ring_time": ring["time"], "ring_predicted": pred_ring,
                         "naive_time": naive["time"], "naive_predicted": pred_naive,
                         "gloo_time": gloo["time"] if gloo else None, "ring_speedup": speedup})
    notes = [f"{R.fmt_bytes(nbytes)} = {nbytes:,} B of float32. Bytes: what the busiest rank sent, "
             f"counted by dt.traffic() on one call, next to dt.cost's arithmetic "
             f"(ring 2(p-1)/p n on every rank, naive (p-1) n from the root).",
             "Time: median over repetitions of the slowest rank (± half the min-max spread); "
             "(model): the cost model's time from the figures `dt tune --world N` saved for that world "
             "and wire, with its terms, as table 7 and `dt model all_reduce --measured` price it "
             "('-': that world was not tuned). ring speedup = naive time / ring time. wire: torch = "
             "gloo's sockets, shm = dt's shared-memory wire; gloo: torch.distributed.all_reduce on "
             "the same processes, for reference."]
    notes += contention_notes(s.coll_worlds, st.cores)
    title = TITLE if nbytes == T1_BYTES else f"Ring vs naive all-reduce, {nbytes / 1e6:.2f} MB float32"
    return Table(1, title, ["world", "wire", "ring bytes/rank", "(model)", "naive bytes (root)", "(model)",
                            "ring time", "(model)", "naive time", "(model)", "gloo time", "ring speedup"],
                 rows, notes, data, align=["r", "l"] + ["r"] * 10)


SPEC = TableSpec(1, TITLE, needs, build)
