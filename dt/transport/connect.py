"""Connecting a group: find its hosts, give each peer its wire. Once per group, on every rank.

`connect(group)` runs at the group's first collective (dt.collectives.api
calls it before choosing an algorithm) and whenever a shared allocation is
made (dt.shm_empty); both happen at the same point of the program on every
rank, which is what a collective step like this needs. A lone send or
receive never connects: point-to-point on a group that has not run a
collective yet stays on the torch wire.

It discovers the topology (dt.transport.discover); then, unless the
shared-memory wire is off (DT_TRANSPORT=torch, or a CPU whose stores other
cores may see out of order: dt.args.shared_memory_refused) or the group is NCCL's, the
ranks of each host share one segment (dt.transport.shm.attach) and talk
through it; ranks on other hosts stay on torch.distributed. When the whole
group is on one host, its `board` carries the load/store algorithms.
"""

from __future__ import annotations

import warnings
from typing import Any

from dt import args
from dt.transport import settings
from dt.transport.discover import discover
from dt.transport.errors import CollectiveError
from dt.transport.group import Group, Links
from dt.transport.shm.attach import attach_host
from dt.transport.shm.wire import PumpedTorchWire
from dt.transport.topology import Topology

__all__ = ["board", "connect", "topology_of"]


def connect(g: Group, why: str = "a collective") -> Links:
    """Connect `g` if it is not yet (collective on first use); return its links.

    `why` names the call that connects (errors say it: a rank that never makes
    that call leaves its peers waiting here).
    """
    links = g.links
    if links.topology is not None:
        return links
    with links.lock:
        if links.topology is not None:
            return links
        topo = discover(g, f"connecting the group at its first collective ({why})")
        links.why_not = _why_not(g, topo)
        _say_why_sockets(g, topo)
        if g.size > 1 and len(topo.local) > 1 and settings.shared_memory_allowed() and g.backend != "nccl":
            host = attach_host(g, topo)
            torch_wire = g.wire if topo.single_host else PumpedTorchWire(g.pg, g.backend, host.engine)
            links.torch = torch_wire
            links.host = host
            links.board = host.board if topo.single_host else None
            links.wires = [host.wire if topo.same_host(q) else torch_wire for q in range(g.size)]
        links.topology = topo
    return links


def topology_of(g: Group) -> Topology:
    """The group's hosts (connects it first: collective on first use)."""
    return connect(g).topology


def board(g: Group, collective: str, algorithm: str) -> Any:
    """The board of a group on one shared segment, or the error saying why it has none."""
    links = connect(g)
    if links.board is not None:
        return links.board.call(collective, algorithm)
    if g.size == 1:
        return None
    raise CollectiveError(f"{collective}[{algorithm}] needs every rank of the group {list(g.ranks)} "
                          f"on one shared-memory segment, but {links.why_not}")


def _say_why_sockets(g: Group, topo: Topology) -> None:
    """One line, from group rank 0, when ranks that share a host talk over sockets for their
    CPU's sake (DT_TRANSPORT=auto): the wire's speed there is not the shared-memory wire's."""
    why = args.shared_memory_refused()
    if why is not None and g.rank == 0 and len(topo.local) > 1 and settings.get_transport() == "auto":
        warnings.warn(f"dt: {why}; ranks of one host talk over torch.distributed instead",
                      RuntimeWarning, stacklevel=3)


def _why_not(g: Group, topo: Topology) -> str:
    """Why a group gets no board (said by the errors of load/store algorithms run on it)."""
    if settings.get_transport() not in ("auto", "shm"):
        return (f"the shared-memory wire was off (DT_TRANSPORT={settings.get_transport()}) "
                "when the group connected")
    why = args.shared_memory_refused()
    if why is not None:
        return why
    if g.backend == "nccl":
        return "it is an NCCL group (GPU tensors stay on NCCL)"
    return f"its ranks span {topo.host_count} hosts (host of each rank: {list(topo.hosts)})"


def shm_ready(g: Group) -> bool:
    """Whether the group (already connected) runs load/store algorithms."""
    return g.links.board is not None
