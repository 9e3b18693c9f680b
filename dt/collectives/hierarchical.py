"""Hierarchical (two-level) collectives: the fast links inside a host, then few bytes across hosts.

Inside a host ranks talk over shared memory or NVLink (hundreds of GB/s);
between hosts over one NIC each (tens of GB/s). A flat ring sends its
2(p-1)/p n bytes through every link, the slow ones included; the
hierarchical all-reduce sends across hosts only what cannot be summed at
home first (Horovod's and NCCL's two-level schemes):

1. reduce-scatter inside each host: local rank i ends with piece i of the
   buffer summed over its host (a ring over the host's ranks);
2. all-reduce across hosts among the ranks holding the same piece: the
   rail of local index i (a ring over H ranks, one per host);
3. all-gather inside each host: every rank gets every piece.

Each phase is an ordinary ring (dt.collectives.ring_engine.ring_pass) run on a
part of the group (dt.transport.part): the host part talks over the
shared-memory wire where the group has one, the rail part over the torch
wire, and neither knows which. Which piece, rail and destination each rank
handles is dt.hosts' arithmetic (`runs`, `delivery`, `collected_by`), the
same the cost model counts with. With unequal hosts (3 ranks + 1) the buffer
is cut into as many pieces as the largest host has ranks; a smaller host's
rank owns several and takes part in several inter-host rings, one after
another in the order every rank follows.

Cost (H hosts of G ranks, n bytes; dt.cost.hierarchy has the exact counts):
all-reduce 4(G-1) + 2(H-1) steps; per rank 2(G-1)/G n inside the host and
2(H-1)/H n/G across hosts (the flat ring: 2(p-1)/p n, all of it through
each host's boundary link); (G-1)/G n + (H-1)/H n/G reduced.
reduce-scatter and all-gather: half of each (G-1 + H-1 steps).
"""

from __future__ import annotations

import torch

from dt.collectives.ops import ReduceOp, finish, op_name
from dt.collectives.registry import algorithm, tensor_forms
from dt.collectives.ring_engine import ring_pass
from dt.collectives.scratch import scratch
from dt.cost import levels
from dt.cost.traffic import hierarchical_traffic
from dt.hosts import collected_by, delivery, members, owned, pieces, runs
from dt.layout import edges, split_sizes
from dt.transport import Comm, Group, part, resolve_group, topology_of

PACK_SLOT = 5  # scratch slot of the packed blocks (ring_pass lands in slots 0 and 1)


def _phases(g: Group, collective: str) -> tuple[tuple[int, ...], Comm]:
    """The group's hosts tuple and the Comm of this rank's host part."""
    hosts = topology_of(g).hosts
    return hosts, Comm(part(g, members(hosts)[hosts[g.rank]]), collective, "hierarchical:host")


def _rail(g: Group, owners: tuple[int, ...], collective: str) -> Comm:
    return Comm(part(g, owners), collective, "hierarchical:rail")


@algorithm("all_reduce", "hierarchical", traffic=hierarchical_traffic, levels=levels.hierarchical)
def hierarchical_all_reduce(tensor: torch.Tensor, op: object = ReduceOp.SUM, group: object = None) -> None:
    """All-reduce in place: reduce-scatter in the host, all-reduce on rails across hosts, all-gather.

    Cost (dt.cost.hierarchy): 2(G-1) + 2(H-1) ring steps; 2(G-1)/G n bytes per rank
    inside the host, 2(H-1)/H n/G across hosts.
    """
    g = resolve_group(group)
    if g.size == 1:
        return
    name, flat = op_name(op), tensor.view(-1)
    summing = "SUM" if name == "AVG" else name  # AVG: divided once, by the whole group, at the end
    hosts, host = _phases(g, "all_reduce")
    e = edges(split_sizes(flat.numel(), pieces(hosts)))
    chunks = [flat[e[lo]:e[hi]] for lo, hi in owned(host.size, pieces(hosts))]
    ring_pass(host, chunks, first=-1, op=summing)
    for run in runs(hosts):
        if g.rank in run.owners and len(run.owners) > 1:
            seg = flat[e[run.lo]:e[run.hi]]
            ring_pass(_rail(g, run.owners, "all_reduce"),
                      list(seg.split(split_sizes(seg.numel(), len(run.owners)))),
                      first=-1, op=summing, laps=2)
    finish(chunks[host.rank], name, g.size)
    ring_pass(host, chunks, first=0)


