"""The scaling study's arithmetic and files, and one tiny end-to-end run.

The study's timings are never asserted (2 shared cores); what is checked is
that the numbers it derives from them are derived right: the breakdown sums to
100%, the cost-model terms match dt.cost, the fit recovers known alpha
and beta, the reports are written, and a real run of one small table works.
"""

from __future__ import annotations

import json
import math

import pytest

from dt import cost
from dt.bench import report as R
from dt.bench import scaling as S

# --------------------------------------------------------------------------
# breakdown: parts of a step that sum to 100%
# --------------------------------------------------------------------------


@pytest.mark.parametrize("step,compute,exposed,hidden,bubble", [
    (1.0, 0.6, 0.3, 0.0, 0.0),      # overlap off: compute then wait
    (1.0, 0.7, 0.1, 0.25, 0.0),     # overlap on: part of the comm under backward
    (1.0, 0.2, 0.0, 0.0, 0.7),      # pipeline: mostly bubble
    (1.0, 0.9, 0.4, 0.0, 0.0),      # noise: parts exceed the step
    (2.0, 0.1, 0.0, 0.5, 0.0),      # hidden longer than compute: clipped to compute
    (0.5, 0.0, 0.0, 0.0, 0.0),      # nothing measured: all rest
])
def test_breakdown_sums_to_one(step, compute, exposed, hidden, bubble):
    parts = S.breakdown(step, compute, exposed, hidden, bubble)
    assert list(parts) == list(S.BREAKDOWN_PARTS)
    assert math.isclose(sum(parts.values()), 1.0, rel_tol=1e-12)
    assert all(v >= 0 for v in parts.values())


def test_breakdown_values():
    parts = S.breakdown(1.0, compute=0.7, exposed=0.1, hidden=0.25)
    assert parts["compute"] == pytest.approx(0.45)
    assert parts["hidden_comm"] == pytest.approx(0.25)
    assert parts["exposed_comm"] == pytest.approx(0.1)
    assert parts["rest"] == pytest.approx(0.2)
    over = S.breakdown(1.0, compute=0.9, exposed=0.6)
    assert over["rest"] == 0.0 and over["compute"] == pytest.approx(0.6)
    with pytest.raises(ValueError):
        S.breakdown(0.0, 1.0)


def test_scaling_row():
    assert S.scaling_row(1.0, 0.5, 2) == {"speedup": 2.0, "efficiency": 1.0}
    assert S.scaling_row(0.8, 0.4, 8)["efficiency"] == pytest.approx(0.25)


