"""Table 3: data-parallel scaling of the reference model at world 1, 2, 4, 8.

s/step, speedup over one process, efficiency and the communication fraction,
for dt's DDP with overlap off and on, torch's DDP beside it, the same ranks
computing with no communication at all (all at once: not a bound, see the notes),
and the lower bound: the fastest one rank's share was computed (model.share_bound).
dt's rows carry the cost model's gradient sync beside the measured one, and the
step it predicts from the no-communication step (predicted.py: dt.plan's pricing).
"""

from __future__ import annotations

import math
import os
from typing import Any

from dt.bench import report as R
from dt.bench.ddp import reference_model
from dt.bench.scaling import predicted as P
from dt.bench.scaling.model import scaling_row, share_bound
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes
from dt.bench.scaling.tables.baseline import dp_t1, superlinear_note, t1_notes

TITLE = "Data-parallel scaling of the reference model"
LABELS = {"compute": "single process", "dt_off": "dt DDP, overlap off",
          "dt_on": "dt DDP, overlap on", "torch": "torch DDP (gloo)"}
BOUND = "lower bound: one rank's share"  # share_bound's row (and the plot's line)
AT_ONCE = "no communication, ranks at once"  # the "compute" row at world > 1: not a bound


def needs(s: Any) -> Needs:
    dp = {(w, s.dp_batch): {"compute"} if w == 1 else
          {"compute", "dt_off", "dt_on"} | ({"torch"} if s.torch_ddp else set())
          for w in s.dp_worlds}
    return Needs(dp=dp)


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    batch = s.dp_batch
    for world in s.dp_worlds:
        m = st.dp.get((world, batch))
        if not m:
            continue
        t1 = dp_t1(st, batch)
        for impl in (("compute",) if world == 1 else ("bound", "compute", "dt_off", "dt_on", "torch")):
            if impl not in m if impl != "bound" else math.isnan(share_bound(m)):
                continue
            a = m.get(impl, {})
            # The row's own s/step, so speedup = T1 / s/step holds on every row: the world-1
            # run is one of T1's candidates, not T1 itself (rank 0 alone may have beaten it),
            # unless T1 is the one-thread step, which that row then shows.
            one_thread_t1 = world == 1 and batch in st.t1_single_thread
            step = t1 if one_thread_t1 else share_bound(m) if impl == "bound" else a["step"].median
            label = BOUND if impl == "bound" else LABELS[impl] if world == 1 or impl != "compute" else AT_ONCE
            sc = scaling_row(t1, step, world)
            pred_comm = pred_step = None
            if impl.startswith("dt"):
                exposed = a["exposed"].median
                comm = a["comm"].median
                hidden = a["hidden"].median
                sync = P.ddp_sync(world, s.hidden, s.layers, s.dp_algorithm, a["backward_compute"].median)
                pred_comm = sync["comm"] if sync else None
                if "compute" in m:
                    pred_step = P.ddp_step(sync, m["compute"]["step"].median, impl == "dt_on")
            elif impl == "torch":
                # torch's DDP exposes no timers: exposed = its step minus the same ranks' step
                # with no communication (measured in the same run); hidden is not observable.
                exposed = max(0.0, step - m["compute"]["step"].median)
                comm, hidden = math.nan, math.nan
            else:
                exposed, comm, hidden = 0.0, math.nan, math.nan
            frac = exposed / step if step else math.nan
            mb = a["bytes_sent"].median if "bytes_sent" in a else 0.0
            shown = R.fmt_time(step) if one_thread_t1 or impl == "bound" else R.fmt_stat_time(a["step"])
            rows.append([world, label, batch // world, shown, P.fmt(pred_step), R.fmt_time(t1),
                         R.fmt_ratio(sc["speedup"]), R.fmt_pct(sc["efficiency"]), R.fmt_pct(frac),
                         R.fmt_time(comm), P.fmt(pred_comm), R.fmt_time(hidden),
                         R.fmt_bytes(mb) if mb else "-"])
            data.append({"world": world, "impl": impl, "global_batch": batch,
                         "per_worker": batch // world, "step": a.get("step", R.Stat.of([step])),
                         "step_predicted": pred_step,
                         **sc, "comm_fraction": frac, "exposed": exposed, "comm": comm,
                         "comm_predicted": pred_comm, "hidden": hidden, "bytes_sent_max": mb, "t1": t1})
    params = sum(p.numel() for p in reference_model(s.hidden, s.layers).parameters())
    notes = [f"Model: {s.layers} Linear({s.hidden}, {s.hidden}) layers, GELU between: {params:,} "
             f"parameters, {R.fmt_bytes(4 * params)} of float32 gradients all-reduced per step "
             f"(buckets of 25 MB, first 1 MB, algorithm={s.dp_algorithm!r}). Global batch {batch}, "
             f"split evenly; MSE loss, SGD step.",
             "speedup = T1 / s/step, T1 = the fastest single-process step (the whole batch, all cores "
             "as threads) this study measured at the same global batch: in the world-1 run and by "
             "rank 0 alone before and after each world's data-parallel steps, so a speedup is never "
             "flattered by a slow baseline; efficiency = speedup / world. "
             f"'{BOUND}': the fastest one rank's share of the batch was computed in this run: by "
             "rank 0 alone with a rank's threads while the others waited, in the step without "
             "communication, or in a dt DDP step less the wait it exposed (dt's timers); no "
             "data-parallel step takes less than its share's compute, and by this arithmetic the "
             "bound is at most every dt row and the no-communication row (torch's DDP has no "
             f"timers: only the physics holds it above). '{AT_ONCE}': the same ranks' step with the "
             "gradient exchange left out, all computing at once: not a bound, since ranks computing "
             "in step contend for the cores (and memory) more than ranks of which some wait on "
             "the wire, so a DDP step can beat it. "
             "comm fraction = exposed communication / step (what the step waited "
             "for); comm = time the all-reduces ran; hidden = comm - exposed (ran under backward).",
             "(model) beside comm: the gradient's buckets all-reduced one after another, each priced "
             "as `dt plan` prices dt's DDP on this machine (dt.plan.stage.bucket_ready, "
             "dt.plan.comm.collective_seconds: the algorithm dt's auto runs on the shared-memory "
             "wire, at `dt tune --world N`'s swept time for it where the sweep covers the bucket, "
             "else the cost model with its terms); '-': that world was not tuned. (model) beside "
             "s/step: the no-communication step measured in the same run plus that comm (overlap "
             "off), or plus what of it runs past the measured backward (overlap on, "
             "dt.plan.sync.thread_end): only the communication is predicted.",
             f"Each world size runs {os.cpu_count()} cores' worth of threads in all "
             "(torch.set_num_threads(cores // world), at least 1), so compute cannot scale past "
             "the core count: efficiency at world > cores is bounded by cores/world."]
    notes += t1_notes(st, [batch])
    notes += superlinear_note([d["efficiency"] for d in data], st.cores)
    notes += contention_notes(s.dp_worlds, st.cores)
    return Table(3, f"{TITLE} (global batch {batch})",
                 ["world", "implementation", "per worker", "s/step", "(model)", "T1", "speedup",
                  "efficiency", "comm fraction", "comm", "(model)", "hidden", "bytes sent/rank"],
                 rows, notes, data, align=["r", "l"] + ["r"] * 11)


SPEC = TableSpec(3, TITLE, needs, build)
