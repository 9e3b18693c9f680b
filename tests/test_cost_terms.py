"""The terms beyond alpha, beta, gamma (dt.cost.overheads), each against a case worked by hand.

The plain model stays exact when every term is 0 (the reference's 3.96 ms
ring); `dt tune`'s micro-benchmarks of the terms run at world 2 in their
--quick form and are checked for shape, never for values (the machine is
shared); `dt model` shows a column per term.
"""

from __future__ import annotations

import math
import re

import pytest

from dt import cost
from dt.args import cores
from dt.cost import machine
from dt.cost.overheads import Overheads, Terms, terms
from dt.tools import whatif
from dt.transport.shm.sync import default_spin

N = 4 << 20  # 4 MiB of float32: splits evenly over 2 and 4 ranks
BETA, GAMMA = 1e-9, 0.5e-9


def _est(algorithm: str, p: int, o: Overheads | None, n: float = N, alpha: float = 100e-6) -> cost.Estimate:
    return cost.estimate("all_reduce", algorithm, n, p, alpha=alpha, beta=BETA, gamma=GAMMA, overheads=o)


def test_the_reference_ring_is_exact_with_every_term_zero():
    plain = cost.estimate("all_reduce", "ring", 1e9, 8, alpha=5e-6, beta=1 / 450e9)
    zero = cost.estimate("all_reduce", "ring", 1e9, 8, alpha=5e-6, beta=1 / 450e9, overheads=Overheads())
    assert plain.total == zero.total == pytest.approx(14 * 5e-6 + 2 * 7 / 8 * 1e9 / 450e9)
    assert round(zero.total * 1e3, 2) == 3.96 and zero.terms == Terms()


def test_software_charges_messages_beyond_a_steps_send_and_receive():
    o = Overheads(post=10e-6)
    # naive on 4: the root posts 3 receives, then 3 sends, in 2 steps: 6 - 2 * 2 = 2 messages more
    assert _est("naive", 4, o).terms.software == pytest.approx(2 * 10e-6)
    for algorithm in ("ring", "recursive_doubling", "rabenseifner"):  # one send, one receive a step
        assert _est(algorithm, 4, o).terms.software == 0.0
    assert _est("one_shot", 4, o).terms == Terms()  # load/store: no messages posted


def test_a_load_store_reduction_reads_each_byte_once():
    # one-shot on 4: 3n read from the peers and reduced; the add (gamma) holds those reads
    o = Overheads(fused=0.3e-9)
    e = cost.estimate("all_reduce", "one_shot", N, 4, alpha=20e-6, beta=0.3e-9, gamma=GAMMA, overheads=o)
    assert e.terms.sharing == pytest.approx(-3 * N * 0.3e-9)
    assert e.total == pytest.approx(20e-6 + N * 0.3e-9 + 3 * N * GAMMA)  # copy-in at mem, reads in the add


def test_wake_is_charged_per_step_that_outlasts_the_spin():
    o = Overheads(wake=50e-6, spin=200e-6)
    # ring on 4, 4 MiB: every one of 6 steps moves 1 MiB, 1.05 ms at 1 ns/B > 200 us
    assert _est("ring", 4, o).terms.wake == pytest.approx(6 * 50e-6)
    # 16 KiB: 4 KiB a step, 4 us < 200 us: answered within the spin
    assert _est("ring", 4, o, n=16 << 10).terms.wake == 0.0
    # no spin (the torch wire; more ranks than cores): alpha's own exchange slept, no term
    assert _est("ring", 4, Overheads(wake=50e-6, spin=0.0)).terms.wake == 0.0


def test_sharing_credits_the_naive_root_copying_alone():
    o = Overheads(solo=0.5, solo_reduce=0.6)
    # naive on 4: step 1 the root receives 3n while 3 ranks send n: links [3n, n, n, n], 6n in all;
    # C = 4 * 0.5 = 2 ranks at full speed: max(3n, 6n / 2) * 0.5 = 1.5n instead of 3n; step 2 alike.
    # reduced: the root alone reduces 3n: max(3n, 3n / 2.4) * 0.6 = 1.8n instead of 3n.
    n = N
    want = 2 * (1.5 * n - 3 * n) * BETA + (1.8 * n - 3 * n) * GAMMA
    assert _est("naive", 4, o).terms.sharing == pytest.approx(want)
    for algorithm in ("ring", "recursive_doubling", "rabenseifner"):  # every rank copies in every step
        assert _est(algorithm, 4, o).terms.sharing == pytest.approx(0.0, abs=1e-12)
    assert _est("naive", 4, Overheads(solo=2.0)).terms.sharing == 0.0  # alone never slower
    # company far dearer than alone (p * solo < 1): every rank moving alike still costs what was measured
    for algorithm in ("ring", "recursive_doubling"):
        assert _est(algorithm, 2, Overheads(solo=0.15, solo_reduce=0.14)).terms.sharing == pytest.approx(
            0.0, abs=1e-12)


