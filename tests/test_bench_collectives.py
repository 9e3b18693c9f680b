"""dt bench collectives against nccl-tests' conventions: sizes, streamed rows, columns, summary,
its options (-r, -d int8/uint8, -o all) and its check (#wrong, "Out of bounds values").

No timing is asserted (2 shared cores): these check which sizes a sweep
measures, that each size's rows are printed before the next size starts,
that each mode's #wrong sits under its own header, that gather, scatter and
barrier run against torch's, that auto counts among dt's fastest, and that
the reports name the wire that was actually used.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
import torch.distributed as dist

from dt.bench import collectives as bc
from dt.bench.collectives_sweep import collective_worker, sweep_sizes
from dt.bench.collectives_table import (
    busbw_figure,
    fastest_dt,
    format_row,
    headline,
    out_of_bounds,
    print_avg,
    print_header,
    summary,
)
from dt.collectives import auto
from dt.units import parse_size

TINY = ["-n", "1", "-w", "0", "--quiet"]


def _cfg(*argv: str) -> dict[str, Any]:
    return bc.sweep_config(bc.parse_args([*argv, *TINY]))


def test_the_sweeps_end_points():
    assert parse_size("1K") == 1024 and parse_size("16M") == 16 << 20 and parse_size("2G") == 2 << 30
    assert parse_size("1KiB") == 1024 and parse_size("1KB") == 1000 and parse_size("16MB") == 16 * 10**6
    assert bc.parse_args(["-e", "128M"]).e == 128 << 20  # refused before: nccl-tests' spelling
    # consistent units: the steps land on -e exactly
    assert sweep_sizes(parse_size("1K"), parse_size("16M"), 4) == [1024 * 4**k for k in range(8)]
    assert sweep_sizes(parse_size("1KiB"), parse_size("16MiB"), 4)[-1] == 16 << 20
    # mixed (1000 * 4^k never hits 16,000,000): -e is measured after the last step below it
    assert sweep_sizes(parse_size("1KB"), parse_size("16MB"), 4)[-3:] == [1_024_000, 4_096_000, 16_000_000]
    assert sweep_sizes(parse_size("1KB"), parse_size("64MB"), 4)[-2:] == [16_384_000, 64_000_000]
    assert sweep_sizes(4096, 4096, 4) == [4096]
    assert sweep_sizes(100, 1000, 2.5) == [100, 250, 625, 1000]
    assert _cfg("-b", "1K", "-e", "16M", "-f", "4")["sizes"][-1] == 16 << 20
    assert _cfg("--collective", "barrier")["sizes"] == [0]  # a barrier has one size: none
    with pytest.raises(ValueError, match="K, M, G"):
        parse_size("4Q")
    with pytest.raises(ValueError, match="start at 1 B"):
        sweep_sizes(0, 64, 2)


def _streamed(cfg: dict[str, Any]) -> str | None:
    """Rank 0's stdout and stderr as one stream, in the order they were written."""
    if dist.get_rank() != 0:
        collective_worker(cfg)
        return None
    saved, sys.stdout = (sys.stdout, sys.stderr), io.StringIO()
    sys.stderr = sys.stdout
    try:
        collective_worker(cfg)
        return sys.stdout.getvalue()
    finally:
        sys.stdout, sys.stderr = saved


@pytest.mark.timeout(120)
def test_rows_are_printed_as_each_size_is_measured(run):
    cfg = _cfg("-b", "1K", "-e", "16K", "-f", "4", "--algorithms", "ring,auto", "--world", "2")
    cfg["progress"] = True  # "[i/n]" is written when size i starts: the rows before it are done
    text = run(2, _streamed, cfg)[0]
    lines = text.splitlines()

    def first(pred: Any) -> int:
        return next(i for i, line in enumerate(lines) if pred(line))

    def row_of(size: int) -> int:
        return first(lambda line: line.split()[:1] == [str(size)])

    assert row_of(1024) < first(lambda line: line.startswith("[2/3]")) < row_of(4096) \
        < first(lambda line: line.startswith("[3/3]")) < row_of(16384), text
    assert sum(line.split()[:1] == ["4096"] for line in lines) == 3  # ring, auto, torch