# --------------------------------------------------------------------------
# the cost model's terms and the alpha-beta fit
# --------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_model_terms_match_cost_model(p):
    n = S.T1_BYTES
    ring = S.model_terms("ring", n, p)
    assert ring["steps"] == 2 * (p - 1)
    assert ring["bytes_sent_max"] == max(cost.ring_all_reduce(n // 4, 4, p, r).bytes_sent
                                         for r in range(p))
    assert ring["bytes_sent_max"] == pytest.approx(2 * (p - 1) / p * n, rel=1e-6)
    naive = S.model_terms("naive", n, p)
    assert naive["steps"] == 2
    assert naive["bytes_sent_max"] == (p - 1) * n
    assert naive["beta_bytes"] == 2 * (p - 1) * n
    with pytest.raises(ValueError):
        S.model_terms("tree", n, p)


def test_fit_recovers_alpha_beta():
    alpha, beta, gamma = 50e-6, 1 / 1.5e9, 1 / 4e9
    points = []
    for p in (2, 4):
        for n in (4096, 262144, 4 << 20, 33554432):
            for algo in ("ring", "naive"):
                terms = S.model_terms(algo, n, p)
                points.append((terms, S.predict(terms, alpha, beta, gamma)))
    a, b = S.fit_alpha_beta(points, gamma)
    assert a == pytest.approx(alpha, rel=1e-6)
    assert b == pytest.approx(beta, rel=1e-6)
    # a latency-free machine: the fit must not go negative
    flat = [(t, S.predict(t, 0.0, beta, 0.0)) for t, _ in points]
    a, b = S.fit_alpha_beta(flat, 0.0)
    assert a >= 0 and b == pytest.approx(beta, rel=1e-3)


def test_aggregate_pipeline_counts_the_wait_for_the_slowest_stage():
    # 2 stages, 1 step: stage 0 computes 3 of its 4 s; stage 1 finishes after 2 s, idle 1 s.
    per_rank = [[{"step": 4.0, "idle": 1.0, "compute": 3.0, "peak_stash": 1, "bytes_sent": 8}],
                [{"step": 2.0, "idle": 1.0, "compute": 1.0, "peak_stash": 1, "bytes_sent": 0}]]
    a = S.aggregate_pipeline(per_rank)
    assert a["step"].median == 4.0
    assert a["bubble_per_stage"] == [0.25, 0.75]  # (1 + 0)/4 and (1 + 2)/4
    assert a["bubble"].median == pytest.approx(0.5)


def test_aggregate_dp_takes_slowest_step():
    r0 = [{"step": 1.0, "comm": 0.2}, {"step": 3.0, "comm": 0.4}]
    r1 = [{"step": 2.0, "comm": 0.4}, {"step": 1.0, "comm": 0.2}]
    a = S.aggregate_dp([r0, r1])
    assert a["step"].median == pytest.approx(2.5)  # per step max: 2.0, 3.0
    assert a["comm"].median == pytest.approx(0.3)


# --------------------------------------------------------------------------
# formatting and files
# --------------------------------------------------------------------------


def test_stats_and_formatting():
    st = R.Stat.of([3.0, 1.0, 2.0])
    assert (st.median, st.lo, st.hi, st.n) == (2.0, 1.0, 3.0, 3)
    assert st.spread == pytest.approx(1.0)
    assert R.per_rep_max([[1, 5], [2, 4]]) == [2, 5]
    assert R.fmt_bytes(33_554_432) == "33.6 MB"
    assert R.fmt_bytes(262_144) == "262.1 KB"
    assert R.fmt_time(0.0695) == "69.5 ms" and R.fmt_time(1.5) == "1.500 s"
    assert R.fmt_time(42e-6) == "42 us"
    assert R.fmt_stat_time(R.Stat.of([0.01, 0.012, 0.011])) == "11.0 ms (±9%)"
    assert R.fmt_pct(0.183) == "18%" and R.fmt_ratio(1.4711) == "1.47x"
    assert R.fmt_pct(math.nan) == "-"


def test_markdown_table():
    text = R.markdown_table(["world", "time"], [[2, "1 ms"], [16, "10 ms"]])
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[0] == "| world |  time |"
    assert lines[1] == "|-------|------:|"
    assert lines[3] == "| 16    | 10 ms |"
    assert len({len(line) for line in lines}) == 1


def test_readme_markers(tmp_path):
    text = f"intro\n{R.README_BEGIN}\nold\n{R.README_END}\noutro\n"
    new = R.replace_between_markers(text, "new table")
    assert new == f"intro\n{R.README_BEGIN}\nnew table\n{R.README_END}\noutro\n"
    assert R.replace_between_markers("no markers", "x") is None
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert R.update_readme(readme, "body")
    assert "body" in readme.read_text() and "old" not in readme.read_text()
    readme.write_text("nothing here")
    assert not R.update_readme(readme, "body")
    assert readme.read_text() == "nothing here"


def test_json_handles_stats_and_nan(tmp_path):
    path = R.write_json(tmp_path / "x.json", {"t": R.Stat.of([1.0, 2.0]), "bad": math.nan})
    got = json.loads(path.read_text())
    assert got == {"t": {"median": 1.5, "min": 1.0, "max": 2.0, "n": 2}, "bad": None}


def test_quick_settings_and_notes():
    s, _ = S.parse_args(["--quick", "--tables", "2,6"])
    assert s.quick and s.tables == (2, 6)
    notes = " ".join(s.shrinkage())
    assert "table 3" not in notes  # only what the selected tables shrank
    assert "collectives at world sizes 2, 4" in notes
    assert S.StudySettings().worlds_used() == [1, 2, 4, 8]
    assert R.oversubscription_note(8, 2) and R.oversubscription_note(2, 2) is None


# --------------------------------------------------------------------------
# one tiny end-to-end run: table 2 at world 2, written to disk
# --------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_end_to_end_table_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a fresh clone's: nothing tuned
    rc = S.main(["--tables", "2", "--worlds", "2", "--small", "4096", "--reps", "2",
                 "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "### Table 2." in out and "validation is off" in out
    # the predictions are '-' until dt tune has run, and one line says how to get them
    assert len([line for line in out.splitlines() if "`dt tune --world 2`" in line]) == 1, out
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert data["machine"]["cores"] >= 1 and data["machine"]["backend"] == "gloo"
    rows = data["tables"]["2"]["data"]
    assert [r["wire"] for r in rows] == ["torch", "shm"]  # both wires, each beside its prediction
    for row in rows:
        assert row["world"] == 2 and row["ring_steps"] == 2 and row["naive_steps"] == 2
        assert row["ring_time"]["n"] == 4 * 2 and row["ring_time"]["median"] > 0  # 4x reps up to 1 MB
        assert "ring_predicted" in row and "naive_predicted" in row
    assert data["tables"]["2"]["machine"] == data["machine"]
    md = (tmp_path / "scaling.md").read_text()
    assert "### Table 2." in md and "Produced by `python -m dt.bench.scaling" in md
    assert (tmp_path / "allreduce_vs_world.png").stat().st_size > 1000


# --------------------------------------------------------------------------
# tables built from synthetic measurements (no workers): every builder, files, plots
# --------------------------------------------------------------------------


def save_tuned(tmp_path, monkeypatch, world: int | None, alpha: float, beta: float, gamma: float) -> None:
    """A tune.json of the test's own: the torch and shm wires' figures at `world` (None: empty)."""
    from dt.cost import machine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    machine.forget()
    if world is not None:
        machine.save({"backend": "gloo", "world": world, "alpha": alpha, "beta": beta, "gamma": gamma,
                      "measured_at": "now"})
        machine.save({"backend": "shm", "world": world, "alpha": alpha / 2, "beta": beta / 2, "gamma": gamma,
                      "sync": alpha / 4, "mem": beta / 4, "measured_at": "now"})


def _fake_study(tmp_path, tuned: bool, monkeypatch) -> S.Study:
    """A Study whose measurements follow the cost model exactly (alpha 100 us, 1 GB/s)."""
    s, _ = S.parse_args(["--quick", "--out", str(tmp_path)])
    st = S.Study(s, progress=False)
    alpha, beta, gamma = 100e-6, 1e-9, 0.1e-9
    for world in s.coll_worlds:
        st.gamma[world] = gamma
        for n in st.coll_sizes():
            agg = {}
            for algo in st.coll_impls():
                terms = S.model_terms(algo if algo != "gloo" else "ring", n, world)
                t = S.predict(terms, alpha, beta, gamma)
                agg[algo] = {"time": R.Stat.of([t, t * 1.1, t * 0.9])}
                if algo != "gloo":
                    agg[algo].update(bytes_sent_max=terms["bytes_sent_max"], messages_sent_max=2)
            st.coll[(world, n)] = agg
    for world, batch, impls in st.dp_plan():
        m = {}
        for impl in impls:
            step = 1.0 / world + (0.2 if impl != "compute" else 0.0)
            rec = {"step": step, "forward": 0.1 / world, "backward": 0.8 / world, "optimizer": 0.01}
            if impl.startswith("dt"):
                rec.update(backward_compute=0.7 / world, comm=0.25, exposed=0.2,
                           hidden=0.05 if impl == "dt_on" else 0.0, bytes_sent=1e6)
            m[impl] = S.aggregate_dp([[rec, rec]])
        if world == 1:
            m["compute_1t"] = S.aggregate_dp([[{"step": 2.0}]])
        else:  # the run's own single-process baseline, and its one-thread guard (slower here)
            m["t1"] = S.aggregate_dp([[{"step": 1.25}]])
            m["t1_1t"] = S.aggregate_dp([[{"step": 3.0}]])
        st.dp[(world, batch)] = m
    for kind, sched, mb in st.pp_plan():
        per_rank = [[{"step": 1.0, "idle": 0.5, "compute": 0.5, "peak_stash": mb, "bytes_sent": 10}]
                    for _ in range(s.pp_stages)]
        st.pp[(kind, sched, mb)] = S.aggregate_pipeline(per_rank)
    # dt tune figures for the first world only, both wires (tuned), or none at all, in a cache of
    # the test's own: never what this machine saved
    save_tuned(tmp_path, monkeypatch, s.coll_worlds[0] if tuned else None, alpha, beta, gamma)
    return st


@pytest.mark.parametrize("tuned", [False, True])
def test_every_table_from_synthetic_measurements(tmp_path, monkeypatch, tuned):
    st = _fake_study(tmp_path, tuned, monkeypatch)
    for i in S.ALL_TABLES:
        st.tables[i] = S.BUILDERS[i](st)
        md = st.tables[i].markdown()
        widths = {line.count("|") for line in md.splitlines() if line.startswith("|")}
        assert len(widths) == 1, f"table {i} has ragged rows"
    # the fit reproduces the synthetic data it was fitted to (torch wire: one alpha, one beta)
    t7 = st.tables[7]
    assert all(r["ratio_fit"] == pytest.approx(1.0, rel=1e-3) for r in t7.data if r["wire"] == "torch")
    check_predictions(st, tuned)
    # table 5: every row sums to 100%
    for row in st.tables[5].data:
        assert sum(row[k] for k in S.BREAKDOWN_PARTS) == pytest.approx(1.0)
    # table 3: the world-1 baseline is the multi-thread step (1.0 s beats the 1-thread 2.0 s)
    t3 = st.tables[3].data
    assert t3[0]["world"] == 1 and t3[0]["speedup"] == 1.0
    # T1 is the fastest single-process step of that batch: the world-1 run's 1.0 s for table 3,
    # the world-4 run's own 1.25 s where no world-1 run exists (table 4); never a 1-thread one here
    assert all(r["t1"] == 1.0 for r in t3)
    assert all(r["t1"] == 1.25 for r in st.tables[4].data)
    assert st.t1_single_thread == set()
    from dt.bench.scaling.report import headline  # the record's: table 1's ring at the largest world

    world, size = max(st.s.coll_worlds), R.fmt_bytes(st.s.big_bytes)
    ring = {d["wire"]: R.fmt_time(d["ring_time"].median) for d in st.tables[1].data if d["world"] == world}
    assert headline(st) == (f"ring all-reduce {size} world {world}: {ring['torch']} on torch "
                            f"(1.00x gloo's time), {ring['shm']} on shm")
    paths = S.write_outputs(st, tmp_path, "python bench/scaling.py --quick", 1.0)
    from dt.bench.scaling import plots

    paths += plots.write_all(st, tmp_path)
    names = {p.name for p in paths}
    assert {"scaling.json", "scaling.md", "allreduce_vs_world.png", "busbw_vs_size.png",
            "efficiency.png", "breakdown.png", "bubble.png"} <= names
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert set(data["tables"]) == {str(i) for i in S.ALL_TABLES}
    assert data["tables"]["7"]["fits"]


def test_one_line_says_which_worlds_to_tune(tmp_path, monkeypatch):
    from dt.bench.scaling.predicted import how_to_tune

    save_tuned(tmp_path, monkeypatch, None, 1e-4, 1e-9, 1e-10)  # a fresh clone: nothing saved
    line = how_to_tune([1, 2, 4])
    assert "world 2, 4" in line and "`dt tune --world 2 && dt tune --world 4`" in line, line
    save_tuned(tmp_path, monkeypatch, 2, 1e-4, 1e-9, 1e-10)  # world 2 tuned on both wires
    assert "`dt tune --world 4`" in how_to_tune([1, 2, 4]) and "world 2" not in how_to_tune([1, 2, 4])
    assert how_to_tune([1, 2]) is None  # every world priced: nothing to say


def check_predictions(st: S.Study, tuned: bool) -> None:
    """Every prediction the tables print is the cost model's figure for the tuned values: the
    all-reduces dt.collectives.auto.tuned_predictions' (what `dt model --measured` prints), the
    gradient sync dt.plan's; where the world was not tuned there is none."""
    from dt.bench.ddp import reference_model
    from dt.collectives.auto import tuned_predictions
    from dt.cost import machine
    from dt.plan.cluster import local_cluster
    from dt.plan.comm import collective_seconds
    from dt.plan.stage import bucket_bytes

    first = st.s.coll_worlds[0]

    def expected(impl: str, nbytes: int, world: int) -> float | None:
        saved = machine.figures("shm" if impl.endswith("@shm") else "gloo", world)
        if not tuned or world != first:
            return None
        return tuned_predictions("all_reduce", nbytes, world, saved)[impl.partition("@")[0]].total

    for r in st.tables[7].data:
        assert r["predicted"] == expected(r["algorithm"], r["nbytes"], r["world"]), r
        if r["predicted"] is None:
            assert math.isnan(r["ratio"])
    for i in (1, 2):
        rows = st.tables[i].data
        assert {r["wire"] for r in rows} == {"torch", "shm"}
        for r in rows:
            at = "@shm" if r["wire"] == "shm" else ""
            for algo in ("ring", "naive"):
                assert r[f"{algo}_predicted"] == expected(algo + at, r["nbytes"], r["world"]), (i, r)
    for r in st.tables[3].data:
        if not r["impl"].startswith("dt"):
            assert r["comm_predicted"] is None and r["step_predicted"] is None
            continue
        if not tuned or r["world"] != first:
            assert r["comm_predicted"] is None and r["step_predicted"] is None, r
            continue
        grads = [p.numel() for p in reference_model(st.s.hidden, st.s.layers).parameters()]
        cluster = local_cluster(r["world"])
        want = sum(collective_seconds(cluster, "all_reduce", n, tuple(range(r["world"])))
                   for n in bucket_bytes(grads, 4))
        assert r["comm_predicted"] == pytest.approx(want, rel=1e-12) and want > 0
        compute = st.dp[(r["world"], r["global_batch"])]["compute"]["step"].median
        if r["impl"] == "dt_off":
            assert r["step_predicted"] == pytest.approx(compute + want)
        else:
            assert compute <= r["step_predicted"] <= compute + want
    dp_rows = [r for r in st.tables[5].data if "impl" in r]
    assert any(r["exposed_comm_predicted"] is not None for r in dp_rows) == tuned


def test_the_study_and_dt_model_measured_price_alike(tmp_path, monkeypatch):
    """Table 7's pricing is `dt model all_reduce --measured`'s: one function, the same figures."""
    from dt.collectives.auto import tuned_predictions
    from dt.cost import machine
    from dt.tools import whatif

    save_tuned(tmp_path, monkeypatch, 2, 100e-6, 1e-9, 0.1e-9)
    for wire in ("gloo", "shm"):
        saved = machine.figures(wire, 2)
        for n in (4096, 262144, 33554432):
            got = dict(whatif.tuned_table("all_reduce", n, 2, saved))
            same = dict(whatif.table("all_reduce", n, 2, saved["alpha"], saved["beta"], saved["gamma"],
                                     saved.get("sync"), saved.get("mem")))
            assert got == same == tuned_predictions("all_reduce", n, 2, saved)
            assert ("one_shot" in got) == (wire == "shm")


def _steps(steps: list[float], exposed: float | None = None) -> dict:
    """One impl's aggregated records at one world (two ranks alike), with dt's timers if `exposed`."""
    recs = [{"step": t, **({} if exposed is None else {"exposed": exposed, "busy": t - exposed,
                                                       "comm": exposed, "hidden": 0.0,
                                                       "backward_compute": t / 2, "bytes_sent": 1e6})}
            for t in steps]
    return S.aggregate_dp([recs, recs])


def test_table_3s_bound_is_at_most_every_step_it_bounds(tmp_path, monkeypatch):
    """The study's arithmetic holds the bound under dt's rows and the no-communication row, however
    noisy: here the figures that once put dt's DDP (113.8 ms) under a 'bound' of 136.7 ms, with the
    share computed alone slower still (a burst of load)."""
    st = _fake_study(tmp_path, False, monkeypatch)
    batch = st.s.dp_batch
    world = max(w for w, b in st.dp if b == batch)
    m = st.dp[(world, batch)]
    m["compute"] = _steps([0.1367, 0.140, 0.150])
    m["dt_on"] = _steps([0.1138, 0.120, 0.125], exposed=0.004)
    m["dt_off"] = _steps([0.130, 0.135, 0.160], exposed=0.030)
    m["alone"] = S.aggregate_dp([[{"step": 0.150}, {"step": 0.155}]])
    t3 = S.BUILDERS[3](st)
    here = {r["impl"]: r for r in t3.data if r["world"] == world}
    bound = here["bound"]["step"].median
    assert bound == pytest.approx(0.130 - 0.030)  # the fastest dt step's compute: less its exposed wait
    for impl in ("compute", "dt_off", "dt_on"):
        assert bound <= here[impl]["step"].lo, impl  # every repetition, not only the median
    labels = [row[1] for row in t3.rows if row[0] == world]
    assert labels[:2] == ["lower bound: one rank's share", "no communication, ranks at once"], labels
    assert not any("bound" in label for label in labels[1:])
    m["alone"] = S.aggregate_dp([[{"step": 0.05}]])  # alone it was faster: that is the bound
    assert {r["impl"]: r for r in S.BUILDERS[3](st).data if r["world"] == world}["bound"][
        "step"].median == 0.05


def test_table_3s_world_1_row_keeps_its_own_definition(tmp_path, monkeypatch):
    """speedup = T1 / s/step on the world-1 row too, when rank 0 alone beat the world-1 run."""
    st = _fake_study(tmp_path, False, monkeypatch)
    batch = st.s.dp_batch
    bigger = max(w for w, b in st.dp if b == batch)
    st.dp[(bigger, batch)]["t1"] = S.aggregate_dp([[{"step": 0.89}]])  # faster than world 1's 1.0 s
    t3 = S.BUILDERS[3](st)
    first = t3.data[0]
    assert first["world"] == 1 and first["t1"] == 0.89
    assert first["speedup"] == pytest.approx(0.89) and first["efficiency"] == pytest.approx(0.89)
    assert t3.rows[0][6] == "0.89x", t3.rows[0]


def test_a_failed_measurement_leaves_a_gap_not_a_crash(tmp_path, monkeypatch):
    st = _fake_study(tmp_path, False, monkeypatch)
    del st.coll[(st.s.coll_worlds[-1], st.s.big_bytes)]
    st.failures.append("all-reduce world 4: WorkerError: boom")
    for i in (1, 2, 7):
        st.tables[i] = S.BUILDERS[i](st)
    assert "not measured" in st.tables[1].markdown()
    md = S.report_markdown(st, "python bench/scaling.py", 1.0)
    assert "FAILED (its rows are missing): all-reduce world 4" in md


def test_plan_groups_units_by_world():
    s, _ = S.parse_args(["--quick"])
    worlds = [w for w, _, _ in S.Study(s, progress=False).plan()]
    assert worlds == sorted(worlds) and set(worlds) == {1, 2, 4}


def test_readme_body_is_the_report_with_a_shorter_table_7(tmp_path, monkeypatch):
    st = _fake_study(tmp_path, False, monkeypatch)
    for i in S.ALL_TABLES:
        st.tables[i] = S.BUILDERS[i](st)
    body = S.report_markdown(st, "python bench/scaling.py --quick", 60.0, for_readme=True)
    assert body.startswith("Produced by `python bench/scaling.py --quick`")
    assert "2 cores" in body or f"{st.cores} cores" in body
    t7 = body[body.index("### Table 7."):]
    assert "recursive_doubling" not in t7.split("\n- ")[0]
    readme = tmp_path / "README.md"
    readme.write_text(f"# dt\n\n{R.README_BEGIN}\n{R.README_END}\n\nmore\n")
    assert R.update_readme(readme, body)
    text = readme.read_text()
    assert text.startswith("# dt\n") and text.endswith(f"{R.README_END}\n\nmore\n")
    assert "### Table 1." in text and "### Table 6." in text


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 16])
def test_simulated_bubble_is_the_formula(p, m):
    from dt.parallel.pipeline import bubble_fraction

    for name in ("gpipe", "1f1b"):
        assert S.simulate_bubble(name, p, m) == pytest.approx(bubble_fraction(p, m))


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (4, 4), (4, 16), (3, 6)])
def test_simulated_interleaved_bubble(p, m):
    from dt.parallel.pipeline import bubble_fraction, schedule

    try:
        schedule("interleaved", p, 0, m, 2)
    except (ValueError, TypeError):
        pytest.skip("dt.pipeline has no interleaved schedule")
    assert S.simulate_bubble("interleaved", p, m, 2) == pytest.approx(bubble_fraction(p, m, 2))


def test_every_plain_algorithm_a_table_asks_for_runs_on_the_torch_wire():
    """A plain name is timed on the torch wire (dt/bench/scaling/workers.py); the load/store
    algorithms exist only on shared memory, so a table must ask for them as 'name@shm'."""
    from dt.bench.scaling.tables import TABLES
    from dt.collectives.registry import needs_shared_memory

    for number, spec in TABLES.items():
        for impl in spec.needs(S.StudySettings()).algorithms:
            name, _, wire = impl.partition("@")
            assert wire or not needs_shared_memory("all_reduce", name), (number, impl)
