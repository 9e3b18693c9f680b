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

from dt.cost.devices import DEVICES
from dt.plan.suite import Compared, priced_rows

__all__ = ["PROBES", "Line", "fit", "fit_table", "leave_one_out", "lines", "report"]

PROBES = (0.45, 0.85)  # the two efficiencies each row is priced at
GRID = [percent / 100 for percent in range(30, 96)]  # the efficiencies the fit scans: 0.30 to 0.95


@dataclass(frozen=True)
class Line:
    """One row's prediction as a function of its device's efficiency e: step(e) = fixed + gemm / e."""

    at_low: Compared  # priced at the lower of PROBES
    fixed: float  # seconds that do not scale with the GEMMs
    gemm: float  # GEMM seconds x efficiency

    @property
    def source(self) -> str:
        return self.at_low.row.source

    @property
    def device(self) -> str:
        return self.at_low.row.cluster.device or ""

    def error(self, efficiency: float) -> float:
        """predicted / published - 1 at this efficiency, in the row's unit."""
        step = self.fixed + self.gemm / efficiency
        low = self.at_low
        predicted = step if low.row.metric == "s_per_iter" else low.predicted * low.step / step
        return predicted / low.row.published - 1


def lines(sources: list[str] | None = None) -> list[Line]:
    """Every priceable row as a Line (two pricings of the whole suite)."""
    low, high = PROBES
    at_low, _ = priced_rows(sources, rank=False, efficiency=dict.fromkeys(DEVICES, low))
    at_high, _ = priced_rows(sources, rank=False, efficiency=dict.fromkeys(DEVICES, high))
    out = []
    for slow, fast in zip(at_low, at_high):
        gemm = (slow.step - fast.step) / (1 / low - 1 / high)
        out.append(Line(slow, slow.step - gemm / low, gemm))
    return out


def _objective(rows: list[Line], efficiency: float) -> float:
    """The mean over sources of each source's median |error|: every source weighs alike, however
    many rows it printed (one sweep of a hundred rows must not outvote ten other runs)."""
    sources = sorted({line.source for line in rows})
    return statistics.mean(statistics.median(abs(line.error(efficiency)) for line in rows
                                             if line.source == source) for source in sources)


def fit(rows: list[Line]) -> dict[str, float]:
    """Per device, the efficiency with the smallest _objective over its rows."""
    out = {}
    for device in sorted({line.device for line in rows}):
        mine = [line for line in rows if line.device == device]
        out[device] = min(GRID, key=lambda efficiency: _objective(mine, efficiency))
    return out


def leave_one_out(rows: list[Line]) -> list[dict]:
    """Per source: the efficiencies fitted without it, and its median and worst |error| at them."""
    out = []
    low, _ = PROBES
    for source in sorted({line.source for line in rows}):
        fitted = fit([line for line in rows if line.source != source])
        mine = [line for line in rows if line.source == source]
        errors = [abs(line.error(fitted.get(line.device, low))) for line in mine]
        devices = sorted({line.device for line in mine})
        out.append({"source": source, "fitted_without": {device: fitted[device] for device in devices
                                                          if device in fitted},
                    "rows": len(mine), "median": statistics.median(errors), "worst": max(errors)})
    return out


def report(sources: list[str] | None = None) -> dict:
    """The fit on every source, and each source left out in turn (`dt plan --published --fit`)."""
    priced = lines(sources or None)
    return {"all": fit(priced), "leave_one_out": leave_one_out(priced)}


def fit_table(fitted: dict) -> str:
    """report() as the terminal shows it."""
    out = ["each device's GEMM efficiency fitted on every source: "
           + _efficiencies(fitted["all"]),
           f"{'left out':<28} {'fitted on the others':<24} {'rows':>5} {'median':>8} {'worst':>8}"]
    for left_out in fitted["leave_one_out"]:
        others = _efficiencies(left_out["fitted_without"])
        out.append(f"{left_out['source']:<28} {others:<24} {left_out['rows']:>5} "
                   f"{100 * left_out['median']:7.1f}% {100 * left_out['worst']:7.1f}%")
    return "\n".join(out)


def _efficiencies(by_device: dict[str, float]) -> str:
    return ", ".join(f"{device} {efficiency:.2f}" for device, efficiency in by_device.items())
