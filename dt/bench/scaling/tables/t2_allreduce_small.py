"""Table 2: ring vs naive all-reduce of a small tensor (0.26 MB), where latency decides.

The ring takes 2(p-1) sequential steps, the naive all-reduce 2 (reduce to a
root, broadcast back): at a small size the steps cost more than the bytes and
naive wins. Each time sits beside the cost model's prediction from `dt tune`'s
figures for that world and wire (predicted.py), on both wires. The notes say,
per world, up to which measured size naive still wins on the torch wire.
"""

from __future__ import annotations

from typing import Any

from dt.bench import report as R
from dt.bench.scaling import predicted as P
from dt.bench.scaling.model import model_terms
from dt.bench.scaling.reference import T2_BYTES
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes, ring_and_naive

TITLE = "Ring vs naive all-reduce, 0.26 MB float32 (latency-bound: naive's 2 steps win)"


def needs(s: Any) -> Needs:
    return Needs(allreduce={w: {s.small_bytes} for w in s.coll_worlds},
                 algorithms={"ring", "naive", "gloo", "ring@shm", "naive@shm"})


def crossover_notes(st: Results) -> list[str]:
    """Per world: the largest measured size at which naive still beats the ring, and the next."""
    out = []
    for world in st.s.coll_worlds:
        sizes = sorted(n for (w, n) in st.coll if w == world)
        if len(sizes) < 3:
            continue
        faster = [st.coll[(world, n)]["naive"]["time"].median < st.coll[(world, n)]["ring"]["time"].median
                  for n in sizes]
        if all(faster):
            out.append(f"world {world}: naive is faster at every size up to {R.fmt_bytes(sizes[-1])}")
        elif not any(faster):
            out.append(f"world {world}: the ring is faster at every size from {R.fmt_bytes(sizes[0])}")
        else:
            last = max(k for k, f in enumerate(faster) if f)
            nxt = f", the ring from {R.fmt_bytes(sizes[last + 1])}" if last + 1 < len(sizes) else ""
            out.append(f"world {world}: naive up to {R.fmt_bytes(sizes[last])}{nxt}")
    return out


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    nbytes = s.small_bytes
    for world, found in ring_and_naive(st, nbytes):
        if found is None:
            rows.append([world, "-", "not measured"] + ["-"] * 10)
            continue
        tr, tn = model_terms("ring", nbytes, world), model_terms("naive", nbytes, world)
        for f in found:
            wire, ring, naive, gloo, pred_ring, pred_naive = (f.wire, f.ring, f.naive, f.gloo, f.pred_ring,
                                                              f.pred_naive)
            naive_speedup = ring["time"].median / naive["time"].median
            rows.append([world, wire, tr["steps"], tn["steps"], ring["messages_sent_max"],
                         naive["messages_sent_max"], R.fmt_stat_time(ring["time"]), P.fmt(pred_ring),
                         R.fmt_stat_time(naive["time"]), P.fmt(pred_naive),
                         R.fmt_stat_time(gloo["time"]) if gloo else "-",
                         R.fmt_ratio(naive_speedup), "naive" if naive_speedup > 1 else "ring"])
            data.append({"world": world, "wire": wire, "nbytes": nbytes, "ring_steps": tr["steps"],
                         "naive_steps": tn["steps"], "ring_messages_max": ring["messages_sent_max"],
                         "naive_messages_max": naive["messages_sent_max"], "ring_time": ring["time"],
                         "ring_predicted": pred_ring, "naive_time": naive["time"],
                         "naive_predicted": pred_naive, "gloo_time": gloo["time"] if gloo else None,
                         "naive_speedup": naive_speedup})
    notes = [f"{R.fmt_bytes(nbytes)} = {nbytes:,} B. Steps: sequential message rounds (latency "
             "terms) from dt.cost: the ring pays 2(p-1), naive 2 (reduce, then broadcast). "
             "Messages: the most any rank sent (the root's p-1 sends per phase in naive, which "
             "go out at once).",
             "Time: median of the slowest rank; (model): the cost model's time from that world's and "
             "wire's `dt tune` figures, as in table 1 ('-': not tuned). naive speedup = ring time / "
             "naive time; above 1x the naive all-reduce wins. wire: torch = gloo's sockets, shm = "
             "dt's shared-memory wire."]
    cross = crossover_notes(st)
    if cross:
        notes.append("Where the ring takes over on the torch wire (every measured size, all-reduce "
                     "sweep): " + "; ".join(cross))
    notes += contention_notes(s.coll_worlds, st.cores)
    title = TITLE if nbytes == T2_BYTES else f"Ring vs naive all-reduce, {nbytes / 1e6:.2f} MB float32"
    return Table(2, title, ["world", "wire", "ring steps", "naive steps", "ring msgs", "naive msgs (root)",
                            "ring time", "(model)", "naive time", "(model)", "gloo time", "naive speedup",
                            "faster"], rows, notes, data, align=["r", "l"] + ["r"] * 11)


SPEC = TableSpec(2, TITLE, needs, build)
