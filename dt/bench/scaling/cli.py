"""`dt bench scaling` / `python -m dt.bench.scaling`: the command line of the study.

parse_args turns options into StudySettings (settings.py); main measures (study.py),
builds the selected tables (tables/), writes results/scaling.{md,json} and the
plots, and with --update-readme the README's scaling section.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dt import args as args_
from dt import record
from dt.bench import report as R
from dt.bench.ddp import STEP_RECORD_BYTES, step_bytes
from dt.bench.scaling import plots, predicted
from dt.bench.scaling.report import command_line, fmt_duration, headline, report_markdown, write_outputs
from dt.bench.scaling.settings import StudySettings, quick_settings
from dt.bench.scaling.study import Study
from dt.bench.scaling.tables import ALL_TABLES, TABLES, needs_of
from dt.collectives import ALGORITHMS
from dt.device import DEVICES, backend_for
from dt.launcher import WorldConflict, launched_rank, launched_size

__all__ = ["main", "parse_args"]

DESCRIPTION = """The scaling study: what distributed training costs on this machine, table by table.

    dt bench scaling                  # the full study, the original design's sizes (~10 min, 2 cores)
    dt bench scaling --quick          # smoke test, under 2 minutes (CI runs it)
    dt bench scaling --tables 1,2,7   # only some tables
    dt bench scaling --update-readme  # also rewrite the README's scaling section

The tables (dt/bench/scaling/tables/, one file each):
""" + "\n".join(f"  {i}. {t.title}" for i, t in TABLES.items()) + """

