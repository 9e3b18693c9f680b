"""PNG plots of the scaling study (matplotlib, Agg backend: no display needed).

Each function takes the Study's tables and writes one figure next to the JSON;
a table that was not run is simply not plotted. A new table needs no plot; to
give it one, add a function here and to write_all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

from dt import cost
from dt.bench.scaling.model import BREAKDOWN_LABELS, BREAKDOWN_PARTS

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ring": "tab:blue", "naive": "tab:orange", "gloo": "tab:gray",
          "recursive_doubling": "tab:cyan", "rabenseifner": "tab:pink",
          "compute": "tab:green", "hidden_comm": "tab:olive", "exposed_comm": "tab:red",
          "bubble": "tab:purple", "rest": "lightgray"}


def _med(x: Any) -> float:
    return x.median if hasattr(x, "median") else float(x)


def _machine_title(st: Any) -> str:
    m = st.machine
    return f"{m['cores']} cores, torch {m['torch']}, {m['backend']} (one machine)"


def _save(fig: Any, st: Any, path: Path) -> Path:
    """Title every figure with the machine it was measured on, write it, free it."""
    fig.suptitle(_machine_title(st), fontsize=9, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def allreduce(st: Any, out: Path) -> Path | None:
    """Time and bytes of the busiest rank vs world size, ring vs naive (table 1, 2)."""
    tables = [t for i, t in sorted(st.tables.items()) if i in (1, 2)]
    if not tables:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax_t, ax_b = axes
    for t in tables:
        rows = [r for r in t.data if r.get("wire", "torch") == "torch"]  # gloo's lines are that wire's
        worlds = [r["world"] for r in rows]
        size = rows[0]["nbytes"] / 1e6
        style = "-" if t.id == 1 else "--"
        for algo in ("ring", "naive", "gloo"):
            ax_t.plot(worlds, [_med(r[f"{algo}_time"]) * 1e3 for r in rows], style, marker="o",
                      color=COLORS[algo], label=f"{algo} {size:.2f} MB")
        if t.id == 1:
            ax_b.plot(worlds, [r["ring_bytes_sent_max"] / 1e6 for r in rows], "-o", color=COLORS["ring"],
                      label="ring (measured)")
            ax_b.plot(worlds, [r["ring_bytes_model"] / 1e6 for r in rows], "x", color="black", ms=9,
                      label="cost model")
            ax_b.plot(worlds, [r["naive_bytes_sent_max"] / 1e6 for r in rows], "-o",
                      color=COLORS["naive"], label="naive root (measured)")
            ax_b.plot(worlds, [r["naive_bytes_model"] / 1e6 for r in rows], "x", color="black", ms=9)
            ax_b.set_title(f"bytes sent by the busiest rank, {size:.2f} MB", wrap=True)
    ax_t.set_yscale("log")
    worlds = sorted({r["world"] for t in tables for r in t.data})
    for ax in axes:
        ax.set_xticks(worlds)
    ax_t.set_xlabel("world size")
    ax_t.set_ylabel("time (ms, median)")
    ax_t.set_title("all-reduce time", wrap=True)
    ax_t.legend(fontsize=8)
    ax_b.set_xlabel("world size")
    ax_b.set_ylabel("MB")
    if ax_b.lines:
        ax_b.legend(fontsize=8)
    return _save(fig, st, out / "allreduce_vs_world.png")


def busbw(st: Any, out: Path) -> Path | None:
    """Bus bandwidth vs message size: color per algorithm (gloo = torch's own), style per world."""
    t = st.tables.get(7)
    if t is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    worlds = sorted({r["world"] for r in t.data})
    styles, markers = ["-", "--", ":", "-."], "osd^v<>"
    points: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for r in t.data:
        points.setdefault((r["algorithm"], r["world"]), []).append((r["nbytes"], r["busbw"]))
    for (world, nbytes), agg in st.coll.items():  # torch.distributed.all_reduce, same processes
        if "gloo" in agg and world in worlds:
            bw = cost.bus_bandwidth("all_reduce", nbytes, agg["gloo"]["time"].median, world)[1]
            points.setdefault(("gloo", world), []).append((nbytes, bw))
    for (algo, world), pts in sorted(points.items()):
        k = worlds.index(world)
        pts.sort()
        ax.plot([n for n, _ in pts], [b / 1e9 for _, b in pts], styles[k % len(styles)],
                marker=markers[k % len(markers)], color=COLORS.get(algo, None),
                label=f"{algo}, world {world}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s) = size/time x 2(p-1)/p")
    ax.set_title("all-reduce bus bandwidth (gloo: torch.distributed's own)", wrap=True)
    ax.legend(fontsize=6, ncol=len(worlds))
    ax.grid(alpha=0.3)
    return _save(fig, st, out / "busbw_vs_size.png")


def efficiency(st: Any, out: Path) -> Path | None:
    """Efficiency and comm fraction vs global batch (table 4), and vs world (table 3)."""
    t4, t3 = st.tables.get(4), st.tables.get(3)
    if t4 is None and t3 is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    if t4 is not None and t4.data:
        ax = axes[0]
        b = [r["global_batch"] for r in t4.data]
        ax.plot(b, [100 * r["efficiency_off"] for r in t4.data], "-o", label="efficiency, overlap off")
        ax.plot(b, [100 * r["efficiency_on"] for r in t4.data], "-s", label="efficiency, overlap on")
        ax.plot(b, [100 * r["comm_fraction_off"] for r in t4.data], "--o", color=COLORS["exposed_comm"],
                label="comm fraction, overlap off")
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [f"{v:,}" for v in b])
        ax.set_ylim(0, None)
        ax.set_xlabel("global batch")
        ax.set_ylabel("%")
        ax.set_title(f"batch sweep at world {t4.data[0]['world']}", wrap=True)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if t3 is not None and t3.data:
        ax = axes[1]
        labels = {"dt_off": "dt, overlap off", "dt_on": "dt, overlap on", "torch": "torch DDP",
                  "compute": "no communication, ranks at once (not a bound)",
                  "bound": "bound: one rank's share of compute (no step is faster)"}
        for impl, style in (("dt_off", "-o"), ("dt_on", "-s"), ("torch", "--^"), ("compute", ":k"),
                            ("bound", "-k")):
            rows = [r for r in t3.data if r["impl"] == impl or (r["world"] == 1 and r["impl"] == "compute")]
            rows = sorted(rows, key=lambda r: r["world"])
            if len(rows) > 1:
                ax.plot([r["world"] for r in rows], [100 * r["efficiency"] for r in rows], style,
                        label=labels[impl])
        ax.set_xticks(sorted({r["world"] for r in t3.data}))
        ax.set_ylim(0, None)
        ax.set_xlabel("world size")
        ax.set_ylabel("efficiency (%)")
        ax.set_title(f"data-parallel efficiency, global batch {t3.data[0]['global_batch']}", wrap=True)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _save(fig, st, out / "efficiency.png")


