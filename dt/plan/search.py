"""Every layout priced and ranked: enumerate (dt.plan.layouts), drop what does not fit, predict the rest.

Memory first: a layout's peak (dt.plan.memory) needs only the schedule's
order, not its durations, so layouts that cannot fit are dropped before
their step is priced. A catalogue GPU holds its own HBM; on this machine
(CPU) every rank's bytes come out of one machine's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.cost.flops import train_flops_per_token
from dt.plan.cluster import Cluster
from dt.plan.layouts import Layout, enumerate_layouts
from dt.plan.memory import peak_bytes
from dt.plan.model import ModelShape
from dt.plan.step_model import Prediction, predict
from dt.units import fmt_bytes

__all__ = ["Row", "model_flops", "rank_layouts"]


@dataclass
class Row:
    layout: Layout
    prediction: Prediction
    memory: list[dict[str, int]]  # per stage
    tokens_per_s: float
    mfu: float | None  # None where the cluster's peak is unknown (this machine)

    @property
    def peak(self) -> int:
        return max(r["peak"] for r in self.memory)


def model_flops(model: ModelShape, batch: int, seq: int) -> float:
    """FLOPs one step needs, unsharded, without recompute: 3 x the forward (backward is 2x)."""
    return train_flops_per_token(model.decoder(seq)) * batch * seq


def _fits(c: Cluster, lay: Layout, memory: list[dict[str, int]]) -> str | None:
    peak = max(r["peak"] for r in memory)
    if c.shared_memory:
        total = sum(r["peak"] for r in memory) * lay.world // lay.pp
        return None if not c.memory or total <= c.memory else (
            f"the ranks' peaks add up to more than this machine's {fmt_bytes(c.memory)}: {fmt_bytes(total)}")
    return None if peak <= c.memory else (
        f"peak per rank over the device's {fmt_bytes(c.memory)}: {fmt_bytes(peak)}")


def rank_layouts(c: Cluster, model: ModelShape, batch: int, seq: int,
                 recompute: tuple[bool, ...] = (False,),
                 clip: bool = False) -> tuple[list[Row], int, dict[str, int]]:
    """(the fitting layouts' rows, fastest first; how many were enumerated; why the others were dropped)."""
    layouts = enumerate_layouts(model, c.world, batch, seq, c.hosts, recompute, clip)
    flops = model_flops(model, batch, seq)
    rows: list[Row] = []
    dropped: dict[str, int] = {}
    for lay in layouts:
        mem = peak_bytes(c, model, lay, batch, seq)
        why = _fits(c, lay, mem)
        if why is not None:
            dropped[why.split(":")[0]] = dropped.get(why.split(":")[0], 0) + 1
            continue
        p = predict(c, model, lay, batch, seq)
        mfu = flops / (p.step * c.world * c.peak) if c.peak else None
        rows.append(Row(lay, p, mem, batch * seq / p.step, mfu))
    rows.sort(key=lambda r: (r.prediction.step, r.peak))
    return rows, len(layouts), dropped
