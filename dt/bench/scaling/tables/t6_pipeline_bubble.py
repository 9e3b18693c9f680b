"""Table 6: the pipeline bubble measured against (p-1)/(m+p-1).

4 stages, 1, 4 and 16 micro-batches, GPipe, 1F1B and interleaved 1F1B
((p-1)/(vm+p-1)); stages that compute for real, and stages whose compute is a
fixed sleep (the schedule's bubble without the cores' contention), next to the
formula and the schedule's own order played out with free messages.
"""

from __future__ import annotations

from typing import Any

from dt.bench import report as R
from dt.bench.scaling.model import schedules_offered, simulate_bubble
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec
from dt.parallel.pipeline import bubble_fraction

TITLE = "Pipeline bubble: measured vs (p-1)/(m+p-1)"


def needs(s: Any) -> Needs:
    kinds = ["linear"] + (["timed"] if s.pp_timed_s > 0 else [])
    pipeline = [(kind, sched, m) for kind in kinds for sched in schedules_offered(s.pp_virtual)
                for m in s.pp_micro if m <= s.pp_batch]
    return Needs(pipeline=pipeline, stages=s.pp_stages)


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    p = s.pp_stages
    order = {"gpipe": 0, "1f1b": 1, "interleaved": 2}
    configs = sorted({(sched, m) for _, sched, m in st.pp}, key=lambda c: (order.get(c[0], 3), c[1]))
    for sched, m in configs:
        v = st.pp_virtual(sched)
        theory = bubble_fraction(p, m, v)
        exact = simulate_bubble(sched, p, m, v)
        lin, timed = st.pp.get(("linear", sched, m)), st.pp.get(("timed", sched, m))
        name = f"{sched} (v={v})" if v > 1 else sched
        row: list[Any] = [name, m, R.fmt_pct(theory, 1), R.fmt_pct(exact, 1)]
        entry: dict[str, Any] = {"schedule": sched, "virtual": v, "stages": p, "micro_batches": m,
                                 "theory": theory, "schedule_exact": exact}
        for kind, a in (("timed", timed), ("linear", lin)):
            if a is None:
                row += ["-", "-"] if kind == "timed" else ["-", "-", "-", "-"]
                continue
            per_stage = a["bubble_per_stage"]
            spread = f"{R.fmt_pct(min(per_stage))}..{R.fmt_pct(max(per_stage))}"
            row += [R.fmt_pct(a["bubble"].median, 1), spread]
            if kind == "linear":
                row += [R.fmt_stat_time(a["step"]), max(a["peak_stash"])]
            entry[kind] = {"measured": a["bubble"], "per_stage": per_stage, "step": a["step"],
                           "peak_stash": a["peak_stash"], "bytes_sent_max": a["bytes_sent_max"]}
        entry["measured"] = (timed or lin)["bubble"]
        rows.append(row)
        data.append(entry)
    notes = ["formula: (p-1)/(m+p-1), (p-1)/(vm+p-1) interleaved. schedule: the bubble of "
             "dt.pipeline's own action order played out with free messages (simulate_bubble; "
             "backward = 2x forward); it equals the formula except interleaving with m not a "
             "multiple of p, whose last group of micro-batches cannot fill the virtual stages.",
             f"{p} stages, batch {s.pp_batch} cut into m micro-batches, dt.pipeline.Pipeline."
             "train_step (forward and backward). Measured bubble: each stage's idle time (blocked "
             "receiving or on its last sends, plus waiting for the slowest stage to finish) over "
             "the pipeline's step (the slowest stage's), averaged over stages (range over stages "
             "beside it); median over steps.",
             f"timed stages: each stage's forward takes {s.pp_timed_s * 1e3:g} ms and its backward "
             f"{2 * s.pp_timed_s * 1e3:g} ms per micro-batch without holding a core (a sleep), so "
             "the bubble is the schedule's alone, free of core sharing; what it shows above the "
             "formula is message latency.",
             f"linear stages: {s.pp_blocks_per_stage} (Linear({s.pp_hidden}), GELU) blocks each, "
             "real compute. Idle time includes the wire time of activations and gradients. Peak "
             "stash: the most micro-batches whose activations any stage held (GPipe m, 1F1B at "
             "most p; interleaved: (chunk, micro-batch) pairs, p v + p - 1 when p divides m >= 2p)."]
    if "interleaved" in st.pp_schedules():
        v = s.pp_virtual
        notes.append(f"interleaved (v={v}): each rank holds {v} chunks of 1/{v} the layers (Megatron's "
                     f"interleaved 1F1B); the formula is (p-1)/(v m + p-1), bought with {v} times the "
                     "messages.")
    if p > st.cores:
        notes.append(f"{p} stages > {st.cores} cores (oversubscribed): linear stages busy at the "
                     "same time share the cores, so a full pipe computes slower per stage than a "
                     "filling one; that distorts their bubble in both directions, which is why the "
                     "timed stages are shown first.")
    return Table(6, f"{TITLE} ({p} stages)",
                 ["schedule", "micro-batches", "formula", "schedule", "timed stages", "per stage",
                  "linear stages", "per stage", "s/step (linear)", "peak stash"], rows, notes, data)


SPEC = TableSpec(6, TITLE, needs, build)
