"""Table 7: predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings.

Every all-reduce algorithm dt.cost can price, on both wires (plain names:
the torch wire; "@shm": the shared-memory wire), at every measured size:
the model's time term by term (steps x alpha, critical-path bytes x beta,
reduced bytes x gamma, and the terms beyond them: dt.cost.overheads) next
to the measured median. The figures are those `dt tune --world N` saved for
that world and wire, priced as `dt model all_reduce --measured` prices them
(dt.collectives.auto.tuned_predictions, through predicted.py); a world not
tuned has no prediction. Beside it, alpha and beta fitted to this run's own
timings of the wire: circular (fitted to what it is compared with), so it is
labelled a fit, kept to show how far one latency and one bandwidth can go.
"""

from __future__ import annotations

import math
import os
from typing import Any

from dt import cost
from dt.bench import report as R
from dt.bench.scaling import predicted as P
from dt.bench.scaling.model import MODELED_ALL_REDUCE, fit_alpha_beta, model_terms
from dt.bench.scaling.predicted import wire_of
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes
from dt.collectives.registry import ALGORITHMS, needs_shared_memory

TITLE = "Predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings"
WITHIN = 0.20  # the bar the cost model is held to: |predicted - measured| / measured
TERMS = (("software", "software"), ("wake", "wake"), ("sharing", "sharing"),
         ("oversub", "oversubscription"))  # (header, dt.cost.Terms field)


def needs(s: Any) -> Needs:
    sizes = {s.big_bytes, s.small_bytes, *s.sweep_bytes}
    registered = [a for a in MODELED_ALL_REDUCE if a in ALGORITHMS.get("all_reduce", {})]
    torch_wire = {a for a in registered if not needs_shared_memory("all_reduce", a)}
    # gloo: torch's own all-reduce at the same sizes, for the bus-bandwidth plot
    return Needs(allreduce={w: set(sizes) for w in s.coll_worlds},
                 algorithms={"ring", "naive", "gloo"} | torch_wire | {f"{a}@shm" for a in registered},
                 gamma=True)


def _note(world: int, wire: str, name: str, f: dict[str, Any]) -> str:
    bw = 1 / f["beta"] / 1e9 if f["beta"] else math.inf
    gbw = 1 / f["gamma"] / 1e9 if f["gamma"] else math.inf
    load = f", load average {f['load']:.1f} when tuned" if isinstance(f.get("load"), (int, float)) else ""
    extra = (f", sync {f['sync'] * 1e6:.0f} us, memcpy {f['mem'] * 1e9:.3f} ns/B"
             if isinstance(f.get("sync"), (int, float)) and isinstance(f.get("mem"), (int, float)) else "")
    return (f"world {world} {wire} wire, {name}: alpha = {f['alpha'] * 1e6:.0f} us per step, beta = "
            f"{f['beta'] * 1e9:.3f} ns/B ({bw:.2f} GB/s), gamma = {f['gamma'] * 1e9:.3f} ns/B ({gbw:.2f} "
            f"GB/s){extra}; {f['source']}{load}")


def _cells(e: cost.Estimate | None) -> list[Any]:
    """The estimate term by term (steps .. predicted); '-' where the world was not tuned."""
    if e is None:
        return ["-"] * (5 + len(TERMS))
    return [e.steps, R.fmt_time(e.latency), R.fmt_time(e.bandwidth), R.fmt_time(e.reduction),
            *(R.fmt_time(getattr(e.terms, f)) for _, f in TERMS), R.fmt_time(e.total)]


def _fit(st: Results, world: int, algos: list[str], sizes: list[int]) -> dict[str, Any]:
    points = [(model_terms(a, n, world), st.coll[(world, n)][a]["time"].median) for n in sizes for a in algos]
    gamma = st.gamma.get(world, 0.0)
    alpha, beta = fit_alpha_beta(points, gamma)
    return {"alpha": alpha, "beta": beta, "gamma": gamma,
            "source": f"fitted to this run's {len(points)} all-reduce timings on this wire (gamma: "
                      "torch.add on every rank at once)"}


