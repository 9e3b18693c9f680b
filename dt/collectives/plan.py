"""What a connected group decides once per call shape, and the fast path that reuses it.

A collective's first call of a given shape goes the full way (dt.collectives.api.dispatch):
it connects the group, agrees its figures, checks the arguments, chooses the algorithm.
What depends only on the shape (collective, element count, dtype, op, the algorithm
asked for) is then kept on the group (its links' `plans`) as a `CallPlan`: the algorithm
chosen and, where that algorithm registered a maker (`@algorithm(..., prepare=...)`,
dt.collectives.registry) and the call fits in one round of the board, its fast path: a
callable holding the staging views, row views, slice edges and sync state made once, that
does per call only the copies, the descriptor stores, the syncs and the reduction.

A later call of that shape runs the plan when nothing the full path does could come out
differently: synchronous, nothing queued on the group's communication thread, the same
DT_ALGO and tuned figures as when it was made, and the wire not broken. Inside a
dt.traffic() record (dt train keeps one open for its whole step) it counts the call at
once: the algorithm's own per-rank traffic (dt.cost.traffic_for, computed when the plan
was made: the same bytes and messages the full path counts one by one), its wait timed
by accounting.blocking as the full path's is. With validation on it first
exchanges the signature made once (dt.collectives.validate.check), as the full path
would, so a rank on the plan and a rank on the full path still check each other.
Otherwise it returns False and the caller takes the full path, which runs the same
algorithm with the same rounds: the two paths mix freely across ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dt import transport
from dt.collectives.registry import PREPARED
from dt.collectives.validate import check, signature
from dt.cost.machine import REVISION
from dt.cost.traffic import traffic_for
from dt.transport import accounting

__all__ = ["CallPlan", "make", "planned"]


@dataclass
class CallPlan:
    """One call shape's decisions on one group (see the module doc)."""

    collective: str
    algorithm: str
    fast: Callable[[torch.Tensor], None] | None
    group: transport.Group
    links: Any  # the group's Links: its board, comm thread
    signature: list[int]  # what validation exchanges (its call number set per call)
    dt_algo: str | None  # DT_ALGO when the choice was made
    revision: int  # dt.cost.machine.REVISION then
    traffic: Any = None  # this rank's dt.cost RankTraffic of one call (what dt.traffic() counts)

    def run(self, tensor: torch.Tensor) -> bool:
        """Run the fast path on `tensor` (contiguous, on the CPU); False where it may not."""
        links = self.links
        if (self.fast is None or not tensor.is_cpu or not tensor.is_contiguous()
                or (links.comm is not None and links.comm.pending)
                or links.board.broken or REVISION[0] != self.revision
                or os.environ.get("DT_ALGO") != self.dt_algo):
            return False
        if transport.validation_enabled():
            check(self.group, self.collective, self.signature, None, _CPU)
        # The data, as the full path moves it (no autograd); a plain 1-D tensor as it is
        # (each view is a tensor made per call).
        flat = tensor if tensor.dim() == 1 and not tensor.requires_grad else tensor.detach().view(-1)
        try:
            if accounting.open_records:  # its wait timed as the full path's, the call counted in it
                accounting.blocking(lambda: self._counted(flat))
            else:
                self.fast(flat)
        except transport.CollectiveError:
            raise  # the transport has told the other ranks already
        except Exception as exc:
            g = self.group
            failed(g.ranks[g.rank], self.collective, self.algorithm, exc)
            raise
        return True


    def _counted(self, flat: torch.Tensor) -> None:
        """The fast path, then its whole traffic at once (inside the wait, as the full path counts
        each message while it waits: a timeline names the wait by what it moved)."""
        self.fast(flat)
        accounting.account_call(self.collective, self.algorithm, self.traffic, "shm")


_CPU = torch.device("cpu")  # where a board's signatures travel (a board is CPU only)


def failed(me: int, collective: str, algorithm: str, exc: BaseException) -> None:
    """Tell the other ranks this one left `collective` half done (else they wait it out)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    transport.liveness.announce(transport.liveness.Failure(
        me, "raised", f"rank {me} raised {type(exc).__name__} inside {collective}[{algorithm}]: {text}"))


def planned(g: transport.Group, key: tuple) -> CallPlan | None:
    """The group's plan for this call shape, if one was made."""
    try:
        return g.links.plans.get(key)
    except TypeError:  # an op that cannot be a key (a premultiplied sum): never planned
        return None


def make(g: transport.Group, key: tuple, collective: str, algorithm: str, *, numel: int,
         dtype: torch.dtype, op: str, root: int | None, send: list[int], recv: list[int]) -> None:
    """Keep what the full path decided for this call shape (once per group and shape, and
    again after DT_ALGO or the tuned figures changed).

    Only on a group with a board (the fast paths are load/store ones): elsewhere the plan
    would have nothing to run.
    """
    links = g.links
    dt_algo = os.environ.get("DT_ALGO")
    old = planned(g, key)
    if links.board is None or (old is not None and (old.revision, old.dt_algo) == (REVISION[0], dt_algo)):
        return
    prepare = PREPARED.get((collective, algorithm))
    fast = prepare(g, numel, dtype, op) if prepare is not None else None
    row = signature(collective, algorithm, dtype=dtype, op=op, root=root, send=send, recv=recv,
                    local_error=None, p=g.size)
    try:
        counted = traffic_for(collective, algorithm, numel, dtype.itemsize, g.size, g.rank,
                              stage_bytes=links.board.capacity) if fast is not None else None
        links.plans[key] = CallPlan(collective, algorithm, fast, g, links, row, dt_algo, REVISION[0], counted)
    except TypeError:
        pass  # an op that cannot be a key
