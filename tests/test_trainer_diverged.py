"""A run that diverges: a NaN loss, or NaN weights, ends `dt train` with exit 1 and one line naming the step,
on every rank, and no checkpoint is written from that step on (dt.train.diverged)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dt import train
from dt.train.diverged import Diverged, check_loss, check_weights

# The default model at a learning rate of 3e3: the loss is 1e8 at step 2 and NaN at step 3.
DIVERGING = ["--steps", "30", "--lr", "3e3", "--no-progress", "--threads", "1"]


def test_a_finite_loss_and_finite_weights_pass_and_others_are_refused():
    check_loss(4, 2.5)
    check_weights(4, 2.5, [torch.ones(3)], 1, torch.device("cpu"))
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(Diverged, match=f"the loss is {bad} at step 4: training diverged"):
            check_loss(4, bad)
    with pytest.raises(Diverged, match=r"weights hold NaN or infinity after step 7 \(its loss was 1e\+08\)"):
        check_weights(7, 1e8, [torch.ones(3), torch.tensor([1.0, math.nan])], 1, torch.device("cpu"))


def _diverge(argv: list[str]) -> tuple[int, str]:
    try:
        train.train_worker(train.parse_args(DIVERGING + argv))
    except Diverged as e:
        return e.step, str(e)
    return 0, "finished"


@pytest.mark.timeout(200)
def test_every_rank_stops_at_the_same_step(run, tmp_path):
    """The NaN loss (no checkpoint), then the NaN weights found before a save: every rank, one step."""
    for argv, first in (([], "the loss is nan at step 3"),
                        (["--checkpoint", str(tmp_path / "c"), "--save-every", "1"],
                         "the weights hold NaN or infinity after step 2")):
        got = run(2, _diverge, ["--dp", "2", *argv])
        assert got[0] == got[1] and first in got[0][1], got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp", [1, 2])
def test_dt_train_exits_1_in_one_line_and_saves_nothing_after_it(tmp_path, capsys, dp):
    from dt.tools.cli import main as dt_main

    ckpt = tmp_path / "ckpt"
    rc = dt_main(["train", "--dp", str(dp), *DIVERGING, "--checkpoint", str(ckpt), "--save-every", "1"])
    out, err = capsys.readouterr()
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("dt train: error: the weights hold NaN or infinity after step ") and \
        "training diverged" in err, err
    step = int(re.search(r"after step (\d+)", err).group(1))
    saved = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))
    assert saved and max(saved) < step, (saved, step)  # the good steps before it, none from it on
    assert "throughput" not in out  # no report of a run that did not finish
