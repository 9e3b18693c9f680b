"""Table 5: where the efficiency went: each step split into parts that sum to 100%.

compute, hidden communication (under backward), exposed communication, the
pipeline bubble and the rest (Python, contention, idle), for the data-parallel
configurations of tables 3 and 4 and the pipeline schedules of table 6; beside
the exposed communication, the cost model's (predicted.py, as table 3).
"""

from __future__ import annotations

import math
from typing import Any

from dt.bench import report as R
from dt.bench.scaling import predicted as P
from dt.bench.scaling.model import BREAKDOWN_LABELS, BREAKDOWN_PARTS, breakdown, schedules_offered
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes
from dt.bench.scaling.tables.baseline import dp_t1

TITLE = "Where the efficiency went: each step split into parts that sum to 100%"


def needs(s: Any) -> Needs:
    dp = {(w, s.dp_batch): {"compute"} if w == 1 else {"compute", "dt_off", "dt_on"}
          for w in s.dp_worlds}
    pipeline = [("linear", sched, m) for sched in schedules_offered(s.pp_virtual)
                for m in s.pp_micro if m <= s.pp_batch]
    return Needs(dp=dp, pipeline=pipeline, stages=s.pp_stages)


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []

    def add(label: str, step: float, compute: float, exposed: float, hidden: float,
            bubble: float, efficiency: float, extra: dict[str, Any],
            predicted: float | None = None) -> None:
        parts = breakdown(step, compute, exposed, hidden, bubble)
        # the predicted exposed seconds as a share of the measured step, beside the measured share
        share = None if predicted is None else predicted / step
        cells = [R.fmt_pct(parts[k]) for k in BREAKDOWN_PARTS]
        cells.insert(BREAKDOWN_PARTS.index("exposed_comm") + 1, "-" if share is None else R.fmt_pct(share))
        rows.append([label, R.fmt_time(step), *cells, R.fmt_pct(sum(parts.values())), R.fmt_pct(efficiency)])
        data.append({"configuration": label, "step": step, **parts, "exposed_comm_predicted": share,
                     "efficiency": efficiency, **extra})

    # table 3's configurations, then table 4's where they were measured (the sweep's world)
    configs = [(w, s.dp_batch) for w in s.dp_worlds]
    configs += [(s.sweep_world, b) for b in s.sweep_batches if b != s.dp_batch]
    for world, batch in configs:
        m = st.dp.get((world, batch))
        if not m:
            continue
        t1 = dp_t1(st, batch)
        if world == 1:
            step = t1
            add(f"DP world 1, batch {batch}", step, step, 0.0, 0.0, 0.0, 1.0, {"world": 1})
            continue
        for impl, name in (("dt_off", "overlap off"), ("dt_on", "overlap on")):
            if impl not in m:
                continue
            a = m[impl]
            step = a["step"].median
            compute = a["forward"].median + a["backward_compute"].median + a["optimizer"].median
            on = impl == "dt_on"
            sync = P.ddp_sync(world, s.hidden, s.layers, s.dp_algorithm, a["backward_compute"].median)
            add(f"DP world {world}, batch {batch}, {name}", step, compute, a["exposed"].median,
                a["hidden"].median, 0.0, t1 / step / world, {"world": world, "impl": impl},
                None if sync is None else sync["exposed_on"] if on else sync["comm"])
    for (kind, sched, mb), a in sorted(st.pp.items()):
        if kind != "linear":
            continue
        step = a["step"].median
        v = st.pp_virtual(sched)
        name = f"{sched} v={v}" if v > 1 else sched
        add(f"PP {s.pp_stages} stages, {name}, m={mb}", step, a["compute"].median, 0.0, 0.0,
            a["idle"].median, math.nan, {"stages": s.pp_stages, "schedule": sched, "micro": mb})
    notes = ["Each row splits one step's wall time (median over steps; per-rank figures averaged "
             "over ranks): compute = forward + backward + optimizer with nothing under it; hidden "
             "comm = backward time during which an all-reduce ran underneath (the overlap); exposed "
             "comm = time waiting for the all-reduces after backward; pipeline bubble = a stage "
             "waiting on its neighbours (includes the time its activations spent on the wire); "
             "rest = the remainder (Python, contention between ranks sharing cores, idle). "
             "(model) beside exposed comm: the cost model's, over the measured step: every "
             "bucket's all-reduce with overlap off, what runs past the measured backward with it "
             "on (as table 3; '-': not a data-parallel row, or a world not tuned); it is not part "
             "of the sum.",
             "efficiency (not part of the sum) = T1 / (world x step). Compute at world N includes "
             "the slowdown of ranks that share cores, so on this machine part of the lost "
             "efficiency hides inside 'compute' (compare its seconds with T1/N in table 3)."]
    notes += contention_notes(sorted({w for w, _ in configs} | {s.pp_stages}), st.cores)
    labels = [BREAKDOWN_LABELS[k] for k in BREAKDOWN_PARTS]
    labels.insert(BREAKDOWN_PARTS.index("exposed_comm") + 1, "(model)")
    return Table(5, TITLE, ["configuration", "step", *labels, "sum", "efficiency"], rows, notes, data,
                 align=["l"] + ["r"] * (len(labels) + 3))


SPEC = TableSpec(5, TITLE, needs, build)