def breakdown(st: Any, out: Path) -> Path | None:
    """Table 5 as stacked horizontal bars, each summing to 100%."""
    t = st.tables.get(5)
    if t is None or not t.data:
        return None
    rows = t.data
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 2.0))
    y = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for part in BREAKDOWN_PARTS:
        vals = [100 * r[part] for r in rows]
        ax.barh(y, vals, left=left, color=COLORS[part], label=BREAKDOWN_LABELS[part])
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y)
    ax.set_yticklabels([r["configuration"] for r in rows], fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of step time")
    ax.set_title("where the step time went", wrap=True)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.6 / (0.35 * len(rows) + 1.6)),
              ncol=len(BREAKDOWN_PARTS), frameon=False)
    return _save(fig, st, out / "breakdown.png")


def bubble(st: Any, out: Path) -> Path | None:
    """Table 6: measured bubble vs (p-1)/(m+p-1)."""
    t = st.tables.get(6)
    if t is None or not t.data:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for sched, marker in (("gpipe", "o"), ("1f1b", "s"), ("interleaved", "^")):
        rows = sorted((r for r in t.data if r["schedule"] == sched), key=lambda r: r["micro_batches"])
        if not rows:
            continue
        line, = ax.plot([r["micro_batches"] for r in rows], [100 * _med(r["measured"]) for r in rows],
                        marker=marker, label=f"{sched} measured")
        if sched != "1f1b":  # 1F1B's bubble is GPipe's
            v = rows[0].get("virtual", 1)
            ax.plot([r["micro_batches"] for r in rows],
                    [100 * r.get("schedule_exact", r["theory"]) for r in rows], "--",
                    color="black" if v == 1 else line.get_color(),
                    label="(p-1)/(m+p-1)" if v == 1 else f"interleaved v={v}, ideal")
    rows = sorted({r["micro_batches"]: r for r in t.data}.values(), key=lambda r: r["micro_batches"])
    ax.set_xscale("log", base=2)
    ax.set_xticks([r["micro_batches"] for r in rows], [str(r["micro_batches"]) for r in rows])
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble (% of step)")
    ax.set_title(f"pipeline bubble, {t.data[0]['stages']} stages", wrap=True)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, st, out / "bubble.png")


def write_all(st: Any, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [f(st, out) for f in (allreduce, busbw, efficiency, breakdown, bubble)]
    return [p for p in paths if p is not None]
