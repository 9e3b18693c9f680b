"""What `dt bench collectives` prints: nccl-tests' header, its rows, its closing average, a summary, a plot.

Rows are printed one size at a time as they are measured (by rank 0, from
dt/bench/collectives_sweep.py); the launcher prints the header before and the
"# Out of bounds values", "# Avg bus bandwidth" lines and the summary after.
Each mode's #wrong sits in its own column: out-of-place under out-of-place,
in-place under in-place (N/A when not checked, -c 0).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, TextIO

from dt.cost import loadstore
from dt.units import fmt_time

__all__ = ["avg_bus_bandwidth", "busbw_figure", "fastest_dt", "format_row", "headline", "out_of_bounds",
           "per_call_ratio", "print_avg", "print_header", "print_size_rows", "plot", "row_wire", "summary"]

NOT_DT = ("torch", "deepspeed")  # the reference rows: every other row is one of dt's
WIRES = {"shm": "shared memory", "torch": "torch's wire"}  # --transport's names, as the summary says them


def print_header(data: dict[str, Any], out: TextIO) -> None:
    """The lines above the rows: what ran, how it was timed, auto's figures, the column names."""
    m, cfg = data["machine"], data["config"]
    print(f"# dt bench collectives: {data['collective']}, world {m['world']}, backend {m['backend']}, "
          f"{m['cores']} cores, torch {m['torch']}, {m['when']}", file=out)
    print("# dt's cross-rank validation OFF during timing (dt.transport.set_validation(False)); "
          f"median of {cfg['iters']} calls after {cfg['warmup']} warm-up, "
          "slowest rank per call; spread = IQR/median", file=out)
    f = m["figures"]
    print(f"# auto's figures ({f['source']}): alpha {f['alpha'] * 1e6:.0f} us, "
          f"beta {f['beta'] * 1e9:.3f} ns/B, gamma {f['gamma'] * 1e9:.3f} ns/B", file=out)
    g = m["shm_figures"]
    print(f"# wires {'+'.join(m['transports'])}{' (buffers from dt.shm_empty)' if m['shared'] else ''}; "
          f"shm figures ({g['source']}): sync {g['sync'] * 1e6:.0f} us, memcpy "
          f"{g['mem'] * 1e9:.3f} ns/B; load average {m['load'][0]:.1f}", file=out)
    print(f"#{'':71}{'out-of-place':^39}  {'in-place':^39}", file=out)
    print(f"# {'size':>10} {'count':>11} {'type':>7} {'redop':>5} {'root':>4}  {'algorithm':<30}"
          f"{'time':>9} {'spread':>6} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  "
          f"{'time':>9} {'spread':>6} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  {'vs torch':>8} "
          f"{'memcpy':>7}", file=out)
    print(f"# {'(B)':>10} {'(elements)':>11} {'':>7} {'':>5} {'':>4}  {'':<30}"
          f"{'(us)':>9} {'':>6} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  "
          f"{'(us)':>9} {'':>6} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  {'':>8} {'(GB/s)':>7}",
          file=out, flush=True)


def format_row(row: dict[str, Any]) -> str:
    """One row: out-of-place columns, then in-place ones ('N/A' where the API has no such call)."""
    name = row["algorithm"] + (f" ({row['picked']})" if "picked" in row else "")
    cols = []
    for mode in ("out", "in"):
        if mode in row:
            s = row[mode]
            wrong = "N/A" if s["wrong"] is None else s["wrong"]
            cols.append(f"{s['median'] * 1e6:9.1f} {s['spread'] * 100:5.0f}% {s['algbw']:7.3f} "
                        f"{s['busbw']:7.3f} {wrong:>6}")
        else:
            cols.append(f"{'N/A':>9} {'':>6} {'':>7} {'':>7} {'':>6}")
    bound = f"{row['memcpy_gbps']:7.2f}" if "memcpy_gbps" in row else ""
    return (f"  {row['size']:>10} {row['count']:>11} {row['type']:>7} {row['redop']:>5} "
            f"{row['root']:>4}  {name:<30}{cols[0]}  {cols[1]}  {row['vs_torch']:8.2f} {bound}").rstrip()


def print_size_rows(rows: Sequence[dict[str, Any]], out: TextIO, first: bool) -> None:
    """One size's rows, a blank line before every size but the first; flushed, so they show now."""
    if not first:
        print("", file=out)
    for row in rows:
        print(format_row(row), file=out)
    out.flush()


