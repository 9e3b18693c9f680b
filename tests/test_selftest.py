"""`dt selftest`'s checks, run here on gloo (on a GPU machine they run on NCCL).

The checks must pass on correct code and fail on broken code: a deliberately
wrong algorithm is slipped into the registry and must be reported.
"""

from __future__ import annotations

import pytest
import torch

from dt.tools import selftest


def _all_checks() -> list:
    return (selftest.check_collectives((0, 1, 7)) + selftest.check_async_streams()
            + selftest.check_training(steps=2) + selftest.check_pipeline(1 << 16))


def _with_a_broken_ring() -> list:
    from dt.collectives.registry import ALGORITHMS

    good = ALGORITHMS["all_reduce"]["ring"]

    def off_by_one(tensor: torch.Tensor, op: object = None, group: object = None) -> None:
        good(tensor, op, group)
        first = tensor.view(-1)[:1]  # a wrong first element, in every dtype
        first.copy_(first.logical_not() if first.dtype == torch.bool else first + 1)

    ALGORITHMS["all_reduce"]["ring"] = off_by_one
    try:
        return selftest.check_collectives((7,))
    finally:
        ALGORITHMS["all_reduce"]["ring"] = good


@pytest.mark.timeout(200)
def test_every_selftest_check_passes_on_gloo(run):
    rows = run(3, _all_checks, timeout=180)[0]  # an odd world: the folds and uneven chunks
    failed = [r for r in rows if not r[1]]
    assert not failed, failed
    names = " ".join(r[0] for r in rows)
    for expected in ("all_reduce[ring] validation on", "async all_reduce", "dt ZeRO-2", "dt FSDP",
                     "torch DDP", "2-stage pipeline, 1f1b"):
        assert expected in names


def test_selftest_reports_a_wrong_algorithm(run):
    rows = run(2, _with_a_broken_ring, timeout=120)[0]
    bad = {r[0]: r[2] for r in rows if not r[1]}
    assert set(bad) == {"all_reduce[ring] validation on", "all_reduce[ring] validation off"}
    assert "differs from torch" in bad["all_reduce[ring] validation on"]


def test_selftest_cli_refuses_what_it_cannot_do(capsys):
    with pytest.raises(SystemExit) as stop:
        selftest.main(["--checks", "nonsense"])
    assert stop.value.code == 2 and "unknown check(s) nonsense" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as stop:
            selftest.main(["--gpu"])
        assert stop.value.code == 2 and "no GPU" in capsys.readouterr().err