def _data(rows: list[dict[str, Any]], collective: str = "all_reduce") -> dict[str, Any]:
    figures = {"source": "default", "alpha": 2e-4, "beta": 8e-10, "gamma": 1e-10, "sync": 2e-5, "mem": 2e-10}
    machine = {"world": 2, "backend": "gloo", "cores": 2, "torch": "x", "when": "now", "figures": figures,
               "shm_figures": figures, "transports": ["shm"], "shared": False, "load": (1.0, 1.0, 1.0)}
    return {"collective": collective, "machine": machine, "config": {"iters": 1, "warmup": 0},
            "results": rows}


def _mode(median: float, wrong: int = 0) -> dict[str, Any]:
    return {"median": median, "spread": 0.1, "algbw": 1.0, "busbw": 1.0, "wrong": wrong,
            "samples": [median, median]}


def _row(name: str, size: int = 4096, **modes: Any) -> dict[str, Any]:
    return {"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
            "algorithm": name, "vs_torch": 1.0, **modes}


def test_each_modes_wrong_count_sits_under_its_own_header():
    out = io.StringIO()
    print_header(_data([]), out)
    header = next(line for line in out.getvalue().splitlines() if "#wrong" in line)
    ends = [i + len("#wrong") for i in range(len(header)) if header.startswith("#wrong", i)]
    assert len(ends) == 2

    def under(text: str, end: int) -> str:
        return text[end - 6:end].strip()

    both = format_row(_row("ring", out=_mode(1e-3, wrong=3), **{"in": _mode(1e-3, wrong=5)}))
    assert under(both, ends[0]) == "3" and under(both, ends[1]) == "5", (header, both)
    out_only = format_row(_row("pairwise", out=_mode(1e-3, wrong=7)))  # all_to_all: no in-place call
    assert under(out_only, ends[0]) == "7" and under(out_only, ends[1]) == "", (header, out_only)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_gather_scatter_barrier_rows_against_torch(run, world):
    for collective in ("gather", "scatter", "barrier"):
        cfg = _cfg("--collective", collective, "-b", "1K", "-e", "4K", "-f", "4", "--world", str(world))
        cfg["stream"] = False
        per_rank = run(world, collective_worker, cfg, timeout=200)
        assert all(rk["wires"] == {"shm": ["shm"]} for rk in per_rank)  # one host: shared memory
        rows = per_rank[0]["rows"]
        expected = set(auto.candidates(collective, shared_memory=True)) | {"auto", "torch"}
        for size in [0] if collective == "barrier" else [1024, 4096]:
            here = [r for r in rows if abs(r["size"] - size) < 4 * world]  # whole blocks of p
            assert {r["algorithm"] for r in here} == expected, (collective, size, rows)
        for r in rows:  # out of place only (torch's APIs), and every element as torch's
            assert "in" not in r and r["out"]["wrong"] == 0 == r["wrong"], (collective, r)
            assert r["root"] == (-1 if collective == "barrier" else 0)


def test_the_fastest_dt_row_counts_auto():
    rows = [_row("ring", **{"in": _mode(2.4e-3)}), _row("naive", **{"in": _mode(3e-3)}),
            {**_row("auto", **{"in": _mode(1e-3)}), "picked": "naive"}, _row("torch", **{"in": _mode(2e-3)})]
    here = {r["algorithm"]: r for r in rows}
    assert fastest_dt(here, "in") == "auto"
    assert fastest_dt({"ring": here["ring"], "torch": {**here["torch"], "in": _mode(1e-6)}}, "in") == "ring"
    out = io.StringIO()
    summary(_data(rows), out)
    assert "fastest auto (naive)" in out.getvalue() and "0.50x torch" in out.getvalue(), out.getvalue()
    # the record's headline: the same row
    assert headline(_data(rows)) == ("all_reduce 4,096 B world 2: fastest auto on shared memory 1.00 ms, "
                                     "busbw 1 GB/s, 0.50x the time of torch's on gloo's sockets")


def _summary_line(rows: list[dict[str, Any]], transports: list[str]) -> str:
    data = _data(rows)
    data["machine"]["transports"] = transports
    out = io.StringIO()
    summary(data, out)
    return out.getvalue().splitlines()[-1]


