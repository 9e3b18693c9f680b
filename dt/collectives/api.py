"""The dispatchers: torch.distributed's collective signatures, dt's algorithms.

Each function here takes exactly the parameters of its torch.distributed
namesake, in the same order with the same defaults (src/dst global ranks,
or group_src/group_dst ranks in the group; any subgroup), then dt's own
keyword-only `algorithm=` to pick how it runs. Like torch it returns None,
or with async_op=True a Work (wait, is_completed, get_future). Complex
tensors travel and reduce as pairs of reals, as torch does; sparse COO
all-reduce goes to dt.collectives.sparse.

The reading path of one `dt.all_reduce`, in the order the code runs (each
step calls only the ones below it; nothing climbs back up):

    all_reduce (here)              resolve_group (dt.transport.group), then plan.planned:
                                   a call shape this group has run before has a CallPlan
    1. the fast path               CallPlan.run (plan.py): validate.check when validation is on,
                                   then the algorithm's prepared run (one_shot.py / two_shot.py
                                   prepare_all_reduce): Board.publish_staged, a copy into
                                   staging, BoardCall.sync -> Sync.sync (dt.transport.shm), one
                                   reduction: done
    2. else the full path, on this rank's thread:
       arguments               check_op, as_real, Writable (arguments.py): what this rank
                               sends and expects, and what is wrong with its arguments
       dispatch -> decide      the group's first call connects it (transport.connect: hosts,
                               wires; agreed.agree: figures across hosts), then
                               auto.choose / registry.lookup: the algorithm
       transport.submit(job)   inline, or on the group's thread in issue order (async_op)
       job                     validate (the signature's exchange), then run(algo): the
                               registered algorithm (e.g. ring.py, one_shot.py; its wrapper,
                               registry.charged, sets its traffic's label) on a contiguous
                               buffer, Writable.copy_back; then plan.make keeps the shape's
                               decisions for the fast path next time

What all of it reads between calls (groups and their links, settings, threads) is the
transport's one state object, dt.transport.STATE (dt/transport/state.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch

from dt import transport
from dt.collectives import agreed, auto, plan, sparse
from dt.collectives.arguments import (
    Writable,
    as_real_all,
    check_list,
    check_op,
    data,
    itemsize,
    root,
    row_splits,
)
from dt.collectives.ops import ReduceOp, as_real
from dt.collectives.registry import lookup
from dt.collectives.validate import validate
from dt.transport import Group, resolve_group

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "shm_empty",
]


def dispatch(
    collective: str,
    g: Group,
    algorithm: str,
    run: Callable[[str], Any],
    *,
    nbytes: int,
    async_op: bool,
    send: list[int],
    recv: list[int],
    dtype: torch.dtype | None = None,
    op: str | None = None,
    root: int | None = None,
    errors: list[str] | None = None,
    device: torch.device | None = None,
    timeout: datetime.timedelta | None = None,
    plan_key: tuple | None = None,
) -> Any:
    """Validate, choose the algorithm, and run `run(algorithm)` in issue order (see the module doc).

    `run` returns what the Work's future carries. Returns the Work when async_op, else None.
    plan_key: (collective, numel, dtype, op, algorithm asked for): once it has run, keep the
    choice (and the fast path) for this call shape (dt.collectives.plan).
    Other collective modules (coalesced) build their calls on this too.
    """
    errors = list(errors or [])
    wire_device = transport.default_device(g)
    if device is not None and device.type != wire_device.type:
        errors.append(f"a {device.type} tensor cannot go over this {g.backend} group, which moves "
                      f"{wire_device.type} tensors" + (" (a meta tensor has no data)"
                                                       if device.type == "meta" else ""))
    local_error = "; ".join(errors) if errors else None
    me = g.ranks[g.rank]
    if local_error and not transport.validation_enabled():
        raise ValueError(f"{collective}: rank {me}: {local_error}")
    algo = decide(collective, g, algorithm, nbytes, device, timeout, local_error)
    check = transport.validation_enabled()

    def job() -> Any:
        """What runs in issue order (on the group's thread when async): the signature's
        exchange, then the algorithm already chosen; nothing in it decides anything."""
        with transport.call_timeout(timeout):
            if check:
                # The signature travels on the group's own device, whatever the caller passed.
                validate(g, collective, algo, dtype=dtype, op=op, root=root, send=send,
                         recv=recv, local_error=local_error, device=wire_device)
            try:
                result = run(algo)  # the registered algorithm, which charges its traffic (registry.charged)
            except transport.CollectiveError:
                raise  # the transport has told the other ranks already
            except Exception as exc:
                plan.failed(me, collective, algo, exc)
                raise
            if plan_key is not None and not local_error:
                plan.make(g, plan_key, collective, algo, numel=plan_key[1], dtype=dtype, op=op,
                          root=root, send=send, recv=recv)
            return result

    work = transport.submit(g, collective, job, async_op)
    return work if async_op else None


def decide(collective: str, g: Group, algorithm: str, nbytes: int, device: torch.device | None,
           timeout: datetime.timedelta | None, local_error: str | None) -> str:
    """Everything a call decides before it is queued: the group connected (its wires found,
    its figures agreed across hosts: once, at its first collective, at the same point on
    every rank), then the algorithm (auto's choice from those figures, or the one named).

    Runs on the caller's thread: a group's first call connects it before any job of it is
    queued, so issue order holds; later calls find it connected (one attribute read).
    """
    if algorithm != "auto" and not local_error:
        lookup(collective, algorithm)  # an unknown name fails here, before any message
    links = g.links
    if links.topology is None or (links.agreed is None and links.topology.host_count > 1):
        with transport.call_timeout(timeout):
            transport.connect(g, collective)
            agreed.agree(g)  # a group spanning hosts: rank 0's figures, once (auto decides from them)
    if local_error:
        return algorithm  # validation reports the error on every rank; nothing runs
    algo = auto.choose(collective, algorithm, nbytes, g, device=device)
    lookup(collective, algo)  # DT_ALGO's or auto's pick exists for this collective
    return algo


# ---------------------------------------------------------------------------


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """Reduce `tensor` across the group, in place, on every rank (sparse COO: dt.collectives.sparse)."""
    g = resolve_group(group)
    key = ("all_reduce", tensor.numel(), tensor.dtype, op, algorithm, tensor.layout)
    ready = plan.planned(g, key) if not async_op else None
    if ready is not None and ready.run(tensor):
        return None
    if tensor.layout == torch.sparse_coo:
        return sparse.all_reduce(tensor, op, g, async_op)
    errors: list[str] = []
    name = check_op(op, tensor.dtype, errors, "all_reduce")
    real = as_real(tensor)
    n = real.numel()
    io = Writable([real])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("all_reduce", algo)(io.buffers[0], name, g)
        io.copy_back()
        return [tensor]

    return dispatch("all_reduce", g, algorithm, run, nbytes=n * itemsize(real), async_op=async_op,
                     send=[n] * g.size, recv=[n] * g.size, dtype=real.dtype, op=name,
                     errors=errors, device=tensor.device, plan_key=key if real is tensor else None)


def reduce(tensor: torch.Tensor, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None, *, algorithm: str = "auto") -> Any:
    """Reduce `tensor` across the group into `dst` (a global rank); others' tensors unchanged."""
    g = resolve_group(group)
    errors: list[str] = []
    name = check_op(op, tensor.dtype, errors, "reduce")
    dst = root(g, dst, group_dst, "dst", errors)
    real = as_real(tensor)
    n, p = real.numel(), g.size
    me = g.ranks[g.rank]
    send = [n if g.ranks[j] == dst else 0 for j in range(p)]
    recv = [n if me == dst else 0 for _ in range(p)]
    io = Writable([real])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("reduce", algo)(io.buffers[0], dst, name, g)
        io.copy_back()
        return [tensor]

    return dispatch("reduce", g, algorithm, run, nbytes=n * itemsize(real), async_op=async_op,
                     send=send, recv=recv, dtype=real.dtype, op=name, root=dst, errors=errors,
                     device=tensor.device)


def broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None,
              async_op: bool = False, group_src: int | None = None, *,
              algorithm: str = "auto") -> Any:
    """Copy `src`'s tensor (src a global rank) into `tensor` on every rank."""
    g = resolve_group(group)
    errors: list[str] = []
    src = root(g, src, group_src, "src", errors)
    real = as_real(tensor)
    n, p = real.numel(), g.size
    me = g.ranks[g.rank]
    send = [n if me == src else 0 for _ in range(p)]
    recv = [n if g.ranks[j] == src else 0 for j in range(p)]
    io = Writable([real])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("broadcast", algo)(io.buffers[0], src, g)
        io.copy_back()
        return [tensor]

    return dispatch("broadcast", g, algorithm, run, nbytes=n * itemsize(real), async_op=async_op,
                     send=send, recv=recv, dtype=real.dtype, root=src, errors=errors,
                     device=tensor.device)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """tensor_list[i] = rank i's `tensor`; entries may differ in length (uneven shards)."""
    g = resolve_group(group)
    tensor = data(tensor)  # the data, whether or not it requires grad
    errors: list[str] = []
    real, outs = as_real(tensor), as_real_all(tensor_list)
    sizes = check_list(outs, g.size, real, "tensor_list", errors)
    if not errors and sizes[g.rank] != real.numel():
        errors.append(f"tensor_list[{g.rank}] has {sizes[g.rank]} elements but this rank's "
                      f"tensor has {real.numel()}")
    io = Writable(list(outs) if not errors else [])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("all_gather", algo)(io.buffers, real, g)
        io.copy_back()
        return list(tensor_list)

    return dispatch("all_gather", g, algorithm, run, nbytes=sum(sizes) * itemsize(real),
                     async_op=async_op, send=[real.numel()] * g.size, recv=sizes,
                     dtype=real.dtype, errors=errors, device=tensor.device)


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: Any = None, async_op: bool = False, *,
                           algorithm: str = "auto") -> Any:
    """output_tensor = every rank's `input_tensor` (equal sizes) concatenated in rank order."""
    g = resolve_group(group)
    input_tensor = data(input_tensor)  # the data, whether or not it requires grad
    errors: list[str] = []
    output, input = as_real(output_tensor), as_real(input_tensor)
    n, p = input.numel(), g.size
    if output.numel() != n * p:
        errors.append(f"output has {output.numel()} elements; it must hold the group's {p} "
                      f"inputs of {n} (= {n * p})")
    if output.dtype != input.dtype:
        errors.append(f"output dtype {output.dtype} differs from input dtype {input.dtype}")
    io = Writable([output])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("all_gather_into_tensor", algo)(io.buffers[0], input.contiguous(), g)
        io.copy_back()
        return [output_tensor]

    return dispatch("all_gather_into_tensor", g, algorithm, run, nbytes=n * p * itemsize(input),
                     async_op=async_op, send=[n] * p, recv=[output.numel() // p] * p,
                     dtype=input.dtype, errors=errors, device=input.device)


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = ReduceOp.SUM,
                   group: Any = None, async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """output on rank r = reduction over ranks of input_list[r] (uneven lists allowed)."""
    g = resolve_group(group)
    input_list = data(input_list)  # the data, whether or not it requires grad
    errors: list[str] = []
    name = check_op(op, output.dtype, errors, "reduce_scatter")
    out, ins = as_real(output), as_real_all(input_list)
    sizes = check_list(ins, g.size, out, "input_list", errors)
    if not errors and sizes[g.rank] != out.numel():
        errors.append(f"output has {out.numel()} elements but input_list[{g.rank}] has "
                      f"{sizes[g.rank]}")
    io = Writable([out])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("reduce_scatter", algo)(io.buffers[0], [t.contiguous() for t in ins], name, g)
        io.copy_back()
        return [output]

    return dispatch("reduce_scatter", g, algorithm, run, nbytes=sum(sizes) * itemsize(out),
                     async_op=async_op, send=sizes, recv=[out.numel()] * g.size,
                     dtype=out.dtype, op=name, errors=errors, device=output.device)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: Any = None, async_op: bool = False, *,
                          algorithm: str = "auto") -> Any:
    """output on rank r = reduction over ranks of the r-th of p equal slices of `input`."""
    g = resolve_group(group)
    input = data(input)  # the data, whether or not it requires grad
    errors: list[str] = []
    name = check_op(op, input.dtype, errors, "reduce_scatter_tensor")
    out, inp = as_real(output), as_real(input)
    n, p = out.numel(), g.size
    if inp.numel() != n * p:
        errors.append(f"input has {inp.numel()} elements; it must be the group's {p} slices "
                      f"of output's {n} (= {n * p})")
    if out.dtype != inp.dtype:
        errors.append(f"output dtype {output.dtype} differs from input dtype {input.dtype}")
    io = Writable([out])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("reduce_scatter_tensor", algo)(io.buffers[0], inp.contiguous(), name, g)
        io.copy_back()
        return [output]

    return dispatch("reduce_scatter_tensor", g, algorithm, run, nbytes=n * p * itemsize(inp),
                     async_op=async_op, send=[inp.numel() // p] * p, recv=[n] * p,
                     dtype=inp.dtype, op=name, errors=errors, device=input.device)


# torch 2.13's new names for the two above (the old names are deprecated there, not here).
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


def all_to_all(output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
               group: Any = None, async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """output_tensor_list[j] on rank r = input_tensor_list[r] of rank j (blocks may differ)."""
    g = resolve_group(group)
    input_tensor_list = data(input_tensor_list)  # the data, whether or not it requires grad
    errors: list[str] = []
    outs, ins = as_real_all(output_tensor_list), as_real_all(input_tensor_list)
    # host: `like` is only checked, never sent
    like = ins[0] if ins and isinstance(ins[0], torch.Tensor) else torch.empty(0)  # host: checked only
    send = check_list(ins, g.size, like, "input_tensor_list", errors)
    recv = check_list(outs, g.size, like, "output_tensor_list", errors)
    io = Writable(list(outs) if not errors else [])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("all_to_all", algo)(io.buffers, [t.contiguous() for t in ins], g)
        io.copy_back()
        return list(output_tensor_list)

    return dispatch("all_to_all", g, algorithm, run, nbytes=sum(send) * itemsize(like),
                     async_op=async_op, send=send, recv=recv, dtype=like.dtype, errors=errors,
                     device=like.device)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """Split `input` by rows, send row block j to rank j, gather blocks into `output`."""
    g = resolve_group(group)
    input = data(input)  # the data, whether or not it requires grad
    errors: list[str] = []
    p = g.size
    out, inp = as_real(output), as_real(input)
    in_rows = row_splits(inp, input_split_sizes, p, "input", errors)
    out_rows = row_splits(out, output_split_sizes, p, "output", errors)
    row_in = inp[0].numel() if inp.dim() and inp.shape[0] else 0
    row_out = out[0].numel() if out.dim() and out.shape[0] else 0
    if inp.dim() and out.dim() and inp.shape[1:] != out.shape[1:]:
        errors.append(f"input rows {tuple(input.shape[1:])} and output rows "
                      f"{tuple(output.shape[1:])} differ in shape")
    io = Writable([out])

    def run(algo: str) -> list[torch.Tensor]:
        outs = list(io.buffers[0].split(out_rows))
        ins = list(inp.contiguous().split(in_rows))
        lookup("all_to_all", algo)(outs, ins, g)
        io.copy_back()
        return [output]

    return dispatch("all_to_all", g, algorithm, run, nbytes=inp.numel() * itemsize(inp),
                     async_op=async_op, send=[r * row_in for r in in_rows],
                     recv=[r * row_out for r in out_rows], dtype=inp.dtype, errors=errors,
                     device=input.device)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None,
           dst: int | None = None, group: Any = None, async_op: bool = False,
           group_dst: int | None = None, *, algorithm: str = "auto") -> Any:
    """On `dst` (default: global rank 0), gather_list[i] = rank i's tensor; others pass no list."""
    g = resolve_group(group)
    tensor = data(tensor)  # the data, whether or not it requires grad
    errors: list[str] = []
    dst = root(g, dst, group_dst, "dst", errors, default=0)
    real, outs = as_real(tensor), as_real_all(gather_list)
    me, p, n = g.ranks[g.rank], g.size, real.numel()
    is_root = me == dst
    sizes = check_list(outs, p, real, "gather_list", errors) if is_root else [0] * p
    send = [n if g.ranks[j] == dst else 0 for j in range(p)]
    io = Writable(list(outs) if is_root and not errors else [])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("gather", algo)(real.contiguous(), io.buffers if is_root else None, dst, g)
        io.copy_back()
        return list(gather_list) if is_root else []

    return dispatch("gather", g, algorithm, run, nbytes=n * p * itemsize(real),
                     async_op=async_op, send=send, recv=sizes, dtype=real.dtype, root=dst,
                     errors=errors, device=tensor.device)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None,
            src: int | None = None, group: Any = None, async_op: bool = False,
            group_src: int | None = None, *, algorithm: str = "auto") -> Any:
    """tensor on rank i = scatter_list[i] of `src` (default: global rank 0); others pass no list."""
    g = resolve_group(group)
    scatter_list = data(scatter_list)  # the data, whether or not it requires grad
    errors: list[str] = []
    src = root(g, src, group_src, "src", errors, default=0)
    real, ins = as_real(tensor), as_real_all(scatter_list)
    me, p, n = g.ranks[g.rank], g.size, real.numel()
    is_root = me == src
    sizes = check_list(ins, p, real, "scatter_list", errors) if is_root else [0] * p
    recv = [n if g.ranks[j] == src else 0 for j in range(p)]
    io = Writable([real])

    def run(algo: str) -> list[torch.Tensor]:
        inputs = [t.contiguous() for t in ins] if is_root and ins else None
        lookup("scatter", algo)(io.buffers[0], inputs, src, g)
        io.copy_back()
        return [tensor]

    return dispatch("scatter", g, algorithm, run, nbytes=n * p * itemsize(real),
                     async_op=async_op, send=sizes, recv=recv, dtype=real.dtype, root=src,
                     errors=errors, device=tensor.device)


