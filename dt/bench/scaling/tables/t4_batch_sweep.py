"""Table 4: the batch sweep at the largest world: efficiency follows compute per gradient byte.

The gradient is the same size at every batch while compute grows with it, so
the communication fraction falls and the efficiency rises with the batch
(growing the model would not help: its bytes and its compute both grow as d^2).
The overlap-off step and its comm sit beside the cost model's (predicted.py, as table 3).
"""

from __future__ import annotations

from typing import Any

from dt.bench import report as R
from dt.bench.ddp import reference_model
from dt.bench.scaling import predicted as P
from dt.bench.scaling.model import scaling_row
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes
from dt.bench.scaling.tables.baseline import dp_t1, superlinear_note, t1_notes

TITLE = "Batch sweep at the largest world size"


def needs(s: Any) -> Needs:
    # each world-N run times its own single-process baseline: no world-1 run needed
    return Needs(dp={(s.sweep_world, b): {"compute", "dt_off", "dt_on"} for b in s.sweep_batches})


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    grad_bytes = 4 * sum(p.numel() for p in reference_model(s.hidden, s.layers).parameters())
    n = s.sweep_world
    for batch in s.sweep_batches:
        m = st.dp.get((n, batch))
        if not m or batch % n:
            continue
        t1 = dp_t1(st, batch)
        off, on, comp = m["dt_off"], m["dt_on"], m["compute"]
        sc_off = scaling_row(t1, off["step"].median, n)
        sc_on = scaling_row(t1, on["step"].median, n)
        frac = off["exposed"].median / off["step"].median
        frac_on = on["exposed"].median / on["step"].median
        sync = P.ddp_sync(n, s.hidden, s.layers, s.dp_algorithm)  # the same gradient at every batch
        pred_comm = sync["comm"] if sync else None
        pred_step = P.ddp_step(sync, comp["step"].median, overlap=False)
        rows.append([f"{batch:,}", batch // n, R.fmt_time(t1), R.fmt_stat_time(off["step"]),
                     P.fmt(pred_step), R.fmt_ratio(sc_off["speedup"]), R.fmt_pct(sc_off["efficiency"]),
                     R.fmt_pct(frac), R.fmt_time(comp["step"].median), R.fmt_time(off["comm"].median),
                     P.fmt(pred_comm), R.fmt_stat_time(on["step"]), R.fmt_pct(sc_on["efficiency"]),
                     R.fmt_pct(frac_on)])
        data.append({"world": n, "global_batch": batch, "per_worker": batch // n, "t1": t1,
                     "step_off": off["step"], "step_off_predicted": pred_step,
                     "comm_predicted": pred_comm, "speedup_off": sc_off["speedup"],
                     "efficiency_off": sc_off["efficiency"], "comm_fraction_off": frac,
                     "compute": comp["step"], "comm": off["comm"], "step_on": on["step"],
                     "speedup_on": sc_on["speedup"], "efficiency_on": sc_on["efficiency"],
                     "comm_fraction_on": frac_on})
    notes = [f"World {n}, the reference model; T1 = the fastest single-process step (all {st.cores} "
             "cores) measured at the same global batch (by rank 0 alone, before and after the run's "
             "data-parallel steps, and in the world-1 run where there is one). "
             "compute = the same ranks' step with no communication, all computing at "
             "once; comm = time the gradient all-reduces ran in the overlap-off step. (model): the "
             "cost model's comm and the step it predicts (compute + comm), as in table 3 ('-': "
             "this world was not tuned).",
             f"Efficiency follows compute per byte of gradient: the gradient is the same "
             f"{R.fmt_bytes(grad_bytes)} at every batch, compute grows with the batch."]
    notes += t1_notes(st, s.sweep_batches)
    notes += superlinear_note([d[k] for d in data for k in ("efficiency_off", "efficiency_on")],
                              st.cores)
    notes += contention_notes([n], st.cores)
    return Table(4, f"{TITLE} (world {n})",
                 ["global batch", "per worker", "T1", "s/step (off)", "(model)", "speedup", "efficiency",
                  "comm fraction", "compute", "comm", "(model)", "s/step (on)", "efficiency (on)",
                  "comm fraction (on)"], rows, notes, data)


SPEC = TableSpec(4, TITLE, needs, build)
