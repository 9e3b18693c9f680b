"""What `dt plan` prints and writes: the ranked table, JSON, the timeline plot, the scatter."""

from __future__ import annotations

import json
from typing import Any

from dt.plan.search import Row
from dt.plan.step_model import KINDS, Prediction
from dt.units import fmt_bytes

__all__ = ["as_json", "explain_plot", "scatter_plot", "table"]

COMM = ("tp", "cp", "ep", "pp", "dp", "tied", "loss", "norm")
COLOURS = {"compute": "#4c72b0", "tp": "#dd8452", "cp": "#55a868", "ep": "#c44e52", "pp": "#8172b3",
           "dp": "#937860", "tied": "#da8bc3", "loss": "#8c8c8c", "norm": "#bcbd22", "skew": "#c7c7c7",
           "bubble": "#eeeeee"}


def _ms(x: float) -> str:
    return f"{x * 1e3:9.2f}"


def table(rows: list[Row], top: int) -> str:
    """The first `top` rows: step and its parts (ms), tokens/s, MFU, peak memory per rank, bytes per level."""
    head = (f"{'#':>3} {'layout':<42} {'step ms':>9} {'compute':>9} {'comm':>9} {'bubble':>9} "
            f"{'tokens/s':>10} {'MFU':>6} {'peak/rank':>10} {'intra/step':>10} {'inter/step':>10}"
            "  exposed comm, skew")
    out = [head]
    for i, r in enumerate(rows[:top], 1):
        p = r.prediction.parts
        comm = sum(p[k] for k in COMM)
        kinds = ", ".join(f"{k} {p[k] * 1e3:.2f}" for k in (*COMM, "skew") if p[k] > 0) or "-"
        mfu = f"{100 * r.mfu:5.1f}%" if r.mfu is not None else "     -"
        lv = r.prediction.bytes_per_level
        out.append(f"{i:>3} {r.layout.name():<42} {_ms(r.prediction.step)} {_ms(p['compute'])} {_ms(comm)} "
                   f"{_ms(p['bubble'])} {r.tokens_per_s:10.0f} {mfu} {fmt_bytes(r.peak):>10} "
                   f"{fmt_bytes(lv.get('intra', 0)):>10} {fmt_bytes(lv.get('inter', 0)):>10}  {kinds}")
    return "\n".join(out)


def row_json(r: Row, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"layout": r.layout.name(), "sizes": r.layout.as_dict(), "step_s": r.prediction.step,
           "parts_s": r.prediction.parts, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
           "peak_bytes_per_rank": r.peak, "memory_by_stage": r.memory,
           "bytes_per_level": r.prediction.bytes_per_level}
    if measured is not None:
        out["measured"] = measured
    return out


def as_json(meta: dict[str, Any], rows: list[Row], measured: dict[str, dict[str, Any]] | None = None) -> str:
    measured = measured or {}
    return json.dumps({**meta, "layouts": [row_json(r, measured.get(r.layout.name())) for r in rows]},
                      indent=1)


def explain_plot(p: Prediction, path: str, title: str) -> None:
    """One bar per rank (one per pipeline stage: the others of a stage are alike), a box per span."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(p.timelines)
    fig, ax = plt.subplots(figsize=(14, 1.8 + 0.6 * len(ranks)))
    for y, rank in enumerate(ranks):
        for sp in p.timelines[rank]:
            ax.barh(y, (sp.end - sp.start) * 1e3, left=sp.start * 1e3, color=COLOURS[sp.kind], height=0.7,
                    edgecolor="none")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in KINDS]
    ax.legend(handles, [f"{k} {p.parts[k] * 1e3:.2f} ms" for k in KINDS], loc="upper left",
              fontsize=8, bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks(range(len(ranks)), [f"rank {r} (stage {s})" for s, r in enumerate(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("ms into the step (white: idle)")
    ax.set_title(f"{title}: predicted step {p.step * 1e3:.2f} ms", fontsize=9, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scatter_plot(rows: list[Row], path: str, title: str) -> None:
    """Predicted step time against peak memory per rank, every fitting layout; the first ranked marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter([r.peak / 2**30 for r in rows], [r.prediction.step * 1e3 for r in rows], s=8, alpha=0.5)
    if rows:
        best = rows[0]
        ax.scatter([best.peak / 2**30], [best.prediction.step * 1e3], s=60, color="red",
                   label=f"first: {best.layout.name()}")
        ax.legend(fontsize=8)
    ax.set_xlabel("predicted peak memory per rank (GiB)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_yscale("log")
    ax.set_title(title, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
