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
MEMORY_PARTS = ("state", "scratch", "activations", "buffers", "optimizer", "fragmentation", "runtime")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f}"


def _fmt_step(seconds: float) -> str:
    return f"{seconds:9.3f}" if seconds >= 10 else _ms(seconds)


def table(rows: list[Row], top: int, device_memory: int = 0, noise: float = 0.0) -> str:
    """The first `top` rows: step and its parts, tokens/s, MFU, peak memory per rank (and its share of
    the device's), bytes per level. `=` marks a tie with the row above (within the ranking's `noise`)."""
    unit = "s" if rows and rows[0].prediction.step >= 10 else "ms"
    scale = 1.0 if unit == "s" else 1e3
    head = (f"{'#':>4} {'layout':<44} {'step ' + unit:>9} {'compute':>9} {'comm':>9} {'bubble':>9} "
            f"{'tokens/s':>10} {'MFU':>6} {'peak/rank':>10}{' of GPU' if device_memory else ''} "
            f"{'intra/step':>10} {'inter/step':>10}  exposed comm, skew ({unit})")
    out = [head]
    for i, row in enumerate(rows[:top], 1):
        parts = row.prediction.parts
        comm = sum(parts[kind] for kind in COMM)
        exposed = [f"{kind} {parts[kind] * scale:.2f}" for kind in (*COMM, "skew") if parts[kind] > 0]
        kinds = ", ".join(exposed) or "-"
        mfu = f"{100 * row.mfu:5.1f}%" if row.mfu is not None else "     -"
        intra, inter = (row.prediction.bytes_per_level.get(level, 0) for level in ("intra", "inter"))
        share = f" {100 * row.peak / device_memory:6.0f}%" if device_memory else ""
        mark = "=" if row.tie else " "
        out.append(f"{i:>3}{mark} {row.layout.name():<44} {row.prediction.step * scale:9.2f} "
                   f"{parts['compute'] * scale:9.2f} {comm * scale:9.2f} {parts['bubble'] * scale:9.2f} "
                   f"{row.tokens_per_s:10.0f} {mfu} {fmt_bytes(row.peak):>10}{share} "
                   f"{fmt_bytes(intra):>10} {fmt_bytes(inter):>10}  {kinds}")
    if any(row.tie for row in rows[:top]):
        out.append(f"= ties with the row above: the steps differ by less than the ranking's noise "
                   f"({100 * noise:.1f}%); ties are ordered by memory")
    return "\n".join(out)


def explain_text(prediction: Prediction, memory: list[dict[str, int]], cluster: Cluster,
                 headroom: float) -> str:
    """Every non-zero term of the predicted step and of each stage's peak memory."""
    parts = ", ".join(f"{kind} {seconds * 1e3:.2f} ms" for kind, seconds in prediction.parts.items()
                      if seconds > 0)
    lines = [f"{prediction.layout.name()}: predicted step {prediction.step * 1e3:.2f} ms = {parts}"]
    for stage, row in enumerate(memory):
        terms = ", ".join(f"{part} {fmt_bytes(row[part])}" for part in MEMORY_PARTS if row.get(part))
        lines.append(f"  stage {stage}: peak {fmt_bytes(row['peak'])} per rank = {terms}")
    peak = max(row["peak"] for row in memory)
    if cluster.device is not None:
        usable = cluster.memory * (1 - headroom)
        verdict = "fits" if peak <= usable else "does not fit"
        lines.append(f"  {verdict}: {fmt_bytes(peak)} of the device's {fmt_bytes(cluster.memory)} "
                     f"({100 * peak / cluster.memory:.0f}%; {headroom:.0%} kept free, --headroom)")
    return "\n".join(lines)


def row_json(row: Row, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {"layout": row.layout.name(), "sizes": row.layout.as_dict(), "step_s": row.prediction.step,
           "tie": row.tie, "parts_s": row.prediction.parts, "tokens_per_s": row.tokens_per_s, "mfu": row.mfu,
           "peak_bytes_per_rank": row.peak, "memory_by_stage": row.memory,
           "bytes_per_level": row.prediction.bytes_per_level}
    if measured is not None:
        out["measured"] = measured
    return out


def as_json(meta: dict[str, Any], rows: list[Row], measured: dict[str, dict[str, Any]] | None = None) -> str:
    measured = measured or {}
    return json.dumps({**meta, "layouts": [row_json(row, measured.get(row.layout.name())) for row in rows]},
                      indent=1)


def explain_plot(prediction: Prediction, path: str, title: str) -> None:
    """One bar per rank (one per pipeline stage: the others of a stage are alike), a box per span:
    forwards plain, backwards hatched, each micro-batch's box edged and numbered where it is wide
    enough; only the kinds the step has are in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(prediction.timelines)
    fig, ax = plt.subplots(figsize=(14, 1.8 + 0.6 * len(ranks)))
    for y, rank in enumerate(ranks):
        for span in prediction.timelines[rank]:
            backward = span.label.startswith("B ")
            ax.barh(y, (span.end - span.start) * 1e3, left=span.start * 1e3, color=COLOURS[span.kind],
                    height=0.7, edgecolor="white", linewidth=0.4, hatch="///" if backward else None)
            _, found, micro_batch = span.label.rpartition("micro-batch ")
            wide = (span.end - span.start) > prediction.step / 60  # room for the number
            if found and span.kind == "compute" and wide:
                ax.text((span.start + span.end) / 2 * 1e3, y, micro_batch, ha="center", va="center",
                        fontsize=6, color="white")
        ax.barh(y, prediction.step * 1e3, left=0, color=COLOURS["bubble"], height=0.7, zorder=0)
    kinds = [kind for kind in prediction.parts if prediction.parts[kind] > 0]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[kind]) for kind in kinds]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="///"))
    labels = [f"{kind} {prediction.parts[kind] * 1e3:.2f} ms" for kind in kinds] + ["backward (hatched)"]
    ax.legend(handles, labels, loc="upper left", fontsize=8, bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks(range(len(ranks)), [f"rank {r} (stage {s})" for s, r in enumerate(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("ms into the step (numbers: micro-batches; yellow: idle, the bubble)")
    ax.set_title(f"{title}\npredicted step {prediction.step * 1e3:.2f} ms", fontsize=9, loc="left", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scatter_plot(rows: list[Row], path: str, title: str) -> None:
    """Predicted step time against peak memory per rank, every fitting layout; the first ranked marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter([row.peak / 2**30 for row in rows], [row.prediction.step * 1e3 for row in rows], s=8,
               alpha=0.5)
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
