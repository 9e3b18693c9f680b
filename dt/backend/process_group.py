"""dt.ProcessGroup: torch.distributed's process-group interface with dt's algorithms behind it.

torch.distributed's functions (dist.all_reduce, ...) do not move data
themselves: they call a method of the group, `group.allreduce([tensor],
opts)`, and so do torch's C++ layers (DDP's reducer, functional collectives
under DTensor, FSDP). A Python subclass of torch.distributed.ProcessGroup can
answer those calls (torch's own test_c10d_pypg.py does), and this one answers
each by running the dt collective of the same meaning: the algorithms of
dt.collectives, validated, counted by dt.traffic(), async on dt's
communication thread when torch asks for async.

The wire. dt's collectives are made of point-to-point messages, which its
transport posts with dist.isend(..., group=this group); torch hands those to
this group's send/recv, and they go out through a gloo process group this
group owns (`wire`). So torch code sees one group, "dt", and every byte
still travels as a dt message. The wire is gloo, so the tensors must be CPU
tensors (dt's NCCL path is the "nccl" backend, used directly).

Options torch passes: reduceOp, rootRank (a rank *in the group*: dt's
group_src/group_dst), asyncOp (False: run inline, hand back a finished
Work), and a barrier's timeout (dt's per-call timeout).

What torch gets back. Every call answers with a dt Work (dt.transport.Work,
a torch.distributed.Work), so `work.wait(timeout=...)` behaves as on gloo:
it raises (a CollectiveTimeout) when the collective has not completed in
time, and the collective goes on. The device. torch asks a group which
devices it serves (`pg._device_types`, `_get_pg_default_device`,
`pg._get_backend(device)`: how torch.distributed.checkpoint's
full-state-dict broadcast picks where its tensors go): the gloo wire is
registered as this group's CPU backend, the thing that carries its bytes.
Every collective torch calls on the group still reaches the methods below
(torch's base class would forward a missing one to the wire).
"""

from __future__ import annotations

import datetime
import types
from typing import Any

import torch
import torch.distributed as dist

from dt import collectives, transport
from dt.collectives import coalesced
from dt.transport.accounting import in_setup

__all__ = ["ProcessGroup", "create"]

_UNSET = datetime.timedelta(milliseconds=-1)  # torch's options.timeout when nobody set one


def _one(tensors: list[torch.Tensor], method: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"dt.ProcessGroup.{method}: one tensor per process (got {len(tensors)}); "
                         "torch's multi-tensor-per-process form is not supported")
    return tensors[0]


def _async(opts: Any) -> bool:
    return getattr(opts, "asyncOp", True)


def _count(tensors: list[torch.Tensor], sent: bool) -> None:
    """Count a message torch code posted itself (dist.isend, batch_isend_irecv on this group).

    Messages of dt calls reach send/recv too, already counted by dt's transport:
    those run inside a dt call (transport.charge_target() is set), these do not;
    nor do a group's setup messages (its first collective's: uncounted on any wire).
    """
    if transport.charge_target() is None and not in_setup():
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        transport.account("send_recv", "torch p2p", sent=nbytes if sent else -1,
                          received=-1 if sent else nbytes, calls=1)


def _done(name: str, result: Any) -> transport.Work:
    """A finished Work whose future carries `result` (a call torch asked to run inline)."""
    work = transport.Work(name)
    work.finish(result=result)
    return work


def _settled_by(name: str, future: torch.Future) -> transport.Work:
    """A Work that completes with `future` (dt's coalesced calls answer async_op with a future)."""
    work = transport.Work(name)

    def settle(f: torch.Future) -> None:
        try:
            work.finish(result=f.value())
        except Exception as exc:  # noqa: BLE001 - the collective's error, raised again at wait()
            work.finish(exc=exc)

    future.add_done_callback(settle)
    return work


class ProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives are dt's; created by `dist.init_process_group("dt")`."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        # settings.timeout_for reads a group's timeout from `options._timeout`, as on torch's backends.
        self.options = types.SimpleNamespace(_timeout=timeout)
        self.wire = dist.ProcessGroupGloo(dist.PrefixStore("dt-wire/", store), rank, size, timeout)
        # torch finds a group's devices through its registered backends; without one,
        # _get_pg_default_device and _get_backend(cpu) raise (see the module's docstring).
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self.wire)
        self._group_name = self._group_desc = ""

    # -- identity (torch stores these on a backend; this group has none) -----
    def getBackendName(self) -> str:  # noqa: N802 - torch's virtual names
        return "dt"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    # -- the wire ------------------------------------------------------------
    def _check_cpu(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if t.device.type != "cpu":
                raise ValueError(f"dt.ProcessGroup: its wire is gloo, so tensors must be on the CPU, "
                                 f"got one on {t.device} (use the nccl backend for GPU tensors)")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        self._check_cpu(tensors)
        _count(tensors, sent=True)
        return self.wire.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        self._check_cpu(tensors)
        _count(tensors, sent=False)
        return self.wire.recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        raise ValueError("dt.ProcessGroup has no receive from any source (dt names every peer, as "
                         "NCCL does): pass src to recv")

    # -- turning a dt call into a torch Work -----------------------------------
    def _work(self, run: Any, opts: Any, result: Any) -> transport.Work:
        """Run the dt collective `run(async_op)`; a Work whose future carries `result`."""
        if _async(opts):
            return run(True)
        run(False)
        return _done("collective", result)

    # -- collectives -----------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        t = _one(tensors, "allreduce")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._work(lambda a: collectives.all_reduce(t, op, self, a), opts, [t])

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if _async(opts):  # dt's (like torch's) returns the future itself
            return _settled_by("all_reduce_coalesced",
                               collectives.all_reduce_coalesced(tensors, op, self, True))
        collectives.all_reduce_coalesced(tensors, op, self)
        return _done("all_reduce_coalesced", list(tensors))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        t = _one(tensors, "broadcast")
        root = opts.rootRank if opts is not None else 0
        return self._work(lambda a: collectives.broadcast(t, group=self, async_op=a, group_src=root),
                          opts, [t])

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        t = _one(tensors, "reduce")
        return self._work(lambda a: collectives.reduce(t, op=opts.reduceOp, group=self, async_op=a,
                                                       group_dst=opts.rootRank), opts, [t])

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Any:
        t, outs = _one(input_tensors, "allgather"), _one(output_tensors, "allgather")
        return self._work(lambda a: collectives.all_gather(outs, t, self, a), opts, list(outs))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._work(lambda a: collectives.all_gather_into_tensor(output, input, self, a), opts,
                          [output])

    _allgather_base = all_gather_single  # its older name, which some of torch still calls

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_list: list[torch.Tensor], opts: Any = None) -> Any:
        if _async(opts):  # output_lists[r][i]: rank r's tensor i
            return _settled_by("all_gather_coalesced",
                               collectives.all_gather_coalesced(output_lists, input_list, self, True))
        collectives.all_gather_coalesced(output_lists, input_list, self)
        return _done("all_gather_coalesced", output_lists)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        return self._work(lambda a: coalesced.all_gather_into_tensor_coalesced(outputs, inputs, self, a),
                          opts, list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        out, ins = _one(output_tensors, "reduce_scatter"), _one(input_tensors, "reduce_scatter")
        return self._work(lambda a: collectives.reduce_scatter(out, ins, opts.reduceOp, self, a),
                          opts, [out])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._work(lambda a: collectives.reduce_scatter_tensor(output, input, op, self, a),
                          opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._work(
            lambda a: coalesced.reduce_scatter_tensor_coalesced(outputs, inputs, op, self, a),
            opts, list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Any:
        return self._work(lambda a: collectives.all_to_all(output_tensors, input_tensors, self, a),
                          opts, list(output_tensors))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> Any:
        return self._work(lambda a: collectives.all_to_all_single(
            output, input, output_split_sizes or None, input_split_sizes or None, self, a),
            opts, [output])

    alltoall_base = all_to_all_single

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> Any:
        t = _one(input_tensors, "gather")
        outs = output_tensors[0] if output_tensors else None
        return self._work(lambda a: collectives.gather(t, outs, group=self, async_op=a,
                                                       group_dst=opts.rootRank),
                          opts, list(outs or []))

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> Any:
        t = _one(output_tensors, "scatter")
        ins = input_tensors[0] if input_tensors else None
        return self._work(lambda a: collectives.scatter(t, ins, group=self, async_op=a,
                                                        group_src=opts.rootRank), opts, [t])

    def barrier(self, opts: Any = None) -> Any:
        timeout = getattr(opts, "timeout", _UNSET)
        timeout = timeout if timeout is not None and timeout > datetime.timedelta(0) else None
        return self._work(lambda a: collectives.barrier(self, a, timeout=timeout), opts, [])

    def monitored_barrier(self, timeout: datetime.timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        """dt's monitored barrier: torch's base class would hand it to the gloo wire, past dt."""
        collectives.monitored_barrier(self, timeout, wait_all_ranks)


def create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroup:
    """What torch calls to make a "dt" group (Backend.register_backend's creator)."""
    return ProcessGroup(store, rank, size, timeout)
