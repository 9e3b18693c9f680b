"""Table 7: predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings.

Every all-reduce algorithm dt.cost can price, on both wires (plain names:
the torch wire; "@shm": the shared-memory wire), at every measured size:
the model's time term by term (steps x alpha, critical-path bytes x beta,
reduced bytes x gamma, and the terms beyond them: dt.cost.overheads) next
to the measured median. The figures are `dt tune`'s for that wire and world
where it saved them (with its terms), else alpha and beta fitted to this
run's own timings of that wire (no terms then: a fit has none).
"""

from __future__ import annotations

import math
import os
from typing import Any

from dt import cost
from dt.bench import report as R
from dt.bench.scaling.model import MODELED_ALL_REDUCE, fit_alpha_beta, model_terms
from dt.bench.scaling.tables.base import Needs, Results, Table, TableSpec, contention_notes
from dt.collectives.registry import ALGORITHMS, needs_shared_memory
from dt.cost.loadstore import LOADSTORE
from dt.cost.overheads import Overheads

TITLE = "Predicted vs measured: the alpha-beta-gamma cost model against the all-reduce timings"
WITHIN = 0.20  # the bar: |predicted - measured| / measured
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


def _wire(impl: str) -> str:
    return "shm" if impl.endswith("@shm") else "torch"


def _figures(tuned: dict[str, Any] | None, fit: dict[str, Any], algo: str) -> tuple[float, float, float]:
    """(alpha, beta, gamma) an algorithm is priced with: load/store ones at sync and mem (dt tune's)."""
    f = tuned or fit
    if ("all_reduce", algo) in LOADSTORE and tuned is not None:
        return tuned.get("sync", f["alpha"]), tuned.get("mem", f["beta"]), f["gamma"]
    return f["alpha"], f["beta"], f["gamma"]


