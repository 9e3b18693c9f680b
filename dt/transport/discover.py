"""Finding a group's topology: every rank's host key, pid and token, all-gathered once.

`discover(group)` all-gathers every rank's host key (dt.transport.topology.host_key),
its pid and a random token over the group's torch wire, so every rank ends with the
same `Topology`. It is a collective: dt runs it at the first collective on a group,
on every rank at the same point (dt.transport.connect), never inside a lone send or
receive. `post_and_wait` is the setup's messaging, shared with the segment handshake
(dt.transport.shm.attach) and the figures' agreement across hosts (dt.collectives.agreed).

The setup messages are not counted in dt.traffic(): they are how the wire
is built, not what a collective moves (like gloo's own rendezvous).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import secrets

import torch

from dt.transport import accounting, liveness, settings
from dt.transport.errors import CollectiveError, CollectiveTimeout, timed_out
from dt.transport.group import Group, default_device
from dt.transport.topology import Topology, host_key
from dt.transport.wire import RECV, SEND

__all__ = ["discover", "post_and_wait"]


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
