"""The figures `auto` prices a group spanning hosts with: rank 0's, sent to every rank once per group.

Each host has its own tune file (or none), so figures read locally can
differ between ranks, and then so would auto's choice: one rank runs the
ring while its peer runs Rabenseifner, and with validation off that ends in
a gloo abort on one host and a timeout on the other. So a group whose ranks
span hosts agrees once, at its first collective (dt.collectives.api.dispatch,
on every rank at the same point): rank 0 reads its figures and sends them,
as JSON bytes over the group's torch wire, to every other rank (uncounted:
setup, like the topology's exchange); every rank caches them on the group
and decides from them alone, validation on or off.

What rank 0 sends: the inter-host figures `dt tune` saved for this
topology ("gloo:2x2", dt.cost.machine.key), else the defaults, with a note
saying so (a one-host, loopback figure is never used across hosts); the
intra-host figures for a host of G ranks (the shared-memory wire's where the
group has it); where `dt tune` timed each level on its own pair across these
hosts, those pairs' alpha and beta instead (dt/tools/tune_levels.py); the
NICs a host's ranks share; the measured winners of that topology. Cost: one
message of a few hundred bytes, plus its length, from rank 0 to each other
rank, once per group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from dt.cost.levels import Levels
from dt.cost.machine import DEFAULT_MACHINE, Machine, figures, machine
from dt.transport import RECV, SEND, Group, default_device, topology_of
from dt.transport.discover import post_and_wait

__all__ = ["Agreed", "agree", "figures_on", "levels_of", "local_figures"]


@dataclass(frozen=True)
class Agreed:
    """Figures every rank of a group spanning hosts prices with (rank 0's)."""

    levels: Levels
    source: str
    note: str = ""
    winners: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _machine(row: list[float], source: str) -> Machine:
    a, b, g, sync, mem = row
    return Machine(a, b, g, source=source, sync=sync, mem=mem)


def local_figures(g: Group) -> dict[str, Any]:
    """This rank's figures for the group, as rank 0 sends them (a JSON-able dict)."""
    topo = topology_of(g)
    shm = g.links.wires is not None and any(w.name == "shm" for w in g.links.wires)
    return figures_on(g.backend, g.size, topo.shape(), max(topo.per_host), shm, g.ranks[0])


def figures_on(backend: str, size: int, shape: str, per_host: int, shm: bool,
               first: int = 0) -> dict[str, Any]:
    """The figures a group of `size` ranks on `shape` (hosts x ranks, "2x2") prices with, from this
    process's tune file: what rank `first` sends (local_figures), what `dt plan` prices a simulated
    cluster with (dt.plan.cluster), one rule for both.

    Where `dt tune` timed each level on its own pair on this topology ("levels":
    dt/tools/tune_levels.py, under the wire the group talks on inside a host: shared
    memory where `shm`), those alpha and beta price the levels; else the whole group's
    exchange prices the link between hosts and a one-host figure the link inside one.
    """
    inter = figures(backend, size, shape)
    note = "" if inter is not None else (
        f"no `dt tune` figures for {backend} on {shape} hosts x ranks: defaults price the link "
        "between hosts (a one-host figure is not used across hosts)")
    intra = machine("shm" if shm else backend, per_host)
    row = ([inter["alpha"], inter["beta"], inter["gamma"], 0.0, 0.0] if inter is not None else
           [DEFAULT_MACHINE.alpha, DEFAULT_MACHINE.beta, DEFAULT_MACHINE.gamma, 0.0, 0.0])
    intra_row = [intra.alpha, intra.beta, intra.gamma, intra.sync, intra.mem]
    source = ((f"rank {first}'s dt tune ({backend}, {shape})" if inter else "defaults")
              + f"; inside a host: {intra.source}")
    paired = figures("shm" if shm else backend, size, shape) or inter or {}
    pairs = paired.get("levels", {})
    if "inter" in pairs:
        row = [pairs["inter"]["alpha"], pairs["inter"]["beta"], paired["gamma"], 0.0, 0.0]
    if "intra" in pairs:
        intra_row = [pairs["intra"]["alpha"], pairs["intra"]["beta"], paired["gamma"], intra.sync, intra.mem]
    if pairs:
        source = (f"rank {first}'s dt tune ({paired['backend']}, {shape}), "
                  f"{' and '.join(sorted(pairs))} timed on their own pairs")
    return {"inter": row, "intra": intra_row,
            "nics": int(paired.get("nics", 0)),
            "winners": inter.get("winners", {}) if inter else {},
            "source": source, "note": note}


def agree(g: Group) -> Agreed | None:
    """The group's agreed figures (collective on first call where the group spans hosts), else None."""
    links = g.links
    if links.agreed is not None or g.size == 1:
        return links.agreed
    if topology_of(g).host_count == 1:
        return None
    device = default_device(g)
    what = "agreeing on auto's figures (rank 0's)"
    if g.rank == 0:
        text = bytearray(json.dumps(local_figures(g)).encode())
        data = torch.frombuffer(text, dtype=torch.uint8)  # host: moved below
        length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
        post_and_wait(g, [(SEND, length, q) for q in range(1, g.size)], what)
        payload = data.to(device)
        post_and_wait(g, [(SEND, payload, q) for q in range(1, g.size)], what)
    else:
        length = torch.zeros(1, dtype=torch.int64, device=device)
        post_and_wait(g, [(RECV, length, 0)], what)
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
        post_and_wait(g, [(RECV, payload, 0)], what)
    fig = json.loads(bytes(payload.cpu().tolist()).decode())
    links.agreed = Agreed(levels_of(fig), fig["source"], fig["note"], fig["winners"])
    return links.agreed


def levels_of(fig: dict[str, Any]) -> Levels:
    """Both levels' Machines from figures as local_figures / figures_on give them."""
    return Levels(_machine(fig["intra"], fig["source"]), _machine(fig["inter"], fig["source"]), fig["nics"])
