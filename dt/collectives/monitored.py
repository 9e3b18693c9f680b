"""monitored_barrier: a barrier that names the ranks that never arrived.

When an ordinary barrier times out, each rank only learns that its partner
of some round did not answer; which rank is really stuck is lost in the
rounds. The monitored barrier (gloo's, in torch) puts one rank in charge:
group rank 0 expects a token from every other rank, all within `timeout`,
and only then releases each of them. So rank 0 knows exactly who is missing:

- wait_all_ranks=False: it raises at the first rank that has not arrived;
- wait_all_ranks=True: it waits out the timeout and names every missing rank.

The other ranks wait (as long) for their release and, when rank 0 raised
instead, raise themselves, naming rank 0 and the step.

Cost: 2(p-1) one-byte messages, every one of them at group rank 0, in 2
steps: O(p) work at one rank, which is why this is a debugging tool and the
everyday barrier is the dissemination barrier (ceil(lg p) steps, no root).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch

from dt import transport
from dt.transport import CollectiveError, CollectiveTimeout, Comm, Group, resolve_group

__all__ = ["monitored_barrier"]


def monitored_barrier(group: Any = None, timeout: datetime.timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """Barrier whose group rank 0 names the ranks that did not arrive within `timeout`.

    timeout: a timedelta; None means this group's usual one (dt.transport.timeout_for).
    """
    g = resolve_group(group)
    seconds = (timeout.total_seconds() if isinstance(timeout, datetime.timedelta)
               else float(timeout) if timeout is not None else float(transport.timeout_for(g)))

    def job() -> None:
        with transport.charged_to("monitored_barrier", "flat"), transport.call_timeout(seconds):
            _run(g, seconds, wait_all_ranks)

    transport.submit(g, "monitored_barrier", job, async_op=False)


def _run(g: Group, seconds: float, wait_all_ranks: bool) -> None:
    comm = Comm(g, "monitored_barrier", "flat")
    if comm.size == 1:
        return
    device = transport.default_device(g)
    if comm.rank != 0:
        token = torch.zeros(1, dtype=torch.uint8, device=device)
        comm.send(token, 0)
        comm.step = 1
        comm.recv(token, 0)  # the release
        return
    tokens = [torch.zeros(1, dtype=torch.uint8, device=device) for _ in range(comm.size)]
    arrivals = comm.batch([(transport.RECV, tokens[i], i) for i in range(1, comm.size)])
    deadline = time.monotonic() + seconds
    missing = []
    for i, handle in enumerate(arrivals, start=1):
        try:
            with transport.call_timeout(max(deadline - time.monotonic(), 1e-3)):
                handle.wait()
        except CollectiveError:
            missing.append(g.ranks[i])
            if not wait_all_ranks:
                break
    if missing:
        more = "" if wait_all_ranks else " (the first one missing; wait_all_ranks=True names them all)"
        raise CollectiveTimeout(
            f"monitored_barrier: rank {g.ranks[0]}: {transport.timed_out(seconds)}: rank(s) {missing} "
            f"failed to pass monitoredBarrier{more}: stuck elsewhere, dead, or never called "
            "monitored_barrier")
    comm.step = 1
    for handle in comm.batch([(transport.SEND, tokens[i], i) for i in range(1, comm.size)]):
        handle.wait()
