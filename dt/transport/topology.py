"""Which ranks of a group share a host: found once per group, agreed by every rank.

Two ranks "share a host" when they can map the same memory: the same kernel
and the same network namespace (two namespaces on one machine are how the
project simulates two hosts, and they share the hostname). Each rank names
its host with a key:

1. `DT_HOST`, if set (tests mark simulated hosts with it);
2. else torchrun's node identity (`GROUP_RANK`: the agent's node);
3. else hostname + boot id + network namespace.

`discover(group)` all-gathers every rank's key (and its pid and a random
token) over the group's torch wire, so every rank ends with the same table:
`hosts[i]` is the host index of group rank i (hosts numbered in order of
their first rank), `local` the group ranks on this rank's host. It is a
collective: dt runs it at the first collective on a group, on every rank at
the same point (dt.transport.connect), never inside a lone send or receive.

The setup messages are not counted in dt.traffic(): they are how the wire
is built, not what a collective moves (like gloo's own rendezvous).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets
import socket
from dataclasses import dataclass

import torch

from dt import hosts as host_math
from dt.transport import accounting, liveness, settings
from dt.transport.errors import CollectiveError, CollectiveTimeout, timed_out
from dt.transport.group import Group, default_device
from dt.transport.wire import RECV, SEND

__all__ = ["Topology", "discover", "host_key", "post_and_wait"]


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


def _digest(key: str) -> list[int]:
    """Two int63 words of a key's hash: what travels in the all-gather."""
    h = hashlib.sha256(key.encode()).digest()
    return [int.from_bytes(h[i:i + 8], "little") & ((1 << 63) - 1) for i in (0, 8)]


def post_and_wait(g: Group, ops: list[tuple[str, torch.Tensor, int]], what: str) -> None:
    """Post [(SEND|RECV, tensor, group peer)] on the group's torch wire, wait for all.

    Uncounted (connection setup: accounting.setup()); the group's timeout applies, a failure of a
    member announced meanwhile (dt.transport.liveness) ends the wait, and an
    error names this rank, the peer and what was being set up.
    """
    if not ops:
        return
    me = g.ranks[g.rank]
    timeout = settings.timeout_for(g)
    current = ops[0]  # the operation being waited on, for the error
    try:
        with accounting.setup(), liveness.watching(g.ranks, g.pg, g.backend):
            works = g.wire.post([(k, t, g.ranks[q]) for k, t, q in ops])
            for op, work in zip(ops, works):
                current = op
                work.wait(datetime.timedelta(seconds=timeout))
    except (RuntimeError, liveness.PeerFailed) as exc:
        kind, _, peer = current
        where = (f"rank {me} {what} (group {list(g.ranks)}): {kind} "
                 f"{'from' if kind == RECV else 'to'} rank {g.ranks[peer]}")
        if isinstance(exc, liveness.PeerFailed):
            raise CollectiveError(f"{where} failed: {exc.failure.text}") from None
        text = str(exc)
        if "imed out" in text or "timeout" in text.lower():
            liveness.announce(liveness.Failure(me, "timeout", f"rank {me} waited on rank "
                                               f"{g.ranks[peer]} {what}: {timed_out(timeout)}",
                                               g.ranks[peer]))
            raise CollectiveTimeout(f"{where}: {timed_out(timeout)}") from None
        failure = liveness.cause(g.ranks)
        if failure is not None:
            raise CollectiveError(f"{where} failed: {failure.text}") from None
        raise CollectiveError(f"{where} failed: {text.splitlines()[0] if text else exc}") from None


def discover(g: Group, why: str = "the topology") -> Topology:
    """All-gather every rank's host key, pid and token; the same Topology on every rank."""
    p, r = g.size, g.rank
    token = secrets.randbits(62)
    mine = torch.tensor(_digest(host_key()) + [os.getpid(), token], dtype=torch.int64)  # host: moved below
    table = torch.zeros((p, 4), dtype=torch.int64)  # host: rows moved to the device
    table[r] = mine
    if p > 1:
        device = default_device(g)
        rows = [table[i].to(device) for i in range(p)]
        ops = [(RECV, rows[q], q) for q in range(p) if q != r]
        ops += [(SEND, rows[r], q) for q in range(p) if q != r]
        post_and_wait(g, ops, f"{why}: exchanging host keys")
        table = torch.stack([row.cpu() for row in rows])
    keys: dict[tuple[int, int], int] = {}
    hosts = []
    for i in range(p):
        k = (int(table[i, 0]), int(table[i, 1]))
        hosts.append(keys.setdefault(k, len(keys)))
    return Topology(rank=r, hosts=tuple(hosts), pids=tuple(int(v) for v in table[:, 2]),
                    token=f"{int(table[0, 3]):x}")
