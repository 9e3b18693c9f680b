"""Table 7: predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings.

Every all-reduce algorithm dt.cost can price, at every measured size: the
model's time term by term (steps x alpha, critical-path bytes x beta, reduced
bytes x gamma) next to the measured median. alpha and beta are fitted to this
run's own timings, or taken from `dt tune` where it saved them for this world.
"""

from __future__ import annotations

import math
from typing import Any

from dt import cost
from dt.bench import report as R
from dt.bench.scaling.model import MODELED_ALL_REDUCE, fit_alpha_beta, model_terms, predict
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes
from dt.collectives.registry import ALGORITHMS, needs_shared_memory

TITLE = "Predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings"


def needs(s: Any) -> Needs:
    sizes = {s.big_bytes, s.small_bytes, *s.sweep_bytes}
    # The torch wire's algorithms only: the load/store ones run on shared memory alone, priced by
    # sync and memcpy terms, and table 10 puts them beside the sockets.
    extra = {a for a in MODELED_ALL_REDUCE[2:]
             if a in ALGORITHMS.get("all_reduce", {}) and not needs_shared_memory("all_reduce", a)}
    # gloo: torch's own all-reduce at the same sizes, for the bus-bandwidth plot
    return Needs(allreduce={w: set(sizes) for w in s.coll_worlds},
                 algorithms={"ring", "naive", "gloo"} | extra, gamma=True)


def load_tuned(world: int, backend: str = "gloo") -> dict[str, Any] | None:
    """alpha, beta, gamma that `dt tune --world N` saved for exactly this backend and world."""
    from dt.cost import machine

    try:
        got = machine.figures(backend, world)
    except Exception:  # noqa: BLE001 - an unreadable cache is the same as none
        return None
    if not got or got.get("world") != world or not all(
            isinstance(got.get(k), (int, float)) for k in ("alpha", "beta", "gamma")):
        return None
    return got