def test_the_summary_compares_with_torch_on_the_same_wire_and_says_when_it_cannot():
    torch_row = _row("torch", **{"in": _mode(2e-3)})
    # dt on shared memory only: the comparison crosses wires, and the line says so
    line = _summary_line([_row("one_shot", **{"in": _mode(0.14e-3)}), torch_row], ["shm"])
    assert "fastest one_shot" in line and "0.07x torch (across wires: dt on shared memory, torch on " \
        "gloo's sockets)" in line, line
    # both wires: the same-wire row leads; the faster shared-memory row follows, labelled across wires
    rows = [_row("one_shot@shm", **{"in": _mode(0.14e-3)}), _row("ring@torch", **{"in": _mode(1.9e-3)}),
            _row("naive@torch", **{"in": _mode(2.2e-3)}), torch_row]
    line = _summary_line(rows, ["shm", "torch"])
    assert line.split("fastest on the same wire ")[1].startswith("ring@torch") and "0.95x torch" in line, line
    assert "fastest one_shot@shm  0.07x torch (across wires: dt on shared memory" in line, line
    # on torch's wire only: nothing crosses wires
    line = _summary_line([_row("ring", **{"in": _mode(1.9e-3)}), torch_row], ["torch"])
    assert "fastest on the same wire ring" in line and "across" not in line, line


def test_the_plot_is_log_log():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    rows = [{**_row(a, size=s, **{"in": _mode(1e-3)}), "memcpy_gbps": 5.0} for a in ("ring", "torch")
            for s in (1024, 65536)]
    fig = busbw_figure(_data(rows))
    try:
        assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    finally:
        plt.close(fig)


def _wires_of_each_kind() -> dict[str, list[str]]:
    from dt.bench.harness import group_wires, wire_group

    return {name: group_wires(wire_group(name)) for name in ("shm", "torch")}


@pytest.mark.timeout(120)
def test_reports_name_the_wire_the_group_connected(run):
    for got in run(2, _wires_of_each_kind):
        assert got == {"shm": ["shm"], "torch": ["torch"]}


@pytest.mark.timeout(120)
def test_bench_ddp_names_the_wires_its_group_used(pools, tmp_path, capsys):
    import json

    from dt.bench import ddp as bench_ddp
    from dt.bench.harness import group_wires
    from dt.bench.report import wire_label

    out = tmp_path / "ddp.json"
    assert bench_ddp.main(["--world", "2", "--batch", "8", "--steps", "1", "--warmup", "0", "--hidden", "16",
                           "--layers", "2", "--buckets", "25", "--json", str(out)], pool=pools(2)) == 0
    text = capsys.readouterr().out
    wires = json.loads(out.read_text())["dt_wires"]
    assert wires == sorted(set().union(*pools(2).run(group_wires)))  # the world group's, as connected
    line = next(line for line in text.splitlines() if line.startswith("wires: "))
    assert line.startswith(f"wires: dt DDP over {' + '.join(wire_label(w) for w in wires)} "), line
    assert "loopback" not in text and "TCP" not in text


def test_avg_bus_bandwidth_is_nccl_tests_mean_over_sizes_and_modes():
    from dt.bench.collectives_table import avg_bus_bandwidth

    def mode(busbw: float) -> dict[str, Any]:
        return {**_mode(1e-3), "busbw": busbw}

    rows = [_row("ring", size=s, out=mode(b), **{"in": mode(b + 2)}) for s, b in ((1024, 1.0), (4096, 3.0))]
    rows.append(_row("pairwise", out=mode(5.0)))  # out of place only: one figure
    assert avg_bus_bandwidth(rows) == {"ring": 3.0, "pairwise": 5.0}
    out = io.StringIO()
    print_avg(_data(rows), out)
    assert out.getvalue().splitlines() == ["# Out of bounds values : 0 OK",
                                           "# Avg bus bandwidth    : 3 GB/s  ring",
                                           "# Avg bus bandwidth    : 5 GB/s  pairwise"]


def test_compare_deepspeed_skips_in_one_line_when_it_cannot_run(monkeypatch, capsys):
    """Not importable, or its C++ op does not build: one line on stderr, and the sweep goes on
    without it (DeepSpeed is optional); an op that builds keeps it in."""
    import types

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "deepspeed.accelerator", None)
    assert _cfg("--compare", "deepspeed", "-b", "4K", "-e", "4K")["deepspeed"] is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compare deepspeed skipped: deepspeed does not import" in err[0]

    class Builder:
        def __init__(self, fails: bool) -> None:
            self.fails = fails

        def load(self) -> None:
            if self.fails:
                raise RuntimeError("Error building extension 'deepspeed_shm_comm'\nninja: build stopped")

    for fails in (True, False):
        fake = types.ModuleType("deepspeed.accelerator")
        fake.get_accelerator = lambda fails=fails: types.SimpleNamespace(  # type: ignore[attr-defined]
            create_op_builder=lambda name: Builder(fails))
        monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
        monkeypatch.setitem(sys.modules, "deepspeed.accelerator", fake)
        assert bc.deepspeed_builds() is (not fails)
        err = capsys.readouterr().err.strip().splitlines()
        if fails:
            assert err == ["# --compare deepspeed skipped: its shared-memory op (ShareMemCommBuilder) "
                           "did not build (RuntimeError: Error building extension 'deepspeed_shm_comm')"]
        else:
            assert err == []