def _packs(hosts: tuple[int, ...], g: Group, numels: list[int]) -> tuple[list[list[int]], list[int]]:
    """Blocks each local rank collects (destinations, ascending) and each pack's element count."""
    local = members(hosts)[hosts[g.rank]]
    packs = [collected_by(hosts, m) for m in local]
    return packs, [sum(numels[d] for d in pk) for pk in packs]


def _views(buf: torch.Tensor, pack: list[int], numels: list[int]) -> dict[int, torch.Tensor]:
    """Destination -> its block inside one pack."""
    out, at = {}, 0
    for d in pack:
        out[d] = buf[at:at + numels[d]]
        at += numels[d]
    return out


@algorithm("reduce_scatter", "hierarchical", traffic=hierarchical_traffic, levels=levels.hierarchical)
def hierarchical_reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor],
                                op: object = ReduceOp.SUM, group: object = None) -> None:
    """output on rank r = reduction of input_list[r]: reduce-scatter in the host, then across hosts.

    The blocks each local rank collects (its rail's, dt.hosts.collected_by) are
    packed once (one copy of the input, which is read, not written), reduced
    inside the host, then reduce-scattered among the owners across hosts.
    Cost (dt.cost.hierarchy): (G-1) + (H-1) steps; (G-1)/G n inside, (H-1)/H n/G across.
    """
    g = resolve_group(group)
    name = op_name(op)
    if g.size == 1:
        output.view(-1).copy_(input_list[0].reshape(-1))
        return
    summing = "SUM" if name == "AVG" else name
    hosts, host = _phases(g, "reduce_scatter")
    numels = [t.numel() for t in input_list]
    packs, sizes = _packs(hosts, g, numels)
    buf = scratch(sum(sizes), output.dtype, output.device, PACK_SLOT)
    chunks = list(buf.split(sizes))
    for pk, chunk in zip(packs, chunks):
        for d, view in _views(chunk, pk, numels).items():
            view.copy_(input_list[d].reshape(-1))
    ring_pass(host, chunks, first=-1, op=summing)
    mine = _views(chunks[host.rank], packs[host.rank], numels)
    for dl in delivery(hosts):
        if g.rank in dl.owners and len(dl.owners) > 1:
            rail = [mine[o] if o in dl.dests else mine[dl.dests[0]][:0] for o in dl.owners]
            ring_pass(_rail(g, dl.owners, "reduce_scatter"), rail, first=-1, op=summing)
    out = output.view(-1)
    out.copy_(mine[g.rank])
    finish(out, name, g.size)


@algorithm("all_gather", "hierarchical", traffic=hierarchical_traffic, levels=levels.hierarchical)
def hierarchical_all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                            group: object = None) -> None:
    """All-gather across hosts among the owners of each rail, then inside each host.

    Cost (dt.cost.hierarchy): (H-1) + (G-1) steps; (H-1)/H n/G across hosts,
    (G-1)/G n inside (n = all blocks); one copy of the blocks into and out of packs.
    """
    g = resolve_group(group)
    outs = [t.view(-1) for t in tensor_list]
    own = outs[g.rank]
    if own.data_ptr() != tensor.data_ptr() or own.numel() != tensor.numel():
        own.copy_(tensor.reshape(-1))
    if g.size == 1:
        return
    hosts, host = _phases(g, "all_gather")
    for dl in delivery(hosts):
        if g.rank in dl.owners and len(dl.owners) > 1:
            rail = [outs[o] if o in dl.dests else own[:0] for o in dl.owners]
            ring_pass(_rail(g, dl.owners, "all_gather"), rail, first=0)
    numels = [t.numel() for t in outs]
    packs, sizes = _packs(hosts, g, numels)
    if host.size == 1:
        return
    buf = scratch(sum(sizes), own.dtype, own.device, PACK_SLOT)
    chunks = list(buf.split(sizes))
    for d, view in _views(chunks[host.rank], packs[host.rank], numels).items():
        view.copy_(outs[d])
    ring_pass(host, chunks, first=0)
    for j, (pk, chunk) in enumerate(zip(packs, chunks)):
        if j != host.rank:
            for d, view in _views(chunk, pk, numels).items():
                outs[d].copy_(view)


tensor_forms("hierarchical", all_gather=hierarchical_all_gather,
             reduce_scatter=hierarchical_reduce_scatter)
