"""What `dt tune` prints and keeps: the report of one measurement, `--show`, `--reset`.

The figures live in one JSON file (dt.cost.machine.cache_path():
$XDG_CACHE_HOME/dt/tune.json, else ~/.cache/dt/tune.json), one entry per
wire and world (or topology across hosts). `dt tune --show` prints every
entry with where it came from (when, at what load); `dt tune --reset`
deletes the file, after which algorithm="auto" and `dt model` price with the
built-in defaults (dt.cost.DEFAULT_MACHINE, DEFAULT_SHM_MACHINE) again.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from dt.cost import machine

__all__ = ["report", "reset", "show"]


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def _rate(seconds_per_byte: float) -> str:
    return f"{1 / seconds_per_byte / 1e9:.2f}" if seconds_per_byte else "inf"


def _spread(fig: dict[str, Any], name: str) -> str:
    """The latency's spread over its repeats: the middle one over the fastest, and the slowest's."""
    spread, worst = fig.get("spread", {}).get(name), fig.get("range", {}).get(name)
    if spread is None:
        return ""
    return (f"  (fastest of the repeats; spread {spread:.2f}x: the middle repeat"
            + (f", the slowest {worst:.2f}x" if worst is not None else "") + ")")


def report(fig: dict[str, Any], out: TextIO | None = None) -> None:
    """One measured set of figures, as `dt tune` prints it before deciding whether to save it."""
    out = out or sys.stdout
    print(f"dt tune: {fig['wire']} wire (saved as {fig['backend']}), world {fig['world']}, "
          f"{fig['cores']} cores, torch {fig['torch']}, load average {fig['load']:.2f}", file=out)
    print(f"  ping-pong one-way latency {fig['pingpong_one_way'] * 1e6:9.1f} us", file=out)
    print(f"  alpha (one exchange step) {fig['alpha'] * 1e6:9.1f} us{_spread(fig, 'alpha')}", file=out)
    print(f"  beta                      {fig['beta'] * 1e9:9.3f} ns/byte  "
          f"({_rate(fig['beta'])} GB/s per rank)", file=out)
    print(f"  gamma                     {fig['gamma'] * 1e9:9.3f} ns/byte  "
          f"({_rate(fig['gamma'])} GB/s reduced)", file=out)
    if "sync" in fig:
        print(f"  sync (one shared-memory synchronisation) {fig['sync'] * 1e6:9.1f} us"
              f"{_spread(fig, 'sync')}", file=out)
        print(f"  mem  (memcpy, every rank at once)        {fig['mem'] * 1e9:9.3f} ns/byte  "
              f"({_rate(fig['mem'])} GB/s)", file=out)
    whole = fig.get("whole", {})
    if whole:
        print(f"  whole 4-byte all-reduce: {whole['algorithm']} ({whole['steps']} step(s)) "
              f"{whole['step'] * 1e6:.1f} us" + (f", one_shot {whole['one_shot'] * 1e6:.1f} us"
                                                 if "one_shot" in whole else ""), file=out)
    for level, lv in fig.get("levels", {}).items():
        print(f"  {level:<5} pair {lv['pair'][0]}-{lv['pair'][1]} ({lv['wire']} wire): alpha "
              f"{lv['alpha'] * 1e6:.1f} us, beta {lv['beta'] * 1e9:.3f} ns/byte "
              f"({_rate(lv['beta'])} GB/s)", file=out)
    if "nics" in fig:
        print(f"  NICs a host's ranks share: {fig['nics'] or 'one per rank'} (every rail at once)", file=out)
    for name, label in (("terms", "terms"), ("terms_inter", "terms between hosts")):
        terms = fig.get(name)
        if terms:
            print(f"  {label}: post {terms['post'] * 1e6:.1f} us per message, wake "
                  f"{terms['wake'] * 1e6:.1f} us (spin {terms['spin'] * 1e6:.0f} us), solo copy "
                  f"{terms['solo']:.2f} / add {terms['solo_reduce']:.2f} of all at once, oversubscription "
                  f"{terms['oversub'] * 1e6:.1f} us per step", file=out)
    print("  exchange step times: " + ", ".join(
        f"{int(k):,} B {v * 1e3:.3f} ms" for k, v in fig["exchange"].items()), file=out)
    for collective, rows in fig.get("winners", {}).items():
        print(f"  measured fastest {collective}: " + ", ".join(
            f"{_size(n)} {best}" for n, best, _ in rows), file=out)


def _figure(entry: dict[str, Any], name: str, scale: float, unit: str, digits: int) -> str:
    value = entry.get(name)
    return f" {name} {value * scale:.{digits}f} {unit}" if isinstance(value, (int, float)) else ""


def show(out: TextIO | None = None) -> int:
    """`dt tune --show`: every saved entry, one line each, and how to reset them."""
    out = out or sys.stdout
    path, saved = machine.cache_path(), machine.entries()
    if not saved:
        print(f"dt tune: no figures saved ({path} {'holds none' if path.exists() else 'does not exist'});"
              f" auto and dt model use the built-in defaults", file=out)
        return 0
    print(f"dt tune: {len(saved)} saved figure set(s) in {path}:", file=out)
    for key in sorted(saved):
        e = saved[key] if isinstance(saved[key], dict) else {}
        load = f", load {e['load']:.2f}" if isinstance(e.get("load"), (int, float)) else ""
        spreads = e.get("spread", {})
        worst = (f", worst spread {max(spreads.values()):.2f}x ({max(spreads, key=spreads.get)})"
                 if spreads else "")
        print(f"  {key}: measured {e.get('measured_at', '?')}{load}{worst};"
              + _figure(e, "alpha", 1e6, "us", 1) + _figure(e, "beta", 1e9, "ns/B", 3)
              + _figure(e, "gamma", 1e9, "ns/B", 3) + _figure(e, "sync", 1e6, "us", 1)
              + _figure(e, "mem", 1e9, "ns/B", 3)
              + (f"; winners for {len(e['winners'])} collectives" if e.get("winners") else ""), file=out)
    print("  (dt tune --reset deletes them; auto and dt model then use the built-in defaults)", file=out)
    return 0


def reset(out: TextIO | None = None) -> int:
    """`dt tune --reset`: delete the saved figures."""
    out = out or sys.stdout
    path = machine.cache_path()
    if not path.exists():
        print(f"dt tune: nothing to reset ({path} does not exist)", file=out)
        return 0
    try:
        count = machine.reset()
    except OSError as e:  # a file we may not delete: say so, in one line
        print(f"dt tune --reset: cannot remove {path}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"dt tune: removed {path} ({count} figure set(s)); auto and dt model use the built-in "
          f"defaults until the next dt tune", file=out)
    return 0
