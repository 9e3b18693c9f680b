"""Table 10: all-reduce on the two wires: sockets (gloo's TCP) and shared memory, side by side.

Tables 1, 2 and 7 run dt's algorithms on the torch wire, as the original
design measured them. Here the same processes also run them on the
shared-memory wire (dt.transport.shm): the ring with each message copied
through a shared slot instead of the kernel's socket buffers, and the
load/store algorithms that only a shared segment allows (one-shot: every
rank reads every peer's buffer after one sync; two-shot: reduce-scatter,
then all-gather, by loads). The memcpy column is the physical bound: what one
copy of the buffer by every rank at once costs, measured in the same run.
"""

from __future__ import annotations

from typing import Any

from dt import cost
from dt.bench import report as R
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes

TITLE = "All-reduce on both wires: sockets (gloo) and shared memory"
SHM = ("one_shot@shm", "two_shot@shm")


def needs(s: Any) -> Needs:
    return Needs(allreduce={w: {s.small_bytes, s.big_bytes} for w in s.coll_worlds},
                 algorithms={"ring", "ring@shm", *SHM, "gloo"}, gamma=True)


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    memcpy = getattr(st, "memcpy", {})
    for world in s.coll_worlds:
        for nbytes in sorted({s.small_bytes, s.big_bytes}):
            m = st.coll.get((world, nbytes))
            if m is None or world == 1:
                if m is None:
                    rows.append([world, R.fmt_bytes(nbytes)] + ["not measured"] + ["-"] * 7)
                continue
            gloo = m["gloo"]["time"].median
            best = min(SHM, key=lambda a: m[a]["time"].median)
            t_best = m[best]["time"].median
            _, busbw = cost.bus_bandwidth("all_reduce", nbytes, t_best, world)
            bound = 1 / memcpy[world] / 1e9 if memcpy.get(world) else float("nan")
            rows.append([world, R.fmt_bytes(nbytes), R.fmt_stat_time(m["gloo"]["time"]),
                         R.fmt_stat_time(m["ring"]["time"]), R.fmt_stat_time(m["ring@shm"]["time"]),
                         R.fmt_stat_time(m["one_shot@shm"]["time"]),
                         R.fmt_stat_time(m["two_shot@shm"]["time"]),
                         R.fmt_ratio(gloo / t_best), f"{busbw / 1e9:.2f}", f"{bound:.2f}"])
            data.append({"world": world, "nbytes": nbytes, "best_shm": best,
                         **{f"{a}_time": m[a]["time"] for a in ("gloo", "ring", "ring@shm", *SHM)},
                         "speedup_vs_gloo": gloo / t_best, "busbw_gbps": busbw / 1e9,
                         "memcpy_gbps": bound})
    notes = ["ring: dt's ring on the torch wire (gloo's TCP over loopback); ring@shm: the same "
             "algorithm, its messages through shared-memory channels; one_shot / two_shot: the "
             "load/store all-reduces (dt.collectives.one_shot, two_shot) on plain tensors, copied "
             "into the shared segment once (dt.shm_empty tensors skip even that copy).",
             "speedup = gloo time / the faster load/store time; busbw (nccl-tests' 2(p-1)/p "
             "algbw) of that one, beside memcpy: GB/s of one copy by every rank at once, the "
             "physical bound of anything that moves bytes inside one host."]
    notes += contention_notes([w for w in s.coll_worlds if w > 1], st.cores)
    return Table(10, TITLE, ["world", "size", "gloo", "ring (sockets)", "ring (shm)", "one-shot",
                            "two-shot", "speedup vs gloo", "busbw (GB/s)", "memcpy (GB/s)"],
                 rows, notes, data)


SPEC = TableSpec(10, TITLE, needs, build)
