"""One worker pool per world size, started once and reused by every test.

`run(world, fn, *args)` runs the module-level function `fn` on `world`
processes that already hold a gloo process group, and returns each rank's
result. A run that fails restarts its pool, so one failing test cannot poison
the next. Every run has a timeout; pytest-timeout bounds every test as well.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest

from dt import record
from dt.launcher import WorkerPool

WORLD_SIZES = (1, 2, 3, 4, 5, 8)

# The pools' workers fork from a fork server that imports dt before it forks them, with the
# interpreter's own sys.path (Python 3.11's fork server ignores the parent's): without this, a
# checkout tested beside another installed dt (an editable install of another worktree) would
# run that other dt in the workers. Subprocesses the tests start inherit it too.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
# A suite run under `python -m dt.record` declares the record's headline itself (pytest's summary,
# below): rerun takes the variable out of the environment as every dt command does, so the commands
# its tests run cannot declare one (each would overwrite it with its own).
record.rerun("pytest", [], None, "tests", "suite")
HEADLINE_FILE = record.take_headline_file()  # the suite's alone: no command a test runs in-process
STARTED = time.monotonic()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    """The recorded run's headline: what passed, failed, erred and was skipped, and how long it took.
    Only the whole suite's: a run narrowed by path, mark or keyword (-m quick) is recorded without
    one, so README's results table keeps naming what CI runs."""
    if HEADLINE_FILE is None or _narrowed(terminalreporter.config):
        return
    kinds = ("passed", "failed", "error", "skipped")
    said = ", ".join(f"{n} {kind}" for kind in kinds if (n := len(terminalreporter.stats.get(kind, []))))
    seconds = round(time.monotonic() - STARTED)
    record.headline(f"{said or 'no tests'} in {seconds // 60} min {seconds % 60} s (exit {exitstatus})",
                    to=HEADLINE_FILE)


def _narrowed(config: pytest.Config) -> bool:
    """Whether the run chose some of the tests: by path (anything but the tests directory), mark,
    keyword, deselection, an ignored path or the last failures."""
    base = config.rootpath if config.args_source == pytest.Config.ArgsSource.TESTPATHS else \
        config.invocation_params.dir
    paths = {os.path.abspath(os.path.join(base, arg)) for arg in config.args}
    chosen = (config.option.markexpr, config.option.keyword, config.option.deselect, config.option.ignore,
              config.option.ignore_glob, getattr(config.option, "lf", False))
    return paths != {os.path.join(ROOT, "tests")} or any(chosen)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_temp_dirs():
    """Fails the session if a dt-* temporary directory it made is left behind.

    The session (and every worker it starts: they inherit TMPDIR) makes its
    temporary files in a directory of its own, so another run's leftovers on
    a shared machine cannot fail this one; it is removed at the end.
    """
    # multiprocessing's own directory for this process stays where it is: it removes it at exit,
    # after this fixture has removed the private one
    multiprocessing.util.get_temp_dir()
    private = tempfile.mkdtemp(prefix="dt-suite-")
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = private, None
    yield
    if saved is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved
    tempfile.tempdir = None
    left = sorted(name for name in os.listdir(private) if name.startswith("dt-"))
    shutil.rmtree(private, ignore_errors=True)
    assert not left, f"the suite left {len(left)} dt-* temporary directories behind: {', '.join(left[:5])}"


@pytest.fixture(autouse=True)
def whole_timing_budget(monkeypatch):
    """Each test plans with the planner's whole timing budget (dt.plan.timed.BUDGET): it is spent per
    process, and a whole suite's plans would otherwise spend it, leaving later tests' stages priced
    by rate instead of timed. The timings themselves stay cached (each shape timed once a process)."""
    from dt.plan import timed

    monkeypatch.setattr(timed, "BUDGET", timed.TimingBudget())


@pytest.fixture(scope="session")
def pools():
    cache: dict[int, WorkerPool] = {}

    def get(world: int) -> WorkerPool:
        if world not in cache:
            cache[world] = WorkerPool(world)
        return cache[world]

    yield get
    for pool in cache.values():
        pool.close()


@pytest.fixture(scope="session")
def run(pools) -> Callable[..., list[Any]]:
    def _run(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0,
             **kwargs: Any) -> list[Any]:
        return pools(world).run(fn, *args, timeout=timeout, **kwargs)

    return _run