def test_oversubscription_is_taken_out_of_the_latency_not_added():
    o = Overheads(oversub=30e-6)
    plain, split = _est("ring", 4, None), _est("ring", 4, o)
    assert split.terms.oversubscription == pytest.approx(6 * 30e-6)
    assert split.latency == pytest.approx(6 * (100e-6 - 30e-6)) and split.total == pytest.approx(plain.total)


def test_terms_without_a_schedule_spread_the_bytes_over_the_steps():
    # broadcast binomial has no two-level schedule: 2 steps of n each on 4 ranks
    t = terms("broadcast", "binomial", N, 4, 2, 2 * N, 0.0, BETA, GAMMA, Overheads(wake=1e-5, spin=1e-4))
    assert t.wake == pytest.approx(2e-5) and t.sharing == 0.0


def test_saved_terms_are_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine.forget()
    machine.save({"backend": "gloo", "world": 2, "alpha": 1e-4, "beta": 1e-9, "gamma": 0.0,
                  "terms": {"post": 2e-5, "wake": 3e-5, "spin": 0.0, "solo": 0.7, "solo_reduce": 0.8,
                            "oversub": 0.0, "raw": {"fan 1": 1e-4}}})
    from dt.cost.overheads import overheads

    assert overheads("gloo", 2) == Overheads(post=2e-5, wake=3e-5, solo=0.7, solo_reduce=0.8)
    assert Overheads.from_saved({"alpha": 1.0}) == Overheads()  # figures saved before the terms
    machine.forget()


def test_dt_model_shows_a_column_per_term(capsys):
    o = Overheads(post=10e-6, wake=50e-6, spin=200e-6, solo=0.5, solo_reduce=0.6, oversub=20e-6)
    rows = whatif.table("all_reduce", N, 4, 100e-6, BETA, GAMMA, overheads=o)
    whatif.print_table("all_reduce", N, 4, rows, measured={name: e.total for name, e in rows})
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if "algorithm" in line).split()
    assert head[:10] == ["algorithm", "steps", "bytes/rank", "latency", "bandwidth", "reduction",
                         "software", "wake", "sharing", "oversub"]
    naive = next(line for line in out.splitlines() if re.match(r"\s+naive\b", line))
    assert naive.split()[-1] == "1.00"  # measured = predicted here
    assert whatif_terms_within(rows) == (len(rows), len(rows))
    plain = whatif.table("all_reduce", N, 4, 100e-6, BETA, GAMMA)  # no terms: the three, as before
    assert [e.total for _, e in plain] == sorted(e.total for _, e in plain)


def whatif_terms_within(rows: list) -> tuple[int, int]:
    from dt.tools.whatif_terms import within

    return within({"torch": {N: rows}}, {"torch": {str(N): {n: e.total * 1.19 for n, e in rows}}})["torch"]


def _quick_terms() -> dict:
    from dt.bench.harness import wire_group
    from dt.tools.tune_terms import measure_terms

    return {wire: measure_terms(wire_group(wire), reps=3, repeats=1, quick=True) for wire in ("shm", "torch")}


@pytest.mark.timeout(200)
def test_tunes_quick_term_benchmarks_agree_on_every_rank(run):
    res = run(2, _quick_terms, timeout=150)
    for wire in ("shm", "torch"):
        figs = [r[wire] for r in res]
        assert figs[0] == figs[1]  # the slowest rank's figures, on every rank
        f = figs[0]
        assert all(math.isfinite(f[k]) and f[k] >= 0 for k in ("post", "wake", "spin", "oversub"))
        assert 0 < f["solo"] <= 1 and 0 < f["solo_reduce"] <= 1
        if cores() >= 2:
            assert f["oversub"] == 0.0  # 2 ranks, a core each: nothing waits for one
        assert set(f["raw"]) >= {"fan 1", "fan 2", "fan 4", "late", "prompt", "copy alone", "add all"}
    assert res[0]["torch"]["spin"] == 0.0 and res[0]["shm"]["spin"] == default_spin(2)


def test_tune_saves_the_shared_memory_wires_mem_as_the_fused_read():
    from dt.tools import tune

    def rank(mem: float) -> dict:
        return {"shm": {"world": 2, "backend": "gloo", "wire": "shm", "alpha": 1e-4, "beta": 1e-9,
                        "gamma": 1e-9, "pingpong_one_way": 1e-4, "sync": 2e-5, "mem": mem,
                        "spread": {}, "terms": {"post": 1e-5, "solo": 0.8}}}

    fig = tune.group_figures([rank(0.2e-9), rank(0.3e-9)], "shm")
    assert fig["terms"]["fused"] == fig["mem"] == 0.3e-9  # the slowest rank's mem prices both
    assert Overheads.from_saved(fig) == Overheads(post=1e-5, solo=0.8, fused=0.3e-9)