The original design's figures, which these regenerate: docs/original_design.md.
"""


def parse_args(argv: Sequence[str]) -> tuple[StudySettings, argparse.Namespace]:
    ap = args_.Parser(prog="dt bench scaling", description=DESCRIPTION,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    one, worlds = args_.at_least(1), args_.listed(args_.world)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions (< 2 min)")
    ap.add_argument("--tables", type=args_.listed(one), default=None,
                    help=f"comma-separated table numbers (default all: {','.join(map(str, ALL_TABLES))})")
    ap.add_argument("--worlds", type=worlds, default=None, help="world sizes for the collectives, e.g. 2,4,8")
    ap.add_argument("--dp-worlds", type=worlds, default=None,
                    help="world sizes for data parallel, e.g. 1,2,4,8")
    ap.add_argument("--dp-batch", type=one, default=None, help="global batch of table 3")
    ap.add_argument("--batches", type=args_.listed(one), default=None,
                    help="global batches of table 4, e.g. 256,1024,4096")
    ap.add_argument("--hidden", type=one, default=None, help="width of the reference model")
    ap.add_argument("--layers", type=one, default=None, help="linear layers of the reference model")
    ap.add_argument("--micro", type=args_.listed(one), default=None,
                    help="pipeline micro-batch counts, e.g. 1,4,16")
    ap.add_argument("--stages", type=args_.world, default=None, help="pipeline stages (default 4)")
    ap.add_argument("--reps", type=one, default=None, help="timed repetitions per collective")
    ap.add_argument("--steps", type=one, default=None, help="timed steps per DP / pipeline config")
    ap.add_argument("--big", type=args_.size, default=None, help="bytes of table 1's all-reduce")
    ap.add_argument("--small", type=args_.size, default=None, help="bytes of table 2's all-reduce")
    ap.add_argument("--algorithm", default=None, help="all-reduce algorithm inside dt's DDP")
    ap.add_argument("--no-torch-ddp", action="store_true", help="skip torch's DDP in table 3")
    ap.add_argument("--out", default=None, help="output directory (default results/)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--device", choices=DEVICES, default="auto",
                    help="cpu (gloo), cuda (NCCL, one GPU per rank) or auto (cuda when there is one)")
    ap.add_argument("--update-readme", action="store_true",
                    help="write the tables between the README's scaling markers")
    record.add_option(ap)
    a = ap.parse_args(list(argv))
    unknown = [t for t in a.tables or () if t not in ALL_TABLES]
    if unknown:
        ap.error(f"--tables: no table {', '.join(map(str, unknown))}; the tables are "
                 f"{', '.join(map(str, ALL_TABLES))}")
    if a.algorithm and a.algorithm != "auto" and a.algorithm not in ALGORITHMS["all_reduce"]:
        ap.error(f"--algorithm {a.algorithm!r}: all_reduce has {sorted(ALGORITHMS['all_reduce'])} "
                 "(and auto)")

    s = StudySettings()
    if a.quick:
        quick_settings(s)
    if a.tables:
        s.tables = a.tables
    if a.worlds:
        s.coll_worlds = a.worlds
    if a.dp_worlds:
        s.dp_worlds = a.dp_worlds
    if a.dp_batch:
        s.dp_batch = a.dp_batch
    if a.batches:
        s.sweep_batches = a.batches
    if a.hidden:
        s.hidden = a.hidden
    if a.layers:
        s.layers = a.layers
    if a.micro:
        if max(a.micro) > s.pp_batch:
            ap.error(f"--micro {max(a.micro):,}: more micro-batches than the pipeline's batch of "
                     f"{s.pp_batch:,} rows")
        s.pp_micro = a.micro
    if a.stages:
        s.pp_stages = a.stages
    if a.reps:
        s.coll_reps = a.reps
    if a.steps:
        s.dp_steps = s.pp_steps = a.steps
    if a.big:
        s.big_bytes = a.big
    if a.small:
        s.small_bytes = a.small
    if a.algorithm:
        s.dp_algorithm = a.algorithm
    if a.no_torch_ddp:
        s.torch_ddp = False
    if a.out:
        s.out_dir = Path(a.out)
    s.plots = not a.no_plots
    s.backend = backend_for(a.device)
    s.update_readme = a.update_readme
    if 1 not in s.dp_worlds and s.tables and any(t in s.tables for t in (3, 4, 5)):
        s.dp_worlds = (1, *s.dp_worlds)  # speedup needs the single-process baseline
    _launched(s, a)
    _check_memory(ap, s)
    return s, a


def _check_memory(ap: args_.Parser, s: StudySettings) -> None:
    """What the largest all-reduce and the largest data-parallel step make the ranks of one world
    hold, and the timings the repetitions keep."""
    needs = needs_of(s)
    for world, sizes in sorted(needs.allreduce.items()):
        most = max(sizes)  # one tensor per rank (an algorithm's scratch beside it)
        ap.check_memory(f"an all-reduce of {most:,} B (--big, --small)", most,
                        args_.ranks_on_this_host(world), "the all-reduced tensor")
        timings = world * len(needs.algorithms) * s.coll_reps_for(min(sizes))
        ap.check_memory(f"--reps {s.coll_reps:,}", timings * args_.SAMPLE_BYTES, 1,
                        f"{timings:,} timings of a size, gathered from {world} ranks")
    for (world, batch), impls in sorted(needs.dp.items()):
        ap.check_memory(f"--hidden {s.hidden:,} --layers {s.layers:,} at world {world}, batch {batch:,}",
                        step_bytes(s.hidden, s.layers, -(-batch // world), len(impls)),
                        args_.ranks_on_this_host(world),
                        f"the weights and gradients of {len(impls)} model{'s' * (len(impls) > 1)}, "
                        "and a step's activations")
        records = world * len(impls) * s.dp_steps_for(batch) * STEP_RECORD_BYTES
        ap.check_memory(f"--steps {s.dp_steps:,}", records, 1, f"{world} ranks' step records, gathered")


def _launched(s: StudySettings, a: argparse.Namespace) -> None:
    """Under torchrun the study measures the launched world only (its tables say which worlds they need)."""
    launched = launched_size()
    if launched is None:
        return
    if not a.worlds:
        s.coll_worlds = (launched,)
    other = [w for w in s.worlds_used() if w != launched]
    if other:
        raise WorldConflict(f"tables {','.join(map(str, s.tables))} need world sizes {s.worlds_used()}, but "
                            f"torchrun launched {launched} ranks: choose tables and worlds of {launched} "
                            f"only (e.g. --tables 1,2)")



def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    s, a = parse_args(argv)
    entity = "quick" if a.quick else "study"
    if (status := record.rerun("dt bench scaling", argv, a.record, "scaling", entity)) is not None:
        return status
    command = command_line(argv)
    st = Study(s, progress=not a.no_progress)
    print(f"dt scaling study: tables {', '.join(map(str, s.tables))} on {R.machine_line(st.machine)}")
    for n in s.shrinkage():
        print(f"  - {n}")
    print("  - cross-rank validation is off while timing (dt.transport.set_validation(False))")
    for w in s.worlds_used():
        note = R.oversubscription_note(w, st.cores)
        if note:
            print(f"  - {note}")
    untuned = predicted.how_to_tune(s.worlds_used(), s.backend)
    if untuned and set(s.tables) & set(predicted.PRICED_TABLES):
        print(f"  - {untuned}")
    t0 = time.time()
    try:
        st.measure()
    finally:
        st.close()
    elapsed = time.time() - t0
    for i in s.tables:
        try:
            st.tables[i] = TABLES[i].build(st)
        except Exception as exc:  # noqa: BLE001 - a table missing its data is reported, not fatal
            st.failures.append(f"table {i} could not be built: {type(exc).__name__}: {exc}")
            continue
        print("\n" + st.tables[i].markdown(), flush=True)
    out_dir = s.out_dir if s.out_dir.is_absolute() else Path.cwd() / s.out_dir
    if launched_rank() != 0:  # under torchrun every rank holds the same figures: rank 0 writes them
        return 1 if st.failures else 0
    record.headline(headline(st))
    paths = write_outputs(st, out_dir, command, elapsed)
    if s.plots:
        try:
            paths += plots.write_all(st, out_dir)
        except Exception as exc:  # noqa: BLE001 - the tables and JSON are already on disk
            st.failures.append(f"plots: {type(exc).__name__}: {exc}")
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    if s.update_readme:
        body = report_markdown(st, command, elapsed, for_readme=True)
        readme = Path.cwd() / "README.md"  # --update-readme runs from the checkout
        if R.update_readme(readme, body):
            print(f"updated {readme} between {R.README_BEGIN} and {R.README_END}")
        else:
            print(f"README.md has no {R.README_BEGIN} ... {R.README_END} markers: not updated")
    print(f"done: {fmt_duration(elapsed)} of measurement")
    if st.failures:
        print(f"{len(st.failures)} measurement(s) failed:\n  " + "\n  ".join(st.failures))
        return 1
    return 0
