"""dt plan on a GPU: --check runs dt train there, --timed times its layers there.

Without a GPU the refusals and the argument plumbing are checked (and the timed path on the CPU
under autocast, the same code); with one, a tiny --check of both pricings runs end to end.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from dt.plan import cli
from dt.plan.check import on_gpu, train_argv
from dt.plan.cluster import catalogue_cluster, local_cluster
from dt.plan.compute import stage_compute, timed_dtype, timed_shape
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.timed import adam_seconds, time_stage
from dt.train.cli import parse_args

TINY = ModelShape(2, 2, 32, 44)
GPU = torch.cuda.is_available()


def test_a_catalogue_layout_runs_dt_train_on_the_gpu_in_its_precision():
    argv = train_argv(Layout(), TINY, 8, 16, steps=2, precision="bf16")
    # dt train's own parser checks the layout fits the device: here, where a GPU is, it parses
    assert " ".join(argv).count("--device cuda --precision bfloat16") == 1
    if GPU:
        args = parse_args(argv)
        assert (args.device, args.precision) == ("cuda", "bfloat16")
    args = parse_args(train_argv(Layout(), TINY, 8, 16, steps=2))
    assert (args.device, args.precision) == ("cpu", "float32")
    assert on_gpu(catalogue_cluster("h200", 1, 1)) and not on_gpu(local_cluster(2))


@pytest.mark.skipif(GPU, reason="checks the refusals where torch sees no GPU")
@pytest.mark.parametrize("argv, why", [
    (["--device", "h200", "--check"], "torch sees 0 GPU(s)"),
    (["--device", "h200", "--timed"], "torch sees none here"),
    (["--timed"], "name one"),
    (["--device", "h200", "--hosts", "2", "--check"], "drop --hosts"),
])
def test_gpu_options_without_a_gpu_are_refused_in_one_line(argv, why, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_a_timed_gpu_cluster_times_dt_trains_layers_under_its_autocast():
    """The shape --timed hands dt.plan.timed: float32 weights under bf16 autocast, on cuda, no
    turns on cores; a plain catalogue cluster prices FLOPs (no shape)."""
    timed = catalogue_cluster("h200", 1, 1, "bf16", timed_gpu="NVIDIA H200")
    assert timed.timed == "cuda" and "timed on this host's NVIDIA H200" in timed.source
    assert timed_dtype(timed) == ("float32", "bfloat16")
    stage = {"sequences": 8, "tokens": 16, "keys": 16, "tp": 1, "world": 1, "blocks": 2, "head": True,
             "embed": True}
    shape = timed_shape(timed, TINY, **stage)
    assert shape is not None and (shape.device, shape.autocast) == ("cuda", "bfloat16")
    assert timed_shape(catalogue_cluster("h200", 1, 1), TINY, **stage) is None
    # the same code on the CPU under autocast: the stage and Adam run and take time
    cpu_shape = shape._replace(device="cpu")
    assert statistics.median(time_stage(*cpu_shape)) > 0
    assert adam_seconds((64, 128), 1, "float32", "cpu") > 0


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (dt plan --timed / --check on the device)")
@pytest.mark.timeout(300)
def test_a_tiny_check_on_the_gpu_both_pricings(capsys):
    name = torch.cuda.get_device_name(0)
    cluster = catalogue_cluster("h200", 1, 1, "bf16", timed_gpu=name)
    fwd, bwd = stage_compute(cluster, TINY, sequences=8, tokens=16, keys=16, tp=1, world=1, blocks=2,
                             head=True, embed=True)
    assert 0 < fwd < bwd
    for extra in ([], ["--timed"]):
        assert cli.main(["--device", "h200", "--per-host", "1", "--n-layer", "2", "--n-head", "2",
                         "--n-embd", "32", "--seq", "16", "--global-batch", "8", "--check", "--runs", "1",
                         "--steps", "3", *extra]) == 0
        out = capsys.readouterr().out
        assert f"measured on {name}" in out and "max_memory_allocated" in out
