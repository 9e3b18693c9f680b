"""The device catalogue: figures as their sources print them, consistent; dt tune's matmul rates."""

from __future__ import annotations

import pytest

from dt.cost.devices import DEVICES, device


def test_catalogue_figures_and_sources():
    a100, h100, h200 = device("a100"), device("H100"), device("h-200")
    assert a100.peak_flops["bf16"] == 312e12 and a100.peak_flops["tf32"] == 156e12
    assert h100.peak_flops["bf16"] == pytest.approx(989.4e12) and h100.hbm_bandwidth == 3.35e12
    assert h200.hbm_bytes == 141e9 and h200.hbm_bandwidth == 4.8e12
    assert h200.peak_flops == h100.peak_flops  # the same compute, more and faster memory
    assert a100.nvlink_bandwidth * 2 == 600e9 and h100.nvlink_bandwidth * 2 == 900e9  # both ways
    assert a100.nic_bandwidth * 8 == 200e9 and h100.nic_bandwidth * 8 == 400e9  # HDR, NDR in bits
    for d in DEVICES.values():
        for figure in ("peak_flops", "hbm", "nvlink_bandwidth", "nvlink_latency", "nic_bandwidth",
                       "nic_latency"):
            assert "http" in d.sources[figure] or "Table" in d.sources[figure], (d.name, figure)
        # the one fitted figure names the fit that sets it (no datasheet prints a sustained GEMM rate)
        assert "dt plan --published --fit" in d.sources["matmul_efficiency"], d.name
        # every figure the kernel pricing reads (dt.plan.pricing) says where it comes from
        for figure in ("attention_efficiency", "hbm_efficiency", "sms", "gemm_tile", "link_efficiency",
                       "kernel_overhead"):
            assert len(d.sources[figure]) > 40, (d.name, figure)
        assert 0 < d.matmul_efficiency["bf16"] < 1 and 0 < d.hbm_efficiency < 1
        assert all(0 < f <= 1 and 0 < b <= 1 for f, b in d.attention_efficiency.values())
        assert d.sustained_flops("bf16") == d.peak_flops["bf16"] * d.matmul_efficiency["bf16"]
        assert d.nvlink_bandwidth > d.nic_bandwidth and d.nvlink_latency < d.nic_latency


def test_bad_names_are_one_line():
    with pytest.raises(ValueError, match="no device 'v100' in the catalogue: one of a100, h100, h200"):
        device("v100")
    with pytest.raises(ValueError, match="no figure for dtype 'fp8'"):
        device("h100").sustained_flops("fp8")


def test_tune_measures_and_saves_the_matmul_rate(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from dt.cost import machine
    from dt.cost.compute_rate import compute_entry, matmul_rate
    from dt.tools.tune_compute import QUICK, after_tune, thread_counts

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine.forget()
    args = SimpleNamespace(device="cpu", quick=True, no_sweep=False, no_save=False)
    assert after_tune(args, 0) == 0
    out = capsys.readouterr().out
    assert "matmul rate (cpu" in out and "key compute:cpu" in out
    entry = compute_entry("cpu")
    assert set(entry["rates"]) == {str(t) for t in thread_counts(entry["cores"])}
    for per in entry["rates"].values():
        for rows in per.values():
            assert [r[:3] for r in rows] == [list(s) for s in QUICK] and all(r[3] > 0 for r in rows)
    assert matmul_rate(256, 64, 256) == entry["rates"]["1"]["float32"][0][3]
    # a refused run (status 1) measures but saves nothing, and keeps its status
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
    assert after_tune(args, 1) == 1 and compute_entry("cpu") is None
    assert "NOT saved either" in capsys.readouterr().out


def test_the_rate_of_the_nearest_shape_and_thread_count():
    from dt.cost.compute_rate import matmul_rate
    entry = {"rates": {"1": {"float32": [[256, 64, 256, 1e9], [2048, 768, 3072, 5e9]]},
                       "4": {"float32": [[256, 64, 256, 3e9]], "bfloat16": [[256, 64, 256, 2e9]]}}}
    assert matmul_rate(300, 60, 200, 1, entry=entry) == 1e9
    assert matmul_rate(4096, 1024, 4096, 1, entry=entry) == 5e9
    assert matmul_rate(256, 64, 256, 3, entry=entry) == 3e9  # 3 threads: nearest (log) is 4
    assert matmul_rate(256, 64, 256, 1, "bfloat16", entry=entry) == 2e9  # only 4 threads measured it
    assert matmul_rate(256, 64, 256, 1, "float16", entry=entry) is None
    assert matmul_rate(256, 64, 256, entry={"rates": {}}) is None