# -- python -m pytest -m quick: the edit-test loop ---------------------------------------------------
# Under 2 minutes on 2 cores: the files of arithmetic, parsing and single-process checks (less their
# slow tests), and from the files that start processes one small multi-rank test per layer. The
# full suite (.ci/run) runs everything. tests/test_quick_subset.py holds every name here to a test
# that exists, so a renamed test cannot drop out unnoticed. A test may also carry
# @pytest.mark.quick itself.
QUICK_FILES: dict[str, tuple[str, ...]] = {  # file: its tests left out (slow ones)
    "test_architecture.py": (),
    "test_cluster_list.py": (),
    "test_corpus.py": (),
    "test_cost_terms.py": ("test_tunes_quick_term_benchmarks_agree_on_every_rank",),
    "test_devices.py": ("test_tune_measures_and_saves_the_matmul_rate",),
    "test_docs.py": (),
    "test_families.py": (),
    "test_flops.py": ("test_moe_layer_against_torch_counter", "test_torch_flop_counter_agrees_exactly"),
    "test_grid.py": (),  # its one multi-rank test: the mesh's groups
    "test_harness.py": ("test_study_counts_what_the_cost_model_predicts", "test_every_case_matches_torch"),
    "test_hosts.py": (),
    "test_inputs.py": ("test_a_bad_transport_stops_dt_demo_at_once",
                       "test_a_script_outside_the_cli_gets_one_error_not_one_per_rank"),
    "test_learn_quiz.py": (),
    "test_levels.py": (),
    "test_memory_tracker.py": ("test_rank_memory_predicts_the_measured_step",
                               "test_model_forward_keeps_the_activation_formula_and_backward_frees_it"),
    "test_packaging.py": (),
    "test_pipeline_interleaved.py": ("test_the_pipeline_runs_it_like_one_process",
                                     "test_dt_train_runs_it_like_the_plain_model"),
    "test_pipeline_lockstep.py": (),
    "test_plain_models.py": ("test_llama_is_causal_learns_and_refuses_bad_configs",
                             "test_plain_gpt_learns_and_samples"),
    "test_plan.py": (),  # the planner: its enumeration, pricing and command line
    "test_plan_cli.py": ("test_ties_are_marked_and_ordered_by_memory",),
    "test_plan_pricing.py": (),
    "test_plan_timed.py": (),
    "test_plots.py": ("test_dt_plans_and_benchs_titles_fit",),
    "test_published_data.py": (),
    "test_quick_start.py": (),
    "test_registry.py": (),
    "test_trainer_mfu.py": ("test_every_printed_mfu_lies_in_0_to_100_percent",),
    "test_trainer_options.py": ("test_a_checkpoint_resumes_without_its_model_options_and_refuses_others",
                                "test_the_start_line_counts_the_plain_models_parameters_and_a_steps_tokens"),
    "test_tune_estimator.py": (),
    "test_units.py": (),
}
QUICK_TESTS = (  # "file::test" (every parameter) or "file::test[parameter]"
    # single-process tests of files that otherwise start processes
    "test_checkpoints.py::test_flat_blocks_cut_any_range_into_contiguous_boxes",
    "test_checkpoints.py::test_shard_blocks_tile_the_tensor_and_intersect",
    "test_checkpoints.py::test_a_bad_latest_falls_back_with_one_warning_and_alone_is_refused_in_one_line",
    "test_checkpoints.py::test_round_trip_keep_and_nothing_left_by_a_failed_save",
    "test_dropin.py::test_signature_is_torchs_plus_keyword_only_extras",
    "test_faults.py::test_bad_command_lines_are_one_line_and_exit_2",
    "test_bench_collectives.py::test_the_sweeps_end_points",
    "test_bench_collectives.py::test_the_fastest_dt_row_counts_auto",
    # one small multi-rank test per layer
    "test_shm_wire.py::test_traffic_per_wire_equals_cost_model[2]",  # the wire
    "test_launcher.py::test_first_exception_propagates_with_rank_and_traceback",  # processes
    "test_collectives.py::test_all_gather_and_reduce_scatter[2]",  # collectives
    "test_ring_reference.py::test_reference_ring_equals_engine[shm-2]",
    "test_backend.py::test_plain_dist_script_on_dt_equals_gloo[2]",  # the torch backend
    "test_data_parallel.py::test_grads_match_single_worker[2]",  # the parallelisms
    "test_tensor_parallel.py::test_layers_match_unsharded_reference[2]",
    "test_pipeline.py::test_schedules_match_unpipelined[2]",
    "test_zero.py::test_zero_matches_data_parallel_and_formulas[2-optimizers0]",
    "test_step.py::test_layouts_follow_the_plain_model[2-runs0]",  # the trainer
    "test_bench_collectives.py::test_rows_are_printed_as_each_size_is_measured",  # the benchmarks
)


def in_quick_subset(file: str, test: str) -> bool:
    """Whether `file::test` (test with its [parameters], if any) is in `-m quick`."""
    bare = test.split("[")[0]
    if file in QUICK_FILES:
        return bare not in QUICK_FILES[file]
    return f"{file}::{test}" in QUICK_TESTS or f"{file}::{bare}" in QUICK_TESTS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path, _, test = item.nodeid.partition("::")
        if in_quick_subset(os.path.basename(path), test):
            item.add_marker(pytest.mark.quick)
