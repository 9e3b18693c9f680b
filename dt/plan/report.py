"""What `dt plan` prints and writes: the ranked table, JSON, the timeline plot, the scatter."""

from __future__ import annotations

import json
from typing import Any

from dt.plan.cluster import Cluster
from dt.plan.search import Row
from dt.plan.step_model import Prediction
from dt.units import fmt_bytes

__all__ = ["as_json", "explain_plot", "scatter_plot", "table"]

COMM = ("tp", "cp", "ep", "pp", "dp", "tied", "loss", "norm")
COLOURS = {"compute": "#4c72b0", "tp": "#dd8452", "cp": "#55a868", "ep": "#c44e52", "pp": "#8172b3",
           "dp": "#937860", "tied": "#da8bc3", "loss": "#8c8c8c", "norm": "#bcbd22", "skew": "#c7c7c7",
           "bubble": "#f2c14e"}  # the bubble in a colour of its own: idle time the schedule causes
MEMORY_PARTS = ("state", "scratch", "activations", "buffers", "runtime")


def _ms(x: float) -> str:
    return f"{x * 1e3:9.2f}"


def _fmt_step(x: float) -> str:
    return f"{x:9.3f}" if x >= 10 else _ms(x)


def table(rows: list[Row], top: int, device_memory: int = 0) -> str:
    """The first `top` rows: step and its parts, tokens/s, MFU, peak memory per rank (and its share of
    the device's), bytes per level. `=` marks a tie with the row above (within the ranking's noise)."""
    unit = "s" if rows and rows[0].prediction.step >= 10 else "ms"
    scale = 1.0 if unit == "s" else 1e3
    head = (f"{'#':>4} {'layout':<44} {'step ' + unit:>9} {'compute':>9} {'comm':>9} {'bubble':>9} "
            f"{'tokens/s':>10} {'MFU':>6} {'peak/rank':>10}{' of GPU' if device_memory else ''} "
            f"{'intra/step':>10} {'inter/step':>10}  exposed comm, skew ({unit})")
    out = [head]
    for i, r in enumerate(rows[:top], 1):
        p = r.prediction.parts
        comm = sum(p[k] for k in COMM)
        kinds = ", ".join(f"{k} {p[k] * scale:.2f}" for k in (*COMM, "skew") if p[k] > 0) or "-"
        mfu = f"{100 * r.mfu:5.1f}%" if r.mfu is not None else "     -"
        lv = r.prediction.bytes_per_level
        share = f" {100 * r.peak / device_memory:6.0f}%" if device_memory else ""
        mark = "=" if r.tie else " "
        out.append(f"{i:>3}{mark} {r.layout.name():<44} {r.prediction.step * scale:9.2f} "
                   f"{p['compute'] * scale:9.2f} {comm * scale:9.2f} {p['bubble'] * scale:9.2f} "
                   f"{r.tokens_per_s:10.0f} {mfu} {fmt_bytes(r.peak):>10}{share} "
                   f"{fmt_bytes(lv.get('intra', 0)):>10} {fmt_bytes(lv.get('inter', 0)):>10}  {kinds}")
    if any(r.tie for r in rows[:top]):
        out.append("= ties with the row above: the steps differ by less than the ranking's noise; "
                   "ties are ordered by memory")
    return "\n".join(out)


def explain_text(p: Prediction, memory: list[dict[str, int]], cluster: Cluster, headroom: float) -> str:
    """Every non-zero term of the predicted step and of each stage's peak memory."""
    parts = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in p.parts.items() if v > 0)
    lines = [f"{p.layout.name()}: predicted step {p.step * 1e3:.2f} ms = {parts}"]
    for s, row in enumerate(memory):
        terms = ", ".join(f"{k} {fmt_bytes(row[k])}" for k in MEMORY_PARTS if row.get(k))
        lines.append(f"  stage {s}: peak {fmt_bytes(row['peak'])} per rank = {terms}")
    peak = max(r["peak"] for r in memory)
    if cluster.device is not None:
        usable = cluster.memory * (1 - headroom)
        verdict = "fits" if peak <= usable else "does not fit"
        lines.append(f"  {verdict}: {fmt_bytes(peak)} of the device's {fmt_bytes(cluster.memory)} "
                     f"({100 * peak / cluster.memory:.0f}%; {headroom:.0%} kept free, --headroom)")
    return "\n".join(lines)


def row_json(r: Row, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"layout": r.layout.name(), "sizes": r.layout.as_dict(), "step_s": r.prediction.step, "tie": r.tie,
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
    """One bar per rank (one per pipeline stage: the others of a stage are alike), a box per span:
    forwards plain, backwards hatched, each micro-batch's box edged and numbered where it is wide
    enough; only the kinds the step has are in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(p.timelines)
    fig, ax = plt.subplots(figsize=(14, 1.8 + 0.6 * len(ranks)))
    for y, rank in enumerate(ranks):
        for sp in p.timelines[rank]:
            backward = sp.label.startswith("B ")
            ax.barh(y, (sp.end - sp.start) * 1e3, left=sp.start * 1e3, color=COLOURS[sp.kind], height=0.7,
                    edgecolor="white", linewidth=0.4, hatch="///" if backward else None)
            micro = sp.label.rsplit("micro-batch ", 1)
            if len(micro) == 2 and sp.kind == "compute" and (sp.end - sp.start) > p.step / 60:
                ax.text((sp.start + sp.end) / 2 * 1e3, y, micro[1], ha="center", va="center", fontsize=6,
                        color="white")
        ax.barh(y, p.step * 1e3, left=0, color=COLOURS["bubble"], height=0.7, zorder=0)
    kinds = [k for k in p.parts if p.parts[k] > 0]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="///"))
    ax.legend(handles, [f"{k} {p.parts[k] * 1e3:.2f} ms" for k in kinds] + ["backward (hatched)"],
              loc="upper left", fontsize=8, bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks(range(len(ranks)), [f"rank {r} (stage {s})" for s, r in enumerate(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("ms into the step (numbers: micro-batches; yellow: idle, the bubble)")
    ax.set_title(f"{title}\npredicted step {p.step * 1e3:.2f} ms", fontsize=9, loc="left", wrap=True)
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