def avg_bus_bandwidth(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per row name, nccl-tests' average: the mean busbw over every size and mode measured (GB/s)."""
    figures: dict[str, list[float]] = {}
    for row in rows:
        for mode in ("out", "in"):
            if mode in row:
                figures.setdefault(row["algorithm"], []).append(row[mode]["busbw"])
    return {name: statistics.fmean(xs) for name, xs in figures.items()}


def out_of_bounds(rows: Sequence[dict[str, Any]]) -> int:
    """nccl-tests' count of results with a wrong element: one per (row, size, op, mode) checked."""
    return sum(1 for row in rows for mode in ("out", "in") if (row.get(mode) or {}).get("wrong"))


def print_avg(data: dict[str, Any], out: TextIO) -> None:
    """The wires the groups connected, then nccl-tests' closing lines: the results out of bounds
    (as it prints them: OK or FAILED), the average bus bandwidth once per row name."""
    connected = data["machine"].get("connected_wires", {})
    if connected:
        print("# wires connected: " + "; ".join(
            f"--transport {name} group over {' + '.join(wires) or 'no peer'}"
            for name, wires in connected.items()), file=out)
    bad = out_of_bounds(data["results"])
    unchecked = "" if data["config"].get("check", True) else " (not checked: -c 0)"
    print(f"# Out of bounds values : {bad} {'FAILED' if bad else 'OK'}{unchecked}", file=out)
    if data["collective"] == "barrier":
        print("# Avg bus bandwidth    : N/A (a barrier moves no data)", file=out)
        return
    for name, avg in avg_bus_bandwidth(data["results"]).items():
        print(f"# Avg bus bandwidth    : {avg:.4g} GB/s  {name}", file=out)  # nccl-tests: %g


def row_wire(name: str, transports: Sequence[str]) -> str:
    """The wire a dt row ran on: its "@wire" suffix with --transport both, else the one transport."""
    return name.rpartition("@")[2] if len(transports) > 1 else transports[0]


def fastest_dt(here: dict[str, dict[str, Any]], mode: str, transports: Sequence[str] | None = None,
               wire: str | None = None) -> str | None:
    """The fastest of dt's rows at one size (auto among them: it is one of dt's ways to call);
    with `wire`, of the rows that ran on that wire only."""
    times = {a: r[mode]["median"] for a, r in here.items() if a not in NOT_DT and mode in r
             and (wire is None or row_wire(a, transports or ()) == wire)}
    return min(times, key=times.__getitem__) if times else None


def _torch_wire(data: dict[str, Any]) -> str:
    """What torch's own collective runs on: its backend's wire (gloo: sockets; NCCL)."""
    backend = data["machine"]["backend"]
    return f"{backend}'s sockets" if backend == "gloo" else backend


def summary(data: dict[str, Any], out: TextIO) -> None:
    """Per size: dt's fastest row against torch's collective, on the same wire where dt ran on
    torch's (--transport torch or both), the fastest of all labelled as another wire's where it
    is not; then auto's pick and its time over the fastest's."""
    rows, transports = data["results"], data["machine"]["transports"]
    print("\n# summary: fastest dt row (median time), then medians of per-call ratios; x torch is against "
          f"torch's collective on {_torch_wire(data)}: the same wire for dt's rows on torch's wire, "
          "another for those on shared memory" + ("" if "torch" in transports else
                                                  " (--transport both adds dt's rows on torch's wire)"),
          file=out)
    ops = dict.fromkeys(r["redop"] for r in rows)
    for redop, size in dict.fromkeys((r["redop"], r["size"]) for r in rows):
        here = {r["algorithm"]: r for r in rows if r["size"] == size and r["redop"] == redop}
        mode = "in" if "in" in here["torch"] else "out"
        fastest = fastest_dt(here, mode)
        if fastest is None:
            continue

        def ratio(a: str, b: str, here: dict = here, mode: str = mode) -> float:
            return per_call_ratio(here, a, b, mode)

        def named(a: str, here: dict = here) -> str:
            return a + (f" ({here[a]['picked']})" if "picked" in here[a] else "")

        same = fastest_dt(here, mode, transports, "torch")  # dt's rows on torch's own wire, if any
        across = f" (across wires: dt on {WIRES.get(row_wire(fastest, transports), 'its wire')}, torch on " \
                 f"{_torch_wire(data)})"
        which = f"{redop:>4} " if len(ops) > 1 else ""  # -o all: the sizes again for each op
        head = f"#   {which}{size:>10} B  fastest"
        if same is not None:
            line = f"{head} on the same wire {named(same):<22} {ratio(same, 'torch'):5.2f}x torch"
            if fastest != same:
                line += f"   fastest {named(fastest)} {ratio(fastest, 'torch'):5.2f}x torch{across}"
        else:
            line = f"{head} {named(fastest):<22} {ratio(fastest, 'torch'):5.2f}x torch{across}"
        for a in (a for a in here if a.startswith("auto") and a != fastest):
            line += (f"   {a} -> {here[a].get('picked', '?'):<16} "
                     f"{ratio(a, fastest):5.2f}x fastest, {ratio(a, 'torch'):5.2f}x torch")
        if "deepspeed" in here:
            line += f"   deepspeed {ratio('deepspeed', 'torch'):5.2f}x torch, {fastest} " \
                    f"{ratio(fastest, 'deepspeed'):5.2f}x deepspeed"
        if data["collective"] == "all_reduce" and size >= 1 << 20 and here[fastest].get("memcpy_gbps"):
            line += _memcpy_share(data, here[fastest], mode)
        print(line, file=out)


def per_call_ratio(here: dict[str, dict[str, Any]], a: str, b: str, mode: str) -> float:
    """Median over calls of (a's call / b's call of the same round), as in the vs torch column."""
    return statistics.median(x / y for x, y in zip(here[a][mode]["samples"], here[b][mode]["samples"]))


def headline(data: dict[str, Any]) -> str:
    """The run in one line (its record's headline): at the largest size, dt's fastest row against
    torch's collective, each with the wire it ran on."""
    rows, m = data["results"], data["machine"]
    size = rows[-1]["size"]
    here = {r["algorithm"]: r for r in rows if r["size"] == size}
    mode = "in" if "in" in here["torch"] else "out"
    fastest = fastest_dt(here, mode)
    what = f"{data['collective']} {size:,} B world {m['world']}"
    if fastest is None:
        return f"{what}: no dt row measured"
    best = here[fastest][mode]
    busbw = f", busbw {best['busbw']:.3g} GB/s" if size else ""
    wire = WIRES.get(row_wire(fastest, m["transports"]), "its wire")
    return (f"{what}: fastest {fastest} on {wire} {fmt_time(best['median'])}{busbw}, "
            f"{per_call_ratio(here, fastest, 'torch', mode):.2f}x the time of torch's on {_torch_wire(data)}")


def _memcpy_share(data: dict[str, Any], row: dict[str, Any], mode: str) -> str:
    """busbw over the memcpy measured in the same run, beside the most any shared-memory
    all-reduce can reach at memcpy's bytes per second (dt.cost.loadstore's floor)."""
    m = data["machine"]
    p, shared = m["world"], bool(m.get("shared"))
    best = loadstore.best_busbw_of_memcpy(p, loadstore.all_reduce_memory_floor(p, zero_copy=shared))
    return (f"   busbw {row[mode]['busbw'] / row['memcpy_gbps']:.2f}x memcpy "
            f"(the {'zero-copy' if shared else 'plain-tensor'} floor allows {best:.2f}x)")


def plot(data: dict[str, Any], path: str) -> None:
    """The busbw figure, written to `path` (PNG)."""
    import matplotlib.pyplot as plt

    fig = busbw_figure(data)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def busbw_figure(data: dict[str, Any]) -> Any:
    """busbw against size per row, log-log: a 1 KB curve and a 64 MB one are both readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for a in dict.fromkeys(r["algorithm"] for r in data["results"]):
        rows = [r for r in data["results"] if r["algorithm"] == a]
        mode = "in" if "in" in rows[0] else "out"
        ax.plot([r["size"] for r in rows], [r[mode]["busbw"] for r in rows], marker="o",
                label=a, linestyle="--" if a == "torch" else "-")
    first = [r for r in data["results"] if r["algorithm"] == data["results"][0]["algorithm"]]
    if first and "memcpy_gbps" in first[0]:
        ax.plot([r["size"] for r in first], [r["memcpy_gbps"] for r in first], color="black",
                linestyle=":", label="memcpy (bound)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    m = data["machine"]
    ax.set_title(f"{data['collective']}, world {m['world']}, {'+'.join(m['transports'])}, "
                 f"{m['cores']} cores", wrap=True)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