def test_tune_quick_is_short_and_measures_the_quick_terms(tmp_path, monkeypatch):
    import dt.launcher
    from dt.tools import tune

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    asked = {}

    def launch(fn, world, reps, sweep, sweep_reps, max_bytes, wires, attempts, repeats, terms, **kw):
        asked.update(reps=reps, sweep=sweep, repeats=repeats, terms=terms)
        raise SystemExit(0)  # what was asked is the point; nothing is measured

    monkeypatch.setattr(dt.launcher, "launch", launch)
    with pytest.raises(SystemExit):
        tune.main(["--quick", "--no-save"])
    assert asked == {"reps": 3, "sweep": False, "repeats": 1, "terms": "quick"}
    with pytest.raises(SystemExit):
        tune.main(["--no-terms", "--no-sweep", "--no-save"])
    assert asked["terms"] == "none" and asked["reps"] == 20


def test_two_levels_price_each_message_on_its_level():
    from dt.cost.overheads import level_terms

    hosts = (0, 0, 1, 1)
    levels = cost.Levels(cost.Machine(10e-6, 1e-9, 0.0), cost.Machine(50e-6, 10e-9, 0.0))
    intra = Overheads(post=5e-6, wake=50e-6, spin=200e-6, solo=0.5)
    inter = Overheads(post=20e-6, wake=1e-3, spin=0.0)  # a socket's wait sleeps at once: in alpha
    # naive: the root receives 1 message from its host and 2 across, then sends them back: one more
    # than a step's two each time, at the post of the level it crosses
    naive = level_terms("all_reduce", "naive", N // 4, 4, hosts, levels, intra, inter)
    assert naive.software == pytest.approx(2 * 20e-6)
    # ring, host-contiguous: a send and a receive a step; every step's 1 MiB inside a host outlasts
    # the 200 us spin (1.05 ms at 1 ns/B): 6 wakes inside; none across (spin 0)
    ring = level_terms("all_reduce", "ring", N // 4, 4, hosts, levels, intra, inter)
    assert (ring.software, ring.wake) == (0.0, pytest.approx(6 * 50e-6))
    assert ring.sharing == pytest.approx(0.0, abs=1e-12)  # both ranks of a host copy alike


def test_dt_model_across_hosts_adds_the_saved_terms_of_each_level(capsys):
    from dt.tools import whatif_hosts

    levels = [[10e-6, 1e-9, 0.0], [50e-6, 10e-9, 0.0], 0]
    mine = {"hosts": [0, 0, 1, 1], "source": "dt tune (2x2)", "note": None, "levels": levels,
            "times": {str(N): {"ring": 0.02, "naive": 0.05}},
            "terms": [{"post": 5e-6, "wake": 50e-6, "spin": 200e-6}, {"post": 20e-6}]}
    whatif_hosts.print_measured("all_reduce", [N], [{"torch": mine}])
    out = capsys.readouterr().out
    assert "software" in out and "wake" in out and "sharing" in out
    naive = next(line for line in out.splitlines() if re.match(r"\s+naive\b", line)).split()
    plain = cost.two_level("all_reduce", "naive", N // 4, 4, (0, 0, 1, 1),
                           cost.Levels(cost.Machine(*levels[0]), cost.Machine(*levels[1]), 0)).total
    assert naive[4:6] == ["40", "us"]  # 2 messages more than two, across hosts, at 20 us
    assert " ".join(naive[10:12]) == whatif.fmt_time(plain + 40e-6, 3)  # the two-level total + the terms


def test_the_late_reply_comes_just_past_the_spin():
    from dt.tools.tune_terms import LATE, late_by

    assert late_by(200e-6) == pytest.approx(400e-6)  # a wait a little longer than the spin
    assert late_by(0.0) == LATE  # waits that sleep at once: any lateness sleeps


def test_ring_scratch_lands_the_largest_chunk_a_reducing_lap_receives():
    """dt.cost.memory: a p - 1 step lap receives every chunk but one (rank r - 1's, on rank r);
    slots 0 and 1 hold the largest received, slot 2 the whole input. Hand-computed, and the
    same as walking the lap step by step (dt.layout.ring_received)."""
    from dt.cost.memory import ring_reduce_scatter_scratch
    from dt.layout import ring_received

    chunks = [5, 9, 3, 7]
    assert ring_reduce_scatter_scratch(chunks, 4, 0) == {2: 96, 0: 36, 1: 36}  # chunk 3 (7) never lands
    assert ring_reduce_scatter_scratch(chunks, 4, 2) == {2: 96, 0: 28, 1: 28}  # chunk 1 (9) never lands
    assert ring_reduce_scatter_scratch([4, 6], 4, 0) == {2: 40, 0: 16}  # one step: its own chunk, one slot
    for r in range(4):
        walked = max(chunks[ring_received(r, 4, s, -1)] for s in range(3))
        assert ring_reduce_scatter_scratch(chunks, 1, r)[0] == walked


def test_a_sharing_ratio_noise_made_zero_is_not_believed():
    """solo = a byte alone / a byte in company: a slope that noise floored at 0 measured nothing and
    gives 1 (no sharing), never 0 (a byte copied alone for free); company is never faster than alone."""
    from dt.tools.tune_terms import _ratio

    assert _ratio(2e-10, 1e-9) == pytest.approx(0.2)
    assert _ratio(0.0, 1e-9) == _ratio(1e-9, 0.0) == _ratio(0.0, 0.0) == 1.0
    assert _ratio(2e-9, 1e-9) == 1.0