def test_per_call_figures_of_a_planned_all_reduce(run, capsys):
    """python -m dt.bench.collectives_percall: the traced call is the planned one (few dt files,
    the same at every rank), times are positive, the slowest rank's median no less than rank 0's;
    a bad size is refused in one line (exit 2)."""
    from dt.bench import collectives_percall as pc

    for counted in (False, True):  # inside a dt.traffic() record too: still the planned call
        per_rank = run(2, pc.per_call, [4096, 65536], 5, False, counted)
        for figures in per_rank:
            for f in figures.values():
                assert 0 < f["files"] <= 10 and f["python"] > 0 and f["c"] > 0
                assert f["cpu_us"] > 0 and f["wall_us"] > 0 and len(f["walls"]) == 5
        for n in (4096, 65536):  # each call's slowest rank is no faster than rank 0 in it
            assert pc.slowest_us(per_rank, n) >= per_rank[0][n]["wall_us"]
    with pytest.raises(SystemExit) as stop:
        pc.main(["--sizes", "4Q"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--sizes" in err[0] and "'4Q'" in err[0]


def test_nccl_tests_options_root_types_and_every_op(capsys):
    assert _cfg("-o", "all")["ops"] == ["SUM", "PRODUCT", "MAX", "MIN", "AVG"]  # nccl-tests' order
    assert _cfg("-o", "all", "-d", "int8")["ops"] == ["SUM", "PRODUCT", "MAX", "MIN"]  # avg: floating only
    assert _cfg("-o", "all", "--collective", "broadcast")["ops"] == ["SUM"]  # nothing to reduce: once
    assert _cfg("-r", "1", "--world", "2")["root"] == 1
    for argv, words in ((["-r", "2", "--world", "2"], "-r 2: the root must be one of the ranks, 0 to 1"),
                        (["-d", "uint16"], "argument -d"),
                        (["-o", "avg", "-d", "uint8"], "needs a floating -d")):
        with pytest.raises(SystemExit):
            bc.parse_args([*argv, *TINY])
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err


@pytest.mark.timeout(240)
def test_a_rooted_sweep_of_every_op_on_a_narrow_type_is_checked_exactly(run):
    for collective, algorithms in (("reduce", "binomial,flat,auto"), ("broadcast", "binomial,ring,auto")):
        cfg = _cfg("--collective", collective, "-o", "all", "-d", "uint8", "-r", "1", "-b", "1K", "-e", "1K",
                   "--world", "3", "--algorithms", algorithms)
        cfg["stream"] = False
        rows = run(3, collective_worker, cfg, timeout=200)[0]["rows"]
        redops = ["sum", "prod", "max", "min"] if collective == "reduce" else ["none"]
        assert list(dict.fromkeys(r["redop"] for r in rows)) == redops
        assert {(r["root"], r["type"]) for r in rows} == {(1, "uint8")}
        assert all(r[m]["wrong"] == 0 for r in rows for m in ("out", "in")), rows
        out = io.StringIO()
        print_avg({**_data(rows, collective), "config": cfg}, out)
        assert "# Out of bounds values : 0 OK" in out.getvalue().splitlines()


def test_out_of_bounds_values_as_nccl_tests_prints_them():
    rows = [_row("ring", out=_mode(1e-3, wrong=3), **{"in": _mode(1e-3)}),
            _row("torch", out=_mode(1e-3), **{"in": _mode(1e-3, wrong=1)}), _row("naive", out=_mode(1e-3))]
    assert out_of_bounds(rows) == 2  # results with a wrong element, not the elements
    out = io.StringIO()
    print_avg(_data(rows), out)
    assert "# Out of bounds values : 2 FAILED" in out.getvalue().splitlines()
    unchecked = _row("ring", out={**_mode(1e-3), "wrong": None})
    assert out_of_bounds([unchecked]) == 0 and format_row(unchecked).split()[10] == "N/A"
