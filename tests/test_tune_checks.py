"""`dt tune` refuses figures that contradict themselves; --show and --reset; the load/store bytes priced.

The consistency rule is checked on synthetic figures (a loaded machine once
saved a 3.67 ms alpha, and a sync of 878 us beside a whole one-shot
all-reduce of 170 us); `dt tune`'s main runs on synthetic measurements (its
launch replaced), so nothing here depends on this machine's load. One test
runs the real micro-benchmarks at world 2 and checks their shape, never
their values.
"""

from __future__ import annotations

import json
import re

import pytest

import dt.launcher
from dt import cost
from dt.cost import machine
from dt.tools import tune, tune_saved, whatif
from dt.tools.tune_curves import inconsistent
from dt.units import fmt_time
from tests.shm_checks import no_leaked_segments  # noqa: F401  (module fixture)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty tune cache of the test's own: never the user's figures."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine.forget()
    yield tmp_path / "dt" / "tune.json"
    machine.forget()


def _figures(alpha: float = 200e-6, whole: float = 300e-6, sync: float | None = 30e-6,
             one_shot: float = 80e-6, spread: float = 1.2) -> dict:
    """One rank's measured figures for one wire, as tune._worker returns them."""
    fig = {"world": 2, "backend": "gloo", "wire": "torch", "topology": "1x2", "pingpong_one_way": 100e-6,
           "alpha": alpha, "beta": 1e-9, "gamma": 0.2e-9, "noisy": None,
           "exchange": {"4": alpha, "262144": 5e-4, "1048576": 1.2e-3},
           "whole": {"step": whole, "algorithm": "recursive_doubling", "steps": 1},
           "spread": {"alpha": spread}, "reduce": {}}
    if sync is not None:
        fig.update(wire="shm", sync=sync, mem=0.2e-9, noisy_mem=None, memcpy={})
        fig["whole"]["one_shot"] = one_shot
        fig["spread"]["sync"] = spread
    return fig


def test_consistent_figures_pass():
    assert inconsistent(_figures()) == []
    assert inconsistent(_figures(sync=None)) == []
    assert inconsistent(_figures(alpha=310e-6, whole=300e-6)) == []  # within the tolerance: noise


def test_a_step_slower_than_a_whole_all_reduce_is_refused():
    why = inconsistent(_figures(alpha=3.67e-3, whole=300e-6))  # the loaded run's saved alpha
    assert len(why) == 1 and "alpha 3670 us exceeds a whole 4-byte all-reduce" in why[0]


def test_a_sync_slower_than_a_one_shot_all_reduce_is_refused():
    why = inconsistent(_figures(sync=878e-6, one_shot=170e-6))
    assert len(why) == 1 and "sync 878 us exceeds a whole 4-byte one-shot all-reduce (170 us)" in why[0]


def test_a_latency_that_does_not_repeat_is_refused():
    why = inconsistent(_figures(spread=3.5))
    assert [w.split(" does not")[0] for w in why] == ["alpha", "sync"]
    assert inconsistent(_figures(spread=3.5), max_spread=4.0) == []


def _main_on(per_rank: list[dict], monkeypatch, *argv: str) -> int:
    """tune.main with the launch replaced: every rank 'measured' per_rank's figures."""
    wires = sorted({w for fig in per_rank for w in fig})
    monkeypatch.setattr(dt.launcher, "launch", lambda *a, **k: per_rank)
    return tune.main(["--no-sweep", "--transport", "both" if len(wires) == 2 else wires[0], *argv])


def test_tune_does_not_save_inconsistent_figures(cache, monkeypatch, capsys):
    bad = [{"shm": _figures(sync=878e-6, one_shot=170e-6)}, {"shm": _figures()}]
    assert _main_on(bad, monkeypatch, "--transport", "shm") == 1
    out = capsys.readouterr().out
    assert "WARNING: sync 878 us exceeds" in out and "NOT saved" in out and "load average" in out
    assert not cache.exists()
    # --force saves them, and says it did despite the warning, and where
    assert _main_on(bad, monkeypatch, "--transport", "shm", "--force") == 0
    out = capsys.readouterr().out
    assert "WARNING: sync 878 us" in out and f"saved to {cache}" in out and "--force" in out
    assert json.loads(cache.read_text())["shm:2"]["sync"] == 878e-6  # the slowest rank's