def _note(world: int, wire: str, name: str, f: dict[str, Any]) -> str:
    bw = 1 / f["beta"] / 1e9 if f["beta"] else math.inf
    gbw = 1 / f["gamma"] / 1e9 if f["gamma"] else math.inf
    load = f", load average {f['load']:.1f} when tuned" if isinstance(f.get("load"), (int, float)) else ""
    extra = (f", sync {f['sync'] * 1e6:.0f} us, memcpy {f['mem'] * 1e9:.3f} ns/B"
             if isinstance(f.get("sync"), (int, float)) and isinstance(f.get("mem"), (int, float)) else "")
    return (f"world {world} {wire} wire, {name}: alpha = {f['alpha'] * 1e6:.0f} us per step, beta = "
            f"{f['beta'] * 1e9:.3f} ns/B ({bw:.2f} GB/s), gamma = {f['gamma'] * 1e9:.3f} ns/B ({gbw:.2f} "
            f"GB/s){extra}; {f['source']}{load}")


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
    any_tuned = False
    counts: list[str] = []
    for world in s.coll_worlds:
        impls = [a for a in st.coll_impls() if a.partition("@")[0] in MODELED_ALL_REDUCE]
        sizes = [n for n in st.coll_sizes() if (world, n) in st.coll]
        if not sizes:
            notes.append(f"world {world}: not measured")
            continue
        fits[world] = {}
        for wire in ("torch", "shm"):
            algos = [a for a in impls if _wire(a) == wire]
            if not algos:
                continue
            fit = _fit(st, world, algos, sizes)
            tuned = load_tuned(world, "shm" if wire == "shm" else "gloo")
            fits[world][wire] = {"fit": fit, "tune": tuned}
            if tuned is not None:
                any_tuned = True
                tuned = dict(tuned, source=f"`dt tune --world {world}` ({tuned.get('measured_at', 'saved')})")
                notes.append(_note(world, wire, "dt tune", tuned))
            else:
                notes.append(f"world {world} {wire} wire: no `dt tune --world {world}` figures saved on this "
                             "machine; the prediction uses the fit")
            notes.append(_note(world, wire, "fit", fit))
            overheads = Overheads.from_saved(tuned)
            good = 0
            for algo in algos:
                name = algo.partition("@")[0]
                for nbytes in sizes:
                    t = st.coll[(world, nbytes)][algo]["time"]
                    a, b, g = _figures(tuned, fit, name)
                    e = cost.estimate("all_reduce", name, nbytes, world, alpha=a, beta=b, gamma=g,
                                      overheads=overheads)
                    pred_fit = cost.estimate("all_reduce", name, nbytes, world, alpha=fit["alpha"],
                                             beta=fit["beta"], gamma=fit["gamma"]).total
                    ratio = e.total / t.median if t.median else math.nan
                    ratio_fit = pred_fit / t.median if t.median else math.nan
                    good += abs(ratio - 1) <= WITHIN
                    algbw, busbw = cost.bus_bandwidth("all_reduce", nbytes, t.median, world)
                    row = [world, algo, R.fmt_bytes(nbytes), e.steps, R.fmt_time(e.latency),
                           R.fmt_time(e.bandwidth), R.fmt_time(e.reduction),
                           *(R.fmt_time(getattr(e.terms, f)) for _, f in TERMS),
                           R.fmt_time(e.total), R.fmt_stat_time(t), R.fmt_ratio(ratio)]
                    if tuned is not None or any_tuned:
                        row += [R.fmt_ratio(ratio_fit) if tuned is not None else "(same)"]
                    rows.append(row + [f"{busbw / 1e9:.2f}"])
                    data.append({"world": world, "algorithm": algo, "wire": wire, "nbytes": nbytes,
                                 **model_terms(name, nbytes, world),
                                 **{f: getattr(e.terms, f) for _, f in TERMS},
                                 "predicted": e.total, "predicted_by": "dt tune" if tuned else "fit",
                                 "predicted_fit": pred_fit, "measured": t, "ratio": ratio,
                                 "ratio_fit": ratio_fit, "algbw": algbw, "busbw": busbw})
            counts.append(f"world {world} {wire} wire: {good} of {len(algos) * len(sizes)}")
    if any_tuned:  # rows of untuned worlds were built before a later world was found tuned
        width = max(len(r) for r in rows)
        rows = [r if len(r) == width else r[:-1] + ["(same)", r[-1]] for r in rows]
    notes.insert(0, "time = steps x alpha + bytes on the critical path x beta + bytes reduced x "
                    "gamma (ring: 2(p-1) steps, 2(p-1)/p n sent by each rank at once, (p-1)/p n "
                    "reduced; naive: 2 steps, the root receives (p-1) n then sends (p-1) n and "
                    "reduces (p-1) n; recursive doubling: lg p steps of n each; Rabenseifner: 2 lg p "
                    "steps, 2(p-1)/p n; +2 steps and n when p is not a power of two; one_shot, "
                    "two_shot: syncs at `sync`, bytes copied and read at `mem`), plus the terms `dt "
                    "tune` measured on their own micro-benchmarks (dt/cost/overheads.py: software per "
                    "message posted, wake-up of a sleeping wait, bandwidth shared by the ranks copying "
                    "at once, oversubscription, which is moved out of the latency column, not added). "
                    "The terms use "
                    + ("`dt tune`'s figures where saved, else the fit (alpha and beta only). " if any_tuned
                       else "alpha and beta fitted to each wire's own timings in this table (least squares "
                            "in relative error), so pred/meas shows how well one latency and one "
                            "bandwidth explain every algorithm and size. ")
                    + "pred/meas: 1.00x is a perfect model. busbw = n/t x 2(p-1)/p (nccl-tests).")
    notes.append(f"within {WITHIN:.0%} of the measurement: " + "; ".join(counts)
                 + f" (load average at the end of the run: {os.getloadavg()[0]:.1f})")
    notes += contention_notes(s.coll_worlds, st.cores)
    headers = ["world", "algorithm", "size", "steps", "alpha term", "beta term", "gamma term",
               *(h for h, _ in TERMS), "predicted", "measured", "pred/meas"] \
        + (["pred/meas (fit)"] if any_tuned else []) + ["busbw GB/s"]
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
