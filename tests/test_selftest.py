"""`dt selftest`'s checks, run here on gloo (on a GPU machine they run on NCCL).

The checks must pass on correct code and fail on broken code: a deliberately
wrong algorithm (and a barrier that holds nobody) is slipped into the registry
and must be reported. Every collective of the registry has a case, and the
command itself prints no warning of torch's deprecated names.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dt.tools import selftest
from dt.tools.selftest_collectives import CASES

# One per form: every registry collective with its first algorithm, the list forms too.
FORMS = ("all_reduce[ring]", "broadcast[flat]", "reduce[flat]", "all_gather_into_tensor[ring]",
         "all_gather (list)[ring]", "reduce_scatter_tensor[ring]", "reduce_scatter (list)[ring]",
         "all_to_all_single[pairwise]", "all_to_all (list)[pairwise]", "gather[flat]",
         "scatter[flat]", "barrier[dissemination]")


def _all_checks() -> list:
    return (selftest.check_collectives((0, 1, 7)) + selftest.check_async_streams()
            + selftest.check_training(steps=2) + selftest.check_pipeline(1 << 16))


def _with_a_broken_ring_and_barrier() -> list:
    from dt.collectives.registry import ALGORITHMS

    good, good_barrier = ALGORITHMS["all_reduce"]["ring"], ALGORITHMS["barrier"]["dissemination"]

    def off_by_one(tensor: torch.Tensor, op: object = None, group: object = None) -> None:
        good(tensor, op, group)
        first = tensor.view(-1)[:1]  # a wrong first element, in every dtype
        first.copy_(first.logical_not() if first.dtype == torch.bool else first + 1)

    def holds_nobody(group: object = None) -> None:
        pass

    ALGORITHMS["all_reduce"]["ring"] = off_by_one
    ALGORITHMS["barrier"]["dissemination"] = holds_nobody
    try:
        return selftest.check_collectives((7,))
    finally:
        ALGORITHMS["all_reduce"]["ring"] = good
        ALGORITHMS["barrier"]["dissemination"] = good_barrier


@pytest.mark.timeout(200)
def test_every_selftest_check_passes_on_gloo(run):
    rows = run(3, _all_checks, timeout=180)[0]  # an odd world: the folds and uneven chunks
    failed = [r for r in rows if not r[1]]
    assert not failed, failed
    names = " ".join(r[0] for r in rows)
    for expected in ("async all_reduce", "dt ZeRO-2", "dt FSDP", "torch DDP", "2-stage pipeline, 1f1b",
                     *(f"{form} validation {v}" for form in FORMS for v in ("on", "off"))):
        assert expected in names, expected


def test_every_registry_collective_has_a_selftest_case():
    from dt.collectives.registry import ALGORITHMS

    assert {case.collective for case in CASES} == set(ALGORITHMS)


def test_selftest_reports_a_wrong_algorithm(run):
    rows = run(2, _with_a_broken_ring_and_barrier, timeout=120)[0]
    bad = {r[0]: r[2] for r in rows if not r[1]}
    # With validation on, the barrier's validation (an all-gather) holds everyone itself.
    assert set(bad) == {"all_reduce[ring] validation on", "all_reduce[ring] validation off",
                        "barrier[dissemination] validation off"}
    assert "differs from torch" in bad["all_reduce[ring] validation on"]
    assert "the barrier: differs from torch" in bad["barrier[dissemination] validation off"]


@pytest.mark.timeout(600)
def test_the_command_checks_every_form_and_prints_no_future_warning():
    done = subprocess.run([sys.executable, "-m", "dt", "selftest", "--cpu", "--quick"],
                          capture_output=True, text=True, timeout=560,
                          env={**os.environ, "PYTHONWARNINGS": "default"})  # every warning shown
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "FutureWarning" not in done.stderr and "DeprecationWarning" not in done.stderr, \
        done.stderr[-2000:]
    assert " 0 failed" in done.stdout
    for form in FORMS:
        assert f"ok   {form} validation on" in done.stdout, form


def test_selftest_cli_refuses_what_it_cannot_do(capsys):
    with pytest.raises(SystemExit) as stop:
        selftest.main(["--checks", "nonsense"])
    assert stop.value.code == 2 and "unknown check(s) nonsense" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as stop:
            selftest.main(["--gpu"])
        assert stop.value.code == 2 and "no GPU" in capsys.readouterr().err