def barrier(group: Any = None, async_op: bool = False, device_ids: list[int] | None = None,
            timeout: datetime.timedelta | None = None, *, algorithm: str = "auto") -> Any:
    """Return on no rank before every rank of the group has entered.

    `timeout` bounds this call's waits (as torch's); `device_ids` picks the GPU under NCCL.
    """
    g = resolve_group(group)
    device = transport.default_device(g)
    if device_ids and device.type == "cuda":
        device = torch.device("cuda", device_ids[0])

    def run(algo: str) -> list[torch.Tensor]:
        lookup("barrier", algo)(g)
        return []

    return dispatch("barrier", g, algorithm, run, nbytes=0, async_op=async_op,
                     send=[0] * g.size, recv=[0] * g.size, device=device, timeout=timeout)


def shm_empty(*size: Any, dtype: torch.dtype = torch.float32, group: Any = None) -> torch.Tensor:
    """An uninitialised CPU tensor in the group's shared memory, which the load/store
    algorithms read in place (zero-copy); ordinary memory where the group has none.

    Collective: every rank of the group calls it with the same size, in the same
    order (checked like any collective). dt.transport.shm.alloc says how it works.
    """
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) \
        else tuple(size)
    g = resolve_group(group)
    numel = 1
    for d in shape:
        numel *= d

    def job() -> torch.Tensor:
        transport.connect(g, "shm_empty")
        if transport.validation_enabled():
            validate(g, "shm_empty", "shared", dtype=dtype, op=None, root=None, send=[numel] * g.size,
                     recv=[numel] * g.size, local_error=None, device=transport.default_device(g))
        return transport.allocate(g, shape, dtype)

    return transport.submit(g, "shm_empty", job, async_op=False)
