"""Parts of a group: some of its ranks as a Group of their own, over the parent's wires.

A hierarchical collective runs ordinary algorithms on the ranks of one host
and on the ranks of one rail (dt.hosts). Making torch process groups for
those would be a collective over the whole world (dist.new_group), at a
point only some ranks reach; a part needs none. It is a `Group` whose
members are a subset of the parent's, whose messages go through the
parent's process group to the same global ranks, on the same wire per peer:
shared memory between ranks of one host where the parent has it, the torch
wire to other hosts. So an algorithm run on the host part uses the
shared-memory wire without knowing it, and its bytes are counted per wire
like any other.

Its topology is the parent's restricted to the members, so it is known on
every member without a message. A part carries messages only inside a
parent's collective, in an order every member follows (one phase after
another), so it shares the parent's message order with no tag of its own.
Made once per (parent, members) and cached on the parent's links.
"""

from __future__ import annotations

from dt.transport.connect import connect
from dt.transport.group import Group, Links
from dt.transport.topology import Topology

__all__ = ["part"]


def part(g: Group, members: tuple[int, ...]) -> Group:
    """The Group of g's ranks `members` (group ranks of g, in the part's order); g's rank among them."""
    links = connect(g)
    cached = links.parts.get(members)
    if cached is not None:
        return cached
    if g.rank not in members:
        raise ValueError(f"rank {g.ranks[g.rank]} is not in the part {[g.ranks[m] for m in members]} "
                         f"of the group {list(g.ranks)}")
    if len(set(members)) != len(members) or not all(0 <= m < g.size for m in members):
        raise ValueError(f"a part names distinct group ranks of 0..{g.size - 1}, got {list(members)}")
    topo = links.topology
    numbering: dict[int, int] = {}
    hosts = tuple(numbering.setdefault(topo.hosts[m], len(numbering)) for m in members)
    sub = Links()
    sub.topology = Topology(rank=members.index(g.rank), hosts=hosts,
                            pids=tuple(topo.pids[m] for m in members), token=topo.token)
    sub.wires = [links.wires[m] for m in members] if links.wires is not None else None
    sub.torch = links.torch
    sub.why_not = f"it is a part {list(members)} of the group {list(g.ranks)} (no board of its own)"
    view = Group(pg=g.pg, rank=members.index(g.rank), size=len(members),
                 ranks=tuple(g.ranks[m] for m in members), backend=g.backend,
                 name=f"{g.name}/{'.'.join(str(m) for m in members)}", wire=g.wire, links=sub)
    links.parts[members] = view
    return view
