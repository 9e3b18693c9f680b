"""The one figure the published suite fits: each device's large-GEMM efficiency, with the error on
every source left out of the fit.

Every other input of the planner is stated (dt.cost.devices, dt.cost.stack) or counted; how large
a fraction of its peak a GPU's GEMMs sustain in a real step (clocks under a full node's power,
cuBLAS's kernels at the shapes training runs) is not printed anywhere, so it is fitted: the value
that makes the mean over sources of each source's median |predicted / published - 1| smallest
over the device's rows.

A row's step is affine in the GEMMs' seconds, which scale as 1 / efficiency: pricing each row at
two efficiencies gives step(e) = a + b / e exactly for its GEMM-bound part (the rest does not
depend on e), so the fit scans e on that line instead of pricing every row again. Leave one
source out: fit on the other sources, report the error on the one left out; a constant that only
fits its own source shows up there.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dt.plan.suite import Compared, priced_rows

__all__ = ["PROBES", "Line", "fit", "fit_table", "leave_one_out", "lines", "report"]

PROBES = (0.45, 0.85)  # the two efficiencies each row is priced at
GRID = [e / 100 for e in range(30, 96)]


@dataclass(frozen=True)
class Line:
    """One row's prediction as a function of its device's efficiency."""

    at_low: Compared  # priced at PROBES[0]
    a: float  # seconds that do not scale with the GEMMs
    b: float  # GEMM seconds x efficiency

    @property
    def source(self) -> str:
        return self.at_low.row.source

    @property
    def device(self) -> str:
        return self.at_low.row.cluster.device or ""

    def error(self, efficiency: float) -> float:
        """predicted / published - 1 at this efficiency, in the row's unit."""
        step = self.a + self.b / efficiency
        c = self.at_low
        predicted = step if c.row.metric == "s_per_iter" else c.predicted * c.step / step
        return predicted / c.row.published - 1


def lines(sources: list[str] | None = None) -> list[Line]:
    """Every priceable row as a Line (two pricings of the whole suite)."""
    low, high = PROBES
    devices = ("a100", "h100", "h200")
    at_low, _ = priced_rows(sources, rank=False, efficiency=dict.fromkeys(devices, low))
    at_high, _ = priced_rows(sources, rank=False, efficiency=dict.fromkeys(devices, high))
    out = []
    for lo, hi in zip(at_low, at_high):
        b = (lo.step - hi.step) / (1 / low - 1 / high)
        out.append(Line(lo, lo.step - b / low, b))
    return out


def _objective(rows: list[Line], efficiency: float) -> float:
    """The mean over sources of each source's median |error|: every source weighs alike, however
    many rows it printed (one sweep of a hundred rows must not outvote ten other runs)."""
    sources = sorted({r.source for r in rows})
    return statistics.mean(statistics.median(abs(r.error(efficiency)) for r in rows if r.source == s)
                           for s in sources)


def fit(rows: list[Line]) -> dict[str, float]:
    """Per device, the efficiency with the smallest _objective over its rows."""
    out = {}
    for device in sorted({r.device for r in rows}):
        mine = [r for r in rows if r.device == device]
        out[device] = min(GRID, key=lambda e: _objective(mine, e))
    return out


def leave_one_out(rows: list[Line]) -> list[dict]:
    """Per source: the efficiencies fitted without it, and its median and worst |error| at them."""
    out = []
    for source in sorted({r.source for r in rows}):
        others = [r for r in rows if r.source != source]
        fitted = fit(others)
        mine = [r for r in rows if r.source == source]
        errors = [abs(r.error(fitted.get(r.device, PROBES[0]))) for r in mine]
        devices = sorted({r.device for r in mine})
        out.append({"source": source, "fitted_without": {d: fitted[d] for d in devices
                                                          if d in fitted},
                    "rows": len(mine), "median": statistics.median(errors), "worst": max(errors)})
    return out


def report(sources: list[str] | None = None) -> dict:
    """The fit on every source, and each source left out in turn (`dt plan --published --fit`)."""
    priced = lines(sources or None)
    return {"all": fit(priced), "leave_one_out": leave_one_out(priced)}


def fit_table(fitted: dict) -> str:
    """report() as the terminal shows it."""
    out = ["each device's GEMM efficiency fitted on every source: "
           + ", ".join(f"{d} {e:.2f}" for d, e in fitted["all"].items()),
           f"{'left out':<28} {'fitted on the others':<24} {'rows':>5} {'median':>8} {'worst':>8}"]
    for r in fitted["leave_one_out"]:
        eff = ", ".join(f"{d} {e:.2f}" for d, e in r["fitted_without"].items())
        out.append(f"{r['source']:<28} {eff:<24} {r['rows']:>5} {100 * r['median']:7.1f}% "
                   f"{100 * r['worst']:7.1f}%")
    return "\n".join(out)
