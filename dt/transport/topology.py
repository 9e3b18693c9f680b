"""Which ranks of a group share a host: found once per group, agreed by every rank.

Two ranks "share a host" when they can map the same memory: the same kernel
and the same network namespace (two namespaces on one machine are how the
project simulates two hosts, and they share the hostname). Each rank names
its host with a key:

1. `DT_HOST`, if set (tests mark simulated hosts with it);
2. else torchrun's node identity (`GROUP_RANK`: the agent's node);
3. else hostname + boot id + network namespace.

`Topology` is the table every rank of a group ends with: `hosts[i]` is the
host index of group rank i (hosts numbered in order of their first rank),
`local` the group ranks on this rank's host. dt.transport.discover finds it
(a collective over the group's torch wire); this file is the data alone, so
a group's links (dt.transport.group) can name its type without a cycle.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from dt import hosts as host_math

__all__ = ["Topology", "host_key"]


def host_key() -> str:
    """This process's host, as a string every rank on the same host computes alike."""
    marked = os.environ.get("DT_HOST")
    if marked:
        return f"marked:{marked}"
    node = os.environ.get("GROUP_RANK")
    if node is not None and "TORCHELASTIC_RUN_ID" in os.environ:
        return f"torchrun:{os.environ['TORCHELASTIC_RUN_ID']}:{node}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return f"{socket.gethostname()}:{boot}:{netns}"


@dataclass(frozen=True)
class Topology:
    """A group's hosts, identical on every rank of the group.

    hosts[i]: host index of group rank i (0, 1, ... in order of first appearance);
    pids[i]: its process id (meaningful to the ranks of its own host);
    token: group rank 0's random token, which names this job's shared segments.
    """

    rank: int
    hosts: tuple[int, ...]
    pids: tuple[int, ...]
    token: str

    @property
    def host(self) -> int:
        return self.hosts[self.rank]

    @property
    def host_count(self) -> int:
        return max(self.hosts) + 1 if self.hosts else 0

    def ranks_on(self, host: int) -> tuple[int, ...]:
        """Group ranks on `host`, in group order."""
        return tuple(i for i, h in enumerate(self.hosts) if h == host)

    @property
    def local(self) -> tuple[int, ...]:
        """Group ranks on this rank's host (this rank included), in group order."""
        return self.ranks_on(self.host)

    @property
    def local_rank(self) -> int:
        return self.local.index(self.rank)

    @property
    def single_host(self) -> bool:
        return self.host_count == 1

    def same_host(self, peer: int) -> bool:
        return self.hosts[peer] == self.host

    @property
    def order(self) -> tuple[int, ...]:
        """Group ranks host by host: a ring in this order crosses each host boundary once per lap."""
        return host_math.host_order(self.hosts)

    @property
    def per_host(self) -> tuple[int, ...]:
        """How many of the group's ranks each host has (host order)."""
        return tuple(len(m) for m in host_math.members(self.hosts))

    def rail(self, index: int | None = None) -> tuple[int, ...]:
        """Ranks with local index `index` (default: this rank's) on every host that has one."""
        return host_math.rail(self.hosts, self.local_rank if index is None else index)

    def shape(self) -> str:
        """The topology as `dt tune` keys figures by: "2x4" (equal hosts) or "3+1"."""
        sizes = self.per_host
        if len(set(sizes)) == 1:
            return f"{len(sizes)}x{sizes[0]}"
        return "+".join(str(s) for s in sizes)
