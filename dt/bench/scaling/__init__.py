"""The scaling study: what distributed training costs on this machine, and where the efficiency went.

    dt bench scaling                  # the full study (about 10 minutes on 2 cores)
    dt bench scaling --quick          # smoke test, under 2 minutes (CI runs it)
    dt bench scaling --tables 1,2,7   # only some tables
    dt bench scaling --update-readme  # also rewrite the README's scaling section

(`python -m dt.bench.scaling` is the same command.) It regenerates, from
measurement on this machine, the tables the original design measured on a
10-core machine (docs/original_design.md has its figures):

1. ring vs naive all-reduce of 33.55 MB at world 2, 4, 8: bytes the busiest rank sent, counted by
   dt's transport (dt.traffic) next to dt.cost's arithmetic, time, and the ring's speedup;
2. the same at 0.26 MB, where the naive all-reduce's 2 steps beat the ring's 2(p-1);
3. data-parallel scaling of the reference model (6 linear layers of 1024, GELU between) at world
   1, 2, 4, 8: s/step, speedup, efficiency, communication fraction, dt's DDP with overlap off and on,
   torch's DDP beside it;
4. the batch sweep at the largest world: speedup, efficiency, comm fraction, compute and comm time;
5. where the efficiency went: each step split into compute, hidden comm, exposed comm, pipeline
   bubble and the rest, summing to 100%;
6. the pipeline bubble measured against (p-1)/(m+p-1), 4 stages, 1, 4 and 16 micro-batches, GPipe,
   1F1B and interleaved 1F1B ((p-1)/(vm+p-1)); stages that compute for real, and stages whose
   compute is a fixed sleep (the schedule's bubble without the cores' contention);
7. predicted vs measured: the alpha-beta-gamma cost model's time for each all-reduce next to the
   measured one, with the latency and bandwidth fitted from this run (or saved by `dt tune`);
8. expert parallel: one mixture-of-experts layer over ep ranks, its two all-to-alls priced and timed;
9. context parallel: Ulysses and ring attention at cp 2 and 4 against one process;
10. all-reduce on both wires: gloo's sockets next to dt's shared memory (ring, one-shot, two-shot)
   and the memcpy bound.

How the figures are taken: every rank runs the same loop in a dt.launcher.WorkerPool (one pool per
world size, reused by every table); each repetition starts after a dt barrier and lasts as long as
its slowest rank; a table shows the median over repetitions and the spread (±half of max-min).
Speedups divide by a single-process step (the whole batch, all cores as threads) that each run
times itself, on rank 0 while the other ranks wait, before and after its data-parallel steps, so
a change in the machine's load between runs cannot fake a speedup.
Cross-rank argument validation is off while timing (dt.transport.set_validation(False)), as
torch.distributed runs without such a check. On a machine with fewer cores than ranks the ranks
share the cores (oversubscribed): those rows measure contention as much as algorithms,
and the output says so.

Where things are (one idea per file):

    reference.py  the original design's sizes       settings.py  StudySettings, quick_settings
    model.py      the arithmetic (cost model terms, fit, breakdown, bubble)
    predicted.py  the cost model's predictions beside the timings, from `dt tune`'s figures
    workers.py    what every rank runs               study.py     Study: plan, measure, aggregate
    tables/       one file per table + the registry  report.py    markdown, JSON, README
    plots.py      the figures                        cli.py       parse_args, main

A new table is one new file in tables/ (tables/__init__.py says how).
"""

from dt.bench.scaling.cli import main, parse_args
from dt.bench.scaling.model import (
    BREAKDOWN_LABELS,
    BREAKDOWN_PARTS,
    MODELED_ALL_REDUCE,
    breakdown,
    fit_alpha_beta,
    model_terms,
    predict,
    scaling_row,
    simulate_bubble,
)
from dt.bench.scaling.predicted import tuned
from dt.bench.scaling.reference import T1_BYTES, T2_BYTES
from dt.bench.scaling.report import command_line, report_markdown, write_outputs
from dt.bench.scaling.settings import StudySettings, quick_settings
from dt.bench.scaling.study import Study, aggregate_dp, aggregate_pipeline
from dt.bench.scaling.tables import ALL_TABLES, BUILDERS, TABLES, TITLES, Table, TableSpec

__all__ = ["ALL_TABLES", "BREAKDOWN_LABELS", "BREAKDOWN_PARTS", "BUILDERS", "MODELED_ALL_REDUCE",
           "T1_BYTES", "T2_BYTES", "TABLES", "TITLES", "Study", "StudySettings", "Table", "TableSpec",
           "aggregate_dp", "aggregate_pipeline", "breakdown", "command_line", "fit_alpha_beta",
           "main", "model_terms", "parse_args", "predict", "quick_settings",
           "report_markdown", "scaling_row", "simulate_bubble", "tuned", "write_outputs"]