def test_tune_saves_consistent_figures_and_says_where(cache, monkeypatch, capsys):
    good = [{"torch": _figures(sync=None)}, {"torch": _figures(sync=None, alpha=250e-6)}]
    assert _main_on(good, monkeypatch, "--transport", "torch") == 0
    out = capsys.readouterr().out
    assert "WARNING" not in out and f"saved to {cache} (key gloo:2)" in out
    assert "dt tune --reset" in out and "spread 1.20x" in out and "load average" in out
    saved = json.loads(cache.read_text())["gloo:2"]
    assert saved["alpha"] == 250e-6 and saved["spread"]["alpha"] == 1.2


def test_show_and_reset(cache, capsys):
    assert tune.main(["--show"]) == 0
    assert "no figures saved" in capsys.readouterr().out
    assert tune.main(["--reset"]) == 0
    assert "nothing to reset" in capsys.readouterr().out
    machine.save(dict(_figures(), backend="shm", measured_at="2026-12-01T10:00:00Z", load=2.5))
    assert machine.machine("shm", 2).source.startswith("dt tune")
    assert tune.main(["--show"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and "shm:2: measured 2026-12-01T10:00:00Z, load 2.50" in out
    assert "alpha 200.0 us beta 1.000 ns/B" in out and "sync 30.0 us" in out
    assert tune.main(["--reset"]) == 0
    assert f"removed {cache} (1 figure set(s))" in capsys.readouterr().out
    assert not cache.exists() and machine.machine("shm", 2) == cost.DEFAULT_SHM_MACHINE  # defaults again
    with pytest.raises(SystemExit) as stop:  # one or the other
        tune.main(["--show", "--reset"])
    assert stop.value.code == 2
    # a group of one sends nothing: its figures are the matmul rates alone (one GPU's dt tune)
    assert tune.main(["--world", "1", "--quick", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "measuring the matmul rates only" in out and "matmul rate (cpu" in out and not cache.exists()


def test_the_help_says_where_the_figures_are(cache, capsys):
    with pytest.raises(SystemExit):
        tune.main(["--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps the path at its hyphens
    assert str(cache) in out and "dttune--showlists" in out and "dttune--resetdeletes" in out


def test_report_prints_every_figure(capsys):
    fig = dict(_figures(), cores=2, torch="x", load=1.5)
    tune_saved.report(fig)
    out = capsys.readouterr().out
    assert "load average 1.50" in out and "whole 4-byte all-reduce: recursive_doubling" in out
    assert out.count("spread 1.20x") == 2  # alpha and sync


def _measured() -> dict:
    return tune._worker(2, False, 1, 0, ["shm", "torch"], 1, 2, "none")  # terms: tests/test_cost_terms.py


@pytest.mark.timeout(200)
def test_the_micro_benchmarks_time_latencies_with_their_checks(run):
    res = run(2, _measured, timeout=150)
    for wire in ("shm", "torch"):
        fig = tune.group_figures(res, wire)
        assert all(r[wire]["exchange"]["4"] == r[wire]["alpha"] for r in res)  # the curve holds alpha
        assert fig["alpha"] > 0 and fig["whole"]["step"] > 0 and fig["whole"]["steps"] == 1
        assert all(s >= 1.0 for s in fig["spread"].values())
        assert isinstance(tune.refusals(res, wire, fig), list)  # the verdict runs on real figures
    shm = tune.group_figures(res, "shm")
    assert shm["sync"] > 0 and shm["whole"]["one_shot"] > 0 and set(shm["spread"]) == {"alpha", "sync"}
    assert "sync" not in res[0]["torch"] and "one_shot" not in res[0]["torch"]["whole"]


# ---------------------------------------------------------------------------
# The load/store algorithms' bytes: what they copy and read, never free.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_load_store_bytes_are_the_copy_in_plus_the_reads(p):
    n = 4 * 840 * 300  # float32 elements that split evenly over every p here (the exact traffic's sizes)
    for collective, algorithm in (("all_reduce", "one_shot"), ("all_reduce", "two_shot"),
                                  ("reduce_scatter", "one_shot")):
        steps, moved, reduced = cost.formula(collective, algorithm, n, p)
        blocks = n // 4 if collective == "all_reduce" else n // 4 // p
        read = cost.traffic_for(collective, algorithm, blocks, 4, p, 0).bytes_received
        assert moved == pytest.approx(n + read), (collective, algorithm)  # copy-in n, then every read
    assert cost.formula("all_reduce", "one_shot", n, p)[1:] == (p * n, (p - 1) * n)
    root_reads = cost.traffic_for("reduce", "one_shot", n // 4, 4, p, 0, root=0).bytes_received
    assert cost.formula("reduce", "one_shot", n, p)[1] == n + root_reads


def _row(out: str, name: str) -> list[str]:
    line = next(x for x in out.splitlines() if re.match(rf"\s+{name}( \*)?\s", x))
    return re.split(r"\s{2,}", line.replace(" *", "").strip())


def test_dt_model_prices_one_shots_reads(cache, capsys):
    assert whatif.main(["all_reduce", "--size", "1MB", "--world", "8", "--bandwidth", "450GB/s",
                        "--latency", "5us", "--sync", "1us", "--memcpy", "20GB/s"]) == 0
    out = capsys.readouterr().out
    name, steps, nbytes, latency, bandwidth, reduction, total = _row(out, "one_shot")
    assert (steps, nbytes, bandwidth) == ("1", "8 MB", "400 us")  # 1 MB in + 7 MB read, at 20 GB/s
    assert reduction != "0 us" and "the shared-memory default; --reduce sets it" in out
    assert reduction == fmt_time(7e6 * cost.DEFAULT_SHM_MACHINE.gamma, 3)  # 7 MB reduced
    # --reduce still sets it, and the textbook table without shared memory stays reduction free
    assert whatif.main(["all_reduce", "--size", "1MB", "--world", "8", "--sync", "1us", "--memcpy",
                        "20GB/s", "--reduce", "7GB/s"]) == 0
    assert _row(capsys.readouterr().out, "one_shot")[5] == "1 ms"  # 7 MB at 7 GB/s
    assert whatif.main(["all_reduce", "--size", "1MB", "--world", "8"]) == 0
    assert "reduction free" in capsys.readouterr().out


def test_dt_model_reduces_at_dt_tunes_shared_memory_gamma(cache, capsys):
    machine.save(dict(_figures(), backend="shm", world=8, gamma=1e-9, measured_at="t"))
    assert whatif.main(["all_reduce", "--size", "1MB", "--world", "8", "--sync", "1us", "--memcpy",
                        "20GB/s"]) == 0
    out = capsys.readouterr().out
    assert "dt tune (shm, world 8)" in out and _row(out, "one_shot")[5] == "7 ms"  # 7 MB at 1 ns/B


def test_a_latency_that_moved_since_the_last_run_is_said(cache, monkeypatch, capsys):
    from dt.tools.tune_curves import drifted

    assert drifted(_figures(), None) == [] and drifted(_figures(), _figures(alpha=150e-6)) == []
    why = drifted(_figures(alpha=3.6e-3), dict(_figures(), measured_at="t0", load=2.0))
    assert len(why) == 1 and "alpha 3600 us differs 18.0x from the 200 us saved (t0, load 2.0)" in why[0]
    # a second run, steady on its own but 18x the first: saved (it may be the right one), said loudly
    assert _main_on([{"torch": _figures(sync=None)}] * 2, monkeypatch, "--transport", "torch") == 0
    slow = _figures(sync=None, alpha=3.6e-3, whole=4e-3)
    assert _main_on([{"torch": slow}] * 2, monkeypatch, "--transport", "torch") == 0
    out = capsys.readouterr().out
    assert "WARNING: alpha 3600 us differs 18.0x from the 200 us saved" in out
    assert json.loads(cache.read_text())["gloo:2"]["alpha"] == 3.6e-3
