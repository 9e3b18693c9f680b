"""Public point-to-point, torch-shaped (peers are global ranks), counted like every dt message.

isend / irecv / send / recv take torch.distributed's parameters (dst or
group_dst, tag); isend and irecv return a Work. `batch_isend_irecv` posts a
list of `P2POp`s as one step with `Comm.batch` (receives first, so a pair of
ranks that send to each other cannot block; NCCL runs the batch as one group),
and returns one Work per op, as torch's.

Each call counts as one "send_recv" call in dt.traffic(), its messages as
usual. Tags are accepted and ignored, as NCCL ignores them: messages between two
ranks match in the order they were posted. A receive needs its source (as
with NCCL, there is no receive from any rank).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dt.transport.accounting import charged_to
from dt.transport.asynchronous import Work
from dt.transport.comm import RECV, SEND, Comm, Handle
from dt.transport.group import Group, resolve_group
from dt.transport.settings import call_timeout

__all__ = ["P2POp", "P2PWork", "batch_isend_irecv", "irecv", "isend", "recv", "send"]


class P2PWork(Work):
    """A Work for posted messages: done when every one of them is."""

    def __init__(self, name: str, handles: list[Handle], result: list[torch.Tensor]):
        super().__init__(name)
        self._handles, self._payload, self._waiting = handles, result, threading.Lock()

    def is_completed(self) -> bool:
        return super().is_completed() or all(h.work is None or h.work.is_completed()
                                             for h in self._handles)

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Wait for the messages (timeout: this wait's, else the group's usual one); raise their error."""
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        with self._waiting:
            if not super().is_completed():
                try:
                    with call_timeout(timeout or None):
                        for h in self._handles:
                            h.wait()
                    self.finish(self._payload)
                except BaseException as exc:  # noqa: BLE001 - kept for wait() and the future
                    self.finish(exc=exc)
        if self.exception() is not None:
            raise self.exception()  # the transport's own error, naming the peer
        return True

    def get_future(self) -> torch.Future:
        future = super().get_future()
        if not super().is_completed():  # someone must wait for the messages to settle it
            threading.Thread(target=self._quiet_wait, name=f"dt-{self.name}", daemon=True).start()
        return future

    def _quiet_wait(self) -> None:
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - the future carries it
            pass


def _peer(g: Group, rank: int | None, group_rank: int | None, what: str) -> int:
    """The peer's rank in the group, from torch's pair (dst, group_dst)."""
    if rank is not None and group_rank is not None:
        raise ValueError(f"Can't specify both {what}={rank} and group_{what}={group_rank}")
    if group_rank is not None:
        return group_rank
    if rank is None:
        raise ValueError(f"Must specify {what} or group_{what} (dt, as NCCL, has no receive "
                         "from any source)")
    return g.group_rank(rank)


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> P2PWork:
    """Post a send of `tensor` to global rank `dst`; `.wait()` the returned Work."""
    g = resolve_group(group)
    with charged_to("send_recv", "p2p"):
        h = Comm(g, "send_recv", "p2p").isend(tensor, _peer(g, dst, group_dst, "dst"))
    return P2PWork("isend", [h], [tensor])


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> P2PWork:
    """Post a receive into `tensor` from global rank `src`; `.wait()` the returned Work."""
    g = resolve_group(group)
    with charged_to("send_recv", "p2p"):
        h = Comm(g, "send_recv", "p2p").irecv(tensor, _peer(g, src, group_src, "src"))
    return P2PWork("irecv", [h], [tensor])


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    isend(tensor, dst, group, tag, group_dst).wait()


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into `tensor`; return the sender's global rank, as torch does."""
    g = resolve_group(group)
    peer = _peer(g, src, group_src, "src")
    irecv(tensor, group=g, tag=tag, group_src=peer).wait()
    return g.global_rank(peer)


def _is(op: Callable[..., Any], name: str) -> bool:
    return getattr(op, "__name__", None) == name and op in (globals()[name], getattr(dist, name))


class P2POp:
    """One send or receive for batch_isend_irecv: op is dt's (or torch's) isend or irecv."""

    def __init__(self, op: Callable[..., Any], tensor: torch.Tensor, peer: int | None = None,
                 group: Any = None, tag: int = 0, group_peer: int | None = None):
        if not (_is(op, "isend") or _is(op, "irecv")):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``dt.isend`` or "
                             "``dt.irecv`` (or torch.distributed's).")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"P2POp: tensor must be a torch.Tensor, got {type(tensor).__name__}")
        self.op, self.tensor, self.group, self.tag = op, tensor, group, tag
        g = resolve_group(group)
        self.group_peer = _peer(g, peer, group_peer, "peer")
        self.peer = g.global_rank(self.group_peer)


def batch_isend_irecv(p2p_op_list: list[Any]) -> list[P2PWork]:
    """Post every op of the list as one step (dt's or torch's P2POp); one Work per op."""
    if not isinstance(p2p_op_list, list) or not p2p_op_list:
        raise ValueError("batch_isend_irecv needs a non-empty list of P2POp")
    group = p2p_op_list[0].group
    if any(op.group is not group for op in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    g = resolve_group(group)
    kinds = [SEND if op.op.__name__ == "isend" else RECV for op in p2p_op_list]
    with charged_to("send_recv", "p2p"):
        handles = Comm(g, "send_recv", "p2p").batch(
            [(kind, op.tensor, g.group_rank(op.peer)) for kind, op in zip(kinds, p2p_op_list)])
    return [P2PWork(f"batch_isend_irecv[{kind}]", [h], [op.tensor])
            for kind, h, op in zip(kinds, handles, p2p_op_list)]
