"""The device catalogue and the published tables: figures as their sources print them, consistent."""

from __future__ import annotations

import pytest

from dt.cost.devices import DEVICES, device
from dt.cost.flops import Decoder, train_flops_per_token
from dt.plan.published_tables import LLAMA3_2024, MEGATRON_2021, TABLES


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
                       "nic_latency", "matmul_efficiency"):
            assert "http" in d.sources[figure] or "Table" in d.sources[figure], (d.name, figure)
        assert 0 < d.matmul_efficiency["bf16"] < 1
        assert d.sustained_flops("bf16") == d.peak_flops["bf16"] * d.matmul_efficiency["bf16"]
        assert d.nvlink_bandwidth > d.nic_bandwidth and d.nvlink_latency < d.nic_latency


def test_bad_names_are_one_line():
    with pytest.raises(ValueError, match="no device 'v100' in the catalogue: one of a100, h100, h200"):
        device("v100")
    with pytest.raises(ValueError, match="no figure for dtype 'fp8'"):
        device("h100").sustained_flops("fp8")


def test_megatron_rows_are_consistent_with_their_own_columns():
    """GPUs = t p d; % of peak = TFLOP/s / 312; the parameter count 12 l h^2 (1 + 13/(12h) +
    (V + s)/(12 l h)) (Narayanan et al. eq. 2) is the printed one to its one decimal."""
    for r in MEGATRON_2021:
        assert r.tp * r.pp * r.dp == r.gpus
        assert r.tflops_per_gpu / 312 == pytest.approx(r.peak_fraction, abs=0.006)
        l, h = r.n_layer, r.n_embd  # noqa: E741
        count = 12 * l * h * h * (1 + 13 / (12 * h) + (r.vocab_size + r.seq_len) / (12 * l * h))
        assert count == pytest.approx(r.params, abs=0.051e9)


def test_llama3_rows_and_the_6n_check():
    for r in LLAMA3_2024:
        assert r.tp * r.cp * r.pp * r.dp == r.gpus
        assert r.global_batch * r.seq_len == pytest.approx(16e6, rel=0.05)  # "16M tokens per batch"
        assert r.tflops_per_gpu / 989.4 == pytest.approx(r.peak_fraction, abs=0.01)  # MFU of the bf16 peak
    # Our model FLOPs per token for the 405B at 8K: 6N + attention, within 10% of 6 x 405e9 x 1.1
    r = LLAMA3_2024[0]
    arch = Decoder(vocab_size=r.vocab_size, seq_len=r.seq_len, n_layer=r.n_layer, n_embd=r.n_embd,
                   n_head=r.n_head, n_kv_head=r.n_kv_head, ffn_hidden=r.ffn_hidden, gated=True, tied=False,
                   position_table=False, bias=False)
    assert train_flops_per_token(arch) == pytest.approx(6 * r.params + 12 * r.n_layer * r.n_embd * r.seq_len,
                                                        rel=0.02)
    assert set(TABLES) == {"megatron-2021", "llama3-2024"}


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
