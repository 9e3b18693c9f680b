"""MFU's peak (dt/train/peak.py), the threads a rank computes with (dt/train/threads.py), the time split.

The peak is one core's float32 matmul rate x the cores the ranks use (threads x ranks, at
most the machine's cores); printed MFU is never above 100% as if true; one process of a
small model computes on one thread, as each rank of two does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dt.cost.compute_rate import cores_used, tuned_core_rate
from dt.train import parse_args, peak
from dt.train.peak import format_mfu, job_peak_flops
from dt.train.threads import WORK_PER_THREAD, default_threads, largest_product_flops

ROOT = Path(__file__).resolve().parent.parent


def test_the_cores_used_are_threads_x_ranks_at_most_the_machine_s():
    assert cores_used(1, 1, 2) == 1  # one rank of one thread: one core's rate, not the machine's
    assert cores_used(1, 2, 2) == 2  # two ranks of one thread: two cores
    assert cores_used(2, 1, 2) == 2
    assert cores_used(2, 4, 2) == 2  # oversubscribed: the ranks share the 2 cores
    assert cores_used(1, 2, 16, hosts=3) == 6  # under torchrun: each host's ranks x the hosts


def test_the_peak_is_the_per_core_rate_x_the_cores(monkeypatch):
    monkeypatch.setattr(peak, "measure_core_rate", lambda: 10e9)
    monkeypatch.setattr(peak, "tuned_core_rate", lambda cores: None)
    assert job_peak_flops(None, 1, "cpu", torch.float32, 1, 1, cores=2)[0] == 10e9
    total, source = job_peak_flops(None, 2, "cpu", torch.float32, 1, 2, cores=2)
    assert total == 20e9 and "10.0 GFLOP/s per core" in source and "x 2 core(s)" in source
    assert job_peak_flops(None, 4, "cpu", torch.float32, 1, 2, cores=2)[0] == 40e9  # 2 hosts of 2 ranks
    assert job_peak_flops(None, 8, "cpu", torch.float32, 1, 8, cores=2)[0] == 20e9  # 8 ranks on 2 cores
    monkeypatch.setattr(peak, "tuned_core_rate", lambda cores: 30e9)  # dt tune saw a faster core
    total, source = job_peak_flops(None, 2, "cpu", torch.float32, 1, 2, cores=2)
    assert total == 60e9 and "dt tune's one-thread figure" in source
    monkeypatch.setattr(peak, "tuned_core_rate", lambda cores: 1e9)  # tuned on a busy machine: not used
    assert job_peak_flops(None, 2, "cpu", torch.float32, 1, 2, cores=2)[0] == 20e9
    assert job_peak_flops(1e12, 4, "cuda", torch.bfloat16, 1, 4)[0] == 4e12  # a datasheet's, x devices


def test_dt_tune_s_core_rate_is_its_fastest_one_thread_figure():
    entry = {"cores": 2, "rates": {"1": {"float32": [[256, 64, 256, 40e9], [2048, 768, 3072, 70e9]]},
                                   "2": {"float32": [[256, 64, 256, 0.6e9]]}}}
    assert tuned_core_rate(entry, cores=2) == 70e9  # the 2-thread figure (contention) is not a core's
    assert tuned_core_rate(entry, cores=16) is None  # another machine's figure
    assert tuned_core_rate({"cores": 2, "rates": {"2": {"float32": [[1, 1, 1, 5e9]]}}}, cores=2) is None


def test_one_core_s_rate_is_measured_on_one_thread():
    threads = torch.get_num_threads()
    assert peak.measure_core_rate(n=128, repeats=3) > 0
    assert torch.get_num_threads() == threads  # put back


def test_an_mfu_above_100_percent_is_never_printed_as_a_figure():
    assert format_mfu(0.5) == "50.00%" and format_mfu(1.0) == "100.00%"
    for over in (1.01, 2.82, 40.79):
        text = format_mfu(over)
        assert text.startswith(">100%") and "underestimated" in text and "%" not in text.split(">100%")[1][:3]


def test_a_small_model_computes_on_one_thread_per_rank(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    for mesh in ([], ["--dp", "2"], ["--tp", "2", "--pp", "2"]):
        assert parse_args(["--steps", "1", *mesh]).threads == 1, mesh  # the default model: 8 MFLOP
    assert parse_args(["--steps", "1", "--threads", "3"]).threads == 3  # asked for: kept
    big = parse_args(["--steps", "1", "--n-embd", "768", "--n-head", "12", "--block-size", "1024",
                      "--batch-size", "8"])
    assert largest_product_flops(big) > 16 * WORK_PER_THREAD and big.threads == 16  # cores // ranks
    assert default_threads(big, 4, 16) == 4 and default_threads(big, 32, 16) == 1


def _printed_mfus(text: str) -> list[str]:
    return re.findall(r"MFU (>100%|[-0-9.]+%)", text)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dp", [1, 2])
def test_every_printed_mfu_lies_in_0_to_100_percent(tmp_path, dp):
    """On this machine, with dt train's own defaults (threads, peak) and no dt tune figures: its own
    process, so the workers' progress lines (stderr, no terminal) are read too."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "dt", "train", "--dp", str(dp), "--steps", "10"],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    mfus = _printed_mfus(text)
    assert len(mfus) >= 10, text  # the report's two and the progress lines'
    for figure in mfus:
        assert figure != ">100%" and 0 < float(figure[:-1]) <= 100, (figure, text)
    assert f"x {dp} core(s) (1 thread(s) x {dp} rank(s)" in done.stdout, text
    # the time split: each rank's parts of its own loop's wall time, so together at most all of it
    shares = [float(s) for s in re.findall(r"^  (?:compute|communication|bubble) +[0-9.]+ s +([0-9.]+)%$",
                                            done.stdout, re.M)]
    assert len(shares) == 3 and sum(shares) <= 100.0 + 0.3, done.stdout  # + rounding