def build(st: Results) -> Table:
    s, rows, data, notes = st.s, [], [], []
    fits: dict[int, dict[str, Any]] = {}
    counts: list[str] = []
    fit_counts: list[str] = []
    for world in s.coll_worlds:
        impls = [a for a in st.coll_impls() if a.partition("@")[0] in MODELED_ALL_REDUCE]
        sizes = [n for n in st.coll_sizes() if (world, n) in st.coll]
        if not sizes:
            notes.append(f"world {world}: not measured")
            continue
        fits[world] = {}
        for wire in ("torch", "shm"):
            algos = [a for a in impls if wire_of(a) == wire]
            if not algos:
                continue
            fit = _fit(st, world, algos, sizes)
            saved = P.tuned(world, wire, s.backend)
            fits[world][wire] = {"fit": fit, "tune": saved}
            if saved is not None:
                notes.append(_note(world, wire, "dt tune", dict(
                    saved, source=f"`dt tune --world {world}` ({saved.get('measured_at', 'saved')})")))
            else:
                notes.append(f"world {world} {wire} wire: no `dt tune --world {world}` figures saved: no "
                             "prediction (only the fit, which is not one)")
            notes.append(_note(world, wire, "fit", fit))
            good = good_fit = 0
            for algo in algos:
                name = algo.partition("@")[0]
                for nbytes in sizes:
                    t = st.coll[(world, nbytes)][algo]["time"]
                    e = P.all_reduce(saved, algo, nbytes, world)
                    pred_fit = cost.estimate("all_reduce", name, nbytes, world, alpha=fit["alpha"],
                                             beta=fit["beta"], gamma=fit["gamma"]).total
                    ratio = e.total / t.median if e is not None and t.median else math.nan
                    ratio_fit = pred_fit / t.median if t.median else math.nan
                    good += abs(ratio - 1) <= WITHIN
                    good_fit += abs(ratio_fit - 1) <= WITHIN
                    algbw, busbw = cost.bus_bandwidth("all_reduce", nbytes, t.median, world)
                    rows.append([world, algo, R.fmt_bytes(nbytes), *_cells(e), R.fmt_stat_time(t),
                                 R.fmt_ratio(ratio), R.fmt_ratio(ratio_fit), f"{busbw / 1e9:.2f}"])
                    data.append({"world": world, "algorithm": algo, "wire": wire, "nbytes": nbytes,
                                 **model_terms(name, nbytes, world),
                                 **({f: getattr(e.terms, f) for _, f in TERMS} if e is not None else {}),
                                 "predicted": e.total if e is not None else None,
                                 "predicted_by": "dt tune" if e is not None else None,
                                 "predicted_fit": pred_fit, "measured": t, "ratio": ratio,
                                 "ratio_fit": ratio_fit, "algbw": algbw, "busbw": busbw})
            total = len(algos) * len(sizes)
            counts.append(f"world {world} {wire} wire: " + (f"{good} of {total}" if saved is not None
                                                            else "not tuned"))
            fit_counts.append(f"world {world} {wire}: {good_fit} of {total}")
    notes.insert(0, "time = steps x alpha + bytes on the critical path x beta + bytes reduced x "
                    "gamma (ring: 2(p-1) steps, 2(p-1)/p n sent by each rank at once, (p-1)/p n "
                    "reduced; naive: 2 steps, the root receives (p-1) n then sends (p-1) n and "
                    "reduces (p-1) n; recursive doubling: lg p steps of n each; Rabenseifner: 2 lg p "
                    "steps, 2(p-1)/p n; +2 steps and n when p is not a power of two; one_shot, "
                    "two_shot: syncs at `sync`, bytes copied and read at `mem`), plus the terms `dt "
                    "tune` measured on their own micro-benchmarks (dt/cost/overheads.py: software per "
                    "message posted, wake-up of a sleeping wait, bandwidth shared by the ranks copying "
                    "at once, oversubscription, which is moved out of the latency column, not added). "
                    "The figures are those `dt tune --world N` saved for that world and wire, priced as "
                    "`dt model all_reduce --measured` prices them (dt.collectives.auto.tuned_predictions: "
                    "the same segments and staging dt runs); a world not tuned has no prediction. "
                    "pred/meas: 1.00x is a perfect model. pred/meas (fit): alpha and beta fitted to this "
                    "table's own timings of the wire (least squares in relative error, gamma measured): "
                    "circular, not a prediction; it shows how well one latency and one bandwidth could "
                    "explain every algorithm and size. busbw = n/t x 2(p-1)/p (nccl-tests).")
    notes.append(f"within {WITHIN:.0%} of the measurement, predicted from `dt tune`'s figures: "
                 + "; ".join(counts) + f" (load average at the end of the run: {os.getloadavg()[0]:.1f}); "
                 "the fit's (circular, for comparison only): " + "; ".join(fit_counts))
    notes += contention_notes(s.coll_worlds, st.cores)
    headers = ["world", "algorithm", "size", "steps", "alpha term", "beta term", "gamma term",
               *(h for h, _ in TERMS), "predicted", "measured", "pred/meas", "pred/meas (fit)",
               "busbw GB/s"]
    return Table(7, TITLE, headers, rows, notes, data, align=["r", "l"] + ["r"] * (len(headers) - 2),
                 extra={"fits": fits})


def readme(st: Results, t: Table) -> Table:
    """The README's table 7: ring and naive (both wires) and the load/store algorithms at tables 1
    and 2's sizes (all of it in results/)."""
    keep_sizes = {R.fmt_bytes(st.s.big_bytes), R.fmt_bytes(st.s.small_bytes)}
    shown = ("ring", "naive", "ring@shm", "naive@shm", "one_shot@shm", "two_shot@shm")
    rows = [r for r in t.rows if r[1] in shown and r[2] in keep_sizes]
    notes = t.notes + [f"Shown: {', '.join(shown)} at {' and '.join(sorted(keep_sizes))}; every "
                       "algorithm at every size is in results/scaling.md."]
    return Table(t.id, t.title, t.headers, rows, notes, t.data, t.align, t.extra)


SPEC = TableSpec(7, TITLE, needs, build, readme)