def build(st: Results) -> Table:
    s, rows, data, notes = st.s, [], [], []
    fits: dict[int, dict[str, Any]] = {}
    any_tuned = False
    for world in s.coll_worlds:
        algos = [a for a in st.coll_impls() if a in MODELED_ALL_REDUCE]
        points = []
        sizes = [n for n in st.coll_sizes() if (world, n) in st.coll]
        if not sizes:
            notes.append(f"world {world}: not measured")
            continue
        for nbytes in sizes:
            for algo in algos:
                t = st.coll[(world, nbytes)][algo]["time"].median
                points.append((model_terms(algo, nbytes, world), t))
        gamma = st.gamma.get(world, 0.0)
        alpha_fit, beta_fit = fit_alpha_beta(points, gamma)
        fit = {"alpha": alpha_fit, "beta": beta_fit, "gamma": gamma,
               "source": f"fitted to this run's {len(points)} all-reduce timings (gamma: torch.add "
                         "on every rank at once)"}
        tuned = load_tuned(world)
        fits[world] = {"fit": fit, "tune": tuned}
        primary = fit
        if tuned is not None:
            any_tuned = True
            primary = {"alpha": tuned["alpha"], "beta": tuned["beta"], "gamma": tuned["gamma"],
                       "source": f"`dt tune --world {world}` ({tuned.get('measured_at', 'saved')})"}
        for name, f in (("dt tune", primary if tuned is not None else None), ("fit", fit)):
            if f is None:
                continue
            bw = 1 / f["beta"] / 1e9 if f["beta"] else math.inf
            gbw = 1 / f["gamma"] / 1e9 if f["gamma"] else math.inf
            notes.append(f"world {world}, {name}: alpha = {f['alpha'] * 1e6:.0f} us per step, "
                         f"beta = {f['beta'] * 1e9:.3f} ns/B ({bw:.2f} GB/s), gamma = "
                         f"{f['gamma'] * 1e9:.3f} ns/B ({gbw:.2f} GB/s); {f['source']}")
        if tuned is None:
            notes.append(f"world {world}: no `dt tune --world {world}` figures saved on this machine; "
                         "the prediction uses the fit")
        for algo in algos:
            for nbytes in sizes:
                terms = model_terms(algo, nbytes, world)
                t = st.coll[(world, nbytes)][algo]["time"]
                a, b, g = primary["alpha"], primary["beta"], primary["gamma"]
                pred = predict(terms, a, b, g)
                pred_fit = predict(terms, alpha_fit, beta_fit, gamma)
                ratio = pred / t.median if t.median else math.nan
                ratio_fit = pred_fit / t.median if t.median else math.nan
                algbw, busbw = cost.bus_bandwidth("all_reduce", nbytes, t.median, world)
                row = [world, algo, R.fmt_bytes(nbytes), terms["steps"],
                       R.fmt_time(terms["steps"] * a), R.fmt_time(terms["beta_bytes"] * b),
                       R.fmt_time(terms["gamma_bytes"] * g), R.fmt_time(pred), R.fmt_stat_time(t),
                       R.fmt_ratio(ratio)]
                if tuned is not None or any_tuned:
                    row += [R.fmt_ratio(ratio_fit) if tuned is not None else "(same)"]
                rows.append(row + [f"{busbw / 1e9:.2f}"])
                data.append({"world": world, "algorithm": algo, "nbytes": nbytes, **terms,
                             "predicted": pred, "predicted_by": "dt tune" if tuned else "fit",
                             "predicted_fit": pred_fit, "measured": t, "ratio": ratio,
                             "ratio_fit": ratio_fit, "algbw": algbw, "busbw": busbw})
    if any_tuned:  # rows of untuned worlds were built before a later world was found tuned
        width = max(len(r) for r in rows)
        rows = [r if len(r) == width else r[:-1] + ["(same)", r[-1]] for r in rows]
    notes.insert(0, "time = steps x alpha + bytes on the critical path x beta + bytes reduced x "
                    "gamma (ring: 2(p-1) steps, 2(p-1)/p n sent by each rank at once, (p-1)/p n "
                    "reduced; naive: 2 steps, the root receives (p-1) n then sends (p-1) n and "
                    "reduces (p-1) n; recursive doubling: lg p steps of n each; Rabenseifner: 2 lg p "
                    "steps, 2(p-1)/p n; +2 steps and n when p is not a power of two). The terms use "
                    + ("`dt tune`'s figures where saved, else the fit. " if any_tuned else
                       "alpha and beta fitted to this table's own timings (least squares in "
                       "relative error), so pred/meas shows how well one latency and one bandwidth "
                       "explain every algorithm and size. ")
                    + "pred/meas: 1.00x is a perfect model. busbw = n/t x 2(p-1)/p (nccl-tests).")
    notes += contention_notes(s.coll_worlds, st.cores)
    headers = ["world", "algorithm", "size", "steps", "alpha term", "beta term", "gamma term",
               "predicted", "measured", "pred/meas"] + (["pred/meas (fit)"] if any_tuned else []) \
        + ["busbw GB/s"]
    return Table(7, TITLE, headers, rows, notes, data, align=["r", "l"] + ["r"] * (len(headers) - 2),
                 extra={"fits": fits})


def readme(st: Results, t: Table) -> Table:
    """The README's table 7: ring and naive at tables 1 and 2's sizes (all of it in results/)."""
    keep_sizes = {R.fmt_bytes(st.s.big_bytes), R.fmt_bytes(st.s.small_bytes)}
    rows = [r for r in t.rows if r[1] in ("ring", "naive") and r[2] in keep_sizes]
    notes = t.notes + [f"Shown: ring and naive at {' and '.join(sorted(keep_sizes))}; every "
                       "algorithm at every size is in results/scaling.md."]
    return Table(t.id, t.title, t.headers, rows, notes, t.data, t.align, t.extra)


SPEC = TableSpec(7, TITLE, needs, build, readme)
