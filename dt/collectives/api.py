"""The dispatchers: torch.distributed's collective signatures, dt's algorithms.

Each function here mirrors its torch.distributed namesake (same arguments,
same in-place semantics, src/dst as global ranks, any subgroup), adds
`algorithm=` to pick how it runs, and returns a Work when async_op=True.
Each call goes through `_launch`, which in one place

1. works out what this rank will send to and expects from every other rank,
   and whether its arguments are valid;
2. picks the algorithm ("auto" asks dt.collectives.auto);
3. checks the signature against every other rank's (dt.collectives.validate),
   so bad input fails on every rank with the same message;
4. runs the algorithm on a contiguous buffer and copies the result back into
   the caller's tensor if that one was not contiguous;
5. does all of it on the group's communication thread when async_op=True.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dt import transport
from dt.collectives import auto
from dt.collectives.ops import ReduceOp, check_reducible, op_name
from dt.collectives.registry import lookup
from dt.collectives.validate import validate
from dt.transport import Group, resolve_group

__all__ = [
    "all_gather",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
]


def _launch(
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
) -> Any:
    errors = list(errors or [])
    wire_device = transport.default_device(g)
    if device is not None and device.type != wire_device.type:
        errors.append(f"a {device.type} tensor cannot go over this {g.backend} group, which moves "
                      f"{wire_device.type} tensors" + (" (a meta tensor has no data)"
                                                       if device.type == "meta" else ""))
    local_error = "; ".join(errors) if errors else None
    algo = auto.choose(collective, algorithm, nbytes, g.size) if not local_error else algorithm
    if not local_error:
        lookup(collective, algo)  # unknown names fail here, before any message
    me = g.ranks[g.rank]

    def job() -> Any:
        if transport.validation_enabled():
            # The signature travels on the group's own device, whatever the caller passed.
            validate(g, collective, algo, dtype=dtype, op=op, root=root, send=send,
                     recv=recv, local_error=local_error, device=wire_device)
        with transport.charged_to(collective, algo):
            try:
                return run(algo)
            except transport.CollectiveError:
                raise  # the transport has told the other ranks already
            except Exception as exc:
                # This rank leaves the collective half done: say so, or its peers wait it out.
                transport.liveness.announce(transport.liveness.Failure(
                    me, "raised", f"rank {me} raised {type(exc).__name__} inside "
                    f"{collective}[{algo}]: {str(exc).splitlines()[0] if str(exc) else ''}"))
                raise

    if local_error and not transport.validation_enabled():
        raise ValueError(f"{collective}: rank {me}: {local_error}")
    return transport.submit(g, collective, job, async_op)


def _check_root(g: Group, root: int, what: str, errors: list[str]) -> int:
    if not isinstance(root, int) or root not in g.ranks:
        errors.append(f"{what}={root} is not a rank of the group {list(g.ranks)} "
                      "(src/dst are global ranks, as in torch.distributed)")
        return -1
    return root


def _check_op(op: Any, dtype: torch.dtype, errors: list[str]) -> str:
    try:
        name = op_name(op)
    except ValueError as exc:
        errors.append(str(exc))
        return "SUM"
    why = check_reducible(name, dtype)
    if why:
        errors.append(why)
    return name


def _check_list(tensors: Any, p: int, like: torch.Tensor, what: str, errors: list[str]) -> list[int]:
    """Element counts of a per-rank tensor list, noting what is wrong with it."""
    if tensors is None or not isinstance(tensors, (list, tuple)):
        errors.append(f"{what} must be a list of {p} tensors, got {type(tensors).__name__}")
        return [0] * p
    if len(tensors) != p:
        errors.append(f"{what} has {len(tensors)} tensors but the group has {p} ranks")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            errors.append(f"{what}[{i}] is a {type(t).__name__}, not a tensor")
            return [0] * p
        if t.dtype != like.dtype:
            errors.append(f"{what}[{i}] has dtype {t.dtype} but the input has {like.dtype}")
        if t.device != like.device:
            errors.append(f"{what}[{i}] is on {t.device} but the input is on {like.device}")
    sizes = [t.numel() for t in tensors[:p]]
    return sizes + [0] * (p - len(sizes))


def _data(x: Any) -> Any:
    """The data of a tensor (or of each tensor in a list), whether or not it requires grad.

    A collective moves data, as torch's do: it is not an autograd operation,
    and writing into a leaf that requires grad must not fail on one rank only.
    """
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return [t.detach() if isinstance(t, torch.Tensor) else t for t in x]
    return x


class _Writable:
    """A contiguous stand-in for a caller's tensor, copied back after the call."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.callers = _data(list(tensors))
        self.buffers = [t if t.is_contiguous() else t.contiguous() for t in self.callers]

    def copy_back(self) -> None:
        for t, b in zip(self.callers, self.buffers):
            if b is not t:
                t.copy_(b)


def _itemsize(t: torch.Tensor) -> int:
    return t.element_size()


# ---------------------------------------------------------------------------


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, *,
               algorithm: str = "auto", async_op: bool = False) -> Any:
    """Reduce `tensor` across the group, in place, on every rank."""
    g = resolve_group(group)
    errors: list[str] = []
    name = _check_op(op, tensor.dtype, errors)
    n = tensor.numel()
    io = _Writable([tensor])

    def run(algo: str) -> None:
        lookup("all_reduce", algo)(io.buffers[0], name, g)
        io.copy_back()

    return _launch("all_reduce", g, algorithm, run, nbytes=n * _itemsize(tensor), async_op=async_op,
                   send=[n] * g.size, recv=[n] * g.size, dtype=tensor.dtype, op=name,
                   errors=errors, device=tensor.device)


def reduce(tensor: torch.Tensor, dst: int, op: Any = ReduceOp.SUM, group: Any = None, *,
           algorithm: str = "auto", async_op: bool = False) -> Any:
    """Reduce `tensor` across the group into `dst` (a global rank); others' tensors unchanged."""
    g = resolve_group(group)
    errors: list[str] = []
    name = _check_op(op, tensor.dtype, errors)
    dst = _check_root(g, dst, "dst", errors)
    n, p = tensor.numel(), g.size
    me = g.ranks[g.rank]
    send = [n if g.ranks[j] == dst else 0 for j in range(p)]
    recv = [n if me == dst else 0 for _ in range(p)]
    io = _Writable([tensor])

    def run(algo: str) -> None:
        lookup("reduce", algo)(io.buffers[0], dst, name, g)
        io.copy_back()

    return _launch("reduce", g, algorithm, run, nbytes=n * _itemsize(tensor), async_op=async_op,
                   send=send, recv=recv, dtype=tensor.dtype, op=name, root=dst, errors=errors,
                   device=tensor.device)


def broadcast(tensor: torch.Tensor, src: int, group: Any = None, *, algorithm: str = "auto",
              async_op: bool = False) -> Any:
    """Copy `src`'s tensor (src a global rank) into `tensor` on every rank."""
    g = resolve_group(group)
    errors: list[str] = []
    src = _check_root(g, src, "src", errors)
    n, p = tensor.numel(), g.size
    me = g.ranks[g.rank]
    send = [n if me == src else 0 for _ in range(p)]
    recv = [n if g.ranks[j] == src else 0 for j in range(p)]
    io = _Writable([tensor])

    def run(algo: str) -> None:
        lookup("broadcast", algo)(io.buffers[0], src, g)
        io.copy_back()

    return _launch("broadcast", g, algorithm, run, nbytes=n * _itemsize(tensor), async_op=async_op,
                   send=send, recv=recv, dtype=tensor.dtype, root=src, errors=errors,
                   device=tensor.device)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, *,
               algorithm: str = "auto", async_op: bool = False) -> Any:
    """tensor_list[i] = rank i's `tensor`; entries may differ in length (uneven shards)."""
    g = resolve_group(group)
    tensor = _data(tensor)
    errors: list[str] = []
    sizes = _check_list(tensor_list, g.size, tensor, "tensor_list", errors)
    if not errors and sizes[g.rank] != tensor.numel():
        errors.append(f"tensor_list[{g.rank}] has {sizes[g.rank]} elements but this rank's "
                      f"tensor has {tensor.numel()}")
    io = _Writable(list(tensor_list) if not errors else [])

    def run(algo: str) -> None:
        lookup("all_gather", algo)(io.buffers, tensor, g)
        io.copy_back()

    return _launch("all_gather", g, algorithm, run, nbytes=sum(sizes) * _itemsize(tensor),
                   async_op=async_op, send=[tensor.numel()] * g.size, recv=sizes,
                   dtype=tensor.dtype, errors=errors, device=tensor.device)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group: Any = None, *,
                           algorithm: str = "auto", async_op: bool = False) -> Any:
    """output = every rank's `input` (equal sizes) concatenated in rank order."""
    g = resolve_group(group)
    input = _data(input)
    errors: list[str] = []
    n, p = input.numel(), g.size
    if output.numel() != n * p:
        errors.append(f"output has {output.numel()} elements; it must hold the group's {p} "
                      f"inputs of {n} (= {n * p})")
    if output.dtype != input.dtype:
        errors.append(f"output dtype {output.dtype} differs from input dtype {input.dtype}")
    io = _Writable([output])

    def run(algo: str) -> None:
        lookup("all_gather_into_tensor", algo)(io.buffers[0], input.contiguous(), g)
        io.copy_back()

    return _launch("all_gather_into_tensor", g, algorithm, run, nbytes=n * p * _itemsize(input),
                   async_op=async_op, send=[n] * p, recv=[output.numel() // p] * p,
                   dtype=input.dtype, errors=errors, device=input.device)


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = ReduceOp.SUM,
                   group: Any = None, *, algorithm: str = "auto", async_op: bool = False) -> Any:
    """output on rank r = reduction over ranks of input_list[r] (uneven lists allowed)."""
    g = resolve_group(group)
    input_list = _data(input_list)
    errors: list[str] = []
    name = _check_op(op, output.dtype, errors)
    sizes = _check_list(input_list, g.size, output, "input_list", errors)
    if not errors and sizes[g.rank] != output.numel():
        errors.append(f"output has {output.numel()} elements but input_list[{g.rank}] has "
                      f"{sizes[g.rank]}")
    io = _Writable([output])

    def run(algo: str) -> None:
        lookup("reduce_scatter", algo)(io.buffers[0], [t.contiguous() for t in input_list], name, g)
        io.copy_back()

    return _launch("reduce_scatter", g, algorithm, run, nbytes=sum(sizes) * _itemsize(output),
                   async_op=async_op, send=sizes, recv=[output.numel()] * g.size,
                   dtype=output.dtype, op=name, errors=errors, device=output.device)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: Any = None, *, algorithm: str = "auto",
                          async_op: bool = False) -> Any:
    """output on rank r = reduction over ranks of the r-th of p equal slices of `input`."""
    g = resolve_group(group)
    input = _data(input)
    errors: list[str] = []
    name = _check_op(op, input.dtype, errors)
    n, p = output.numel(), g.size
    if input.numel() != n * p:
        errors.append(f"input has {input.numel()} elements; it must be the group's {p} slices "
                      f"of output's {n} (= {n * p})")
    if output.dtype != input.dtype:
        errors.append(f"output dtype {output.dtype} differs from input dtype {input.dtype}")
    io = _Writable([output])

    def run(algo: str) -> None:
        lookup("reduce_scatter_tensor", algo)(io.buffers[0], input.contiguous(), name, g)
        io.copy_back()

    return _launch("reduce_scatter_tensor", g, algorithm, run, nbytes=n * p * _itemsize(input),
                   async_op=async_op, send=[input.numel() // p] * p, recv=[n] * p,
                   dtype=input.dtype, op=name, errors=errors, device=input.device)


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor], group: Any = None,
               *, algorithm: str = "auto", async_op: bool = False) -> Any:
    """output_list[j] on rank r = input_list[r] of rank j (blocks may differ in length)."""
    g = resolve_group(group)
    input_list = _data(input_list)
    errors: list[str] = []
    like = input_list[0] if input_list else torch.empty(0)
    send = _check_list(input_list, g.size, like, "input_list", errors)
    recv = _check_list(output_list, g.size, like, "output_list", errors)
    io = _Writable(list(output_list) if not errors else [])

    def run(algo: str) -> None:
        lookup("all_to_all", algo)(io.buffers, [t.contiguous() for t in input_list], g)
        io.copy_back()

    return _launch("all_to_all", g, algorithm, run, nbytes=sum(send) * _itemsize(like),
                   async_op=async_op, send=send, recv=recv, dtype=like.dtype, errors=errors,
                   device=like.device)


def _row_splits(t: torch.Tensor, splits: list[int] | None, p: int, what: str,
                errors: list[str]) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    if splits is None:
        if rows % p:
            errors.append(f"{what} has {rows} rows, which do not split evenly over {p} ranks; "
                          "pass split sizes")
            return [rows // p] * p
        return [rows // p] * p
    splits = list(splits)
    if len(splits) != p or sum(splits) != rows or any(s < 0 for s in splits):
        errors.append(f"{what} split sizes {splits} must be {p} non-negative numbers summing "
                      f"to its {rows} rows")
        return ([max(0, s) for s in splits] + [0] * p)[:p]
    return splits


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None, *,
                      algorithm: str = "auto", async_op: bool = False) -> Any:
    """Split `input` by rows, send row block j to rank j, gather blocks into `output`."""
    g = resolve_group(group)
    input = _data(input)
    errors: list[str] = []
    p = g.size
    in_rows = _row_splits(input, input_split_sizes, p, "input", errors)
    out_rows = _row_splits(output, output_split_sizes, p, "output", errors)
    row_in = input[0].numel() if input.dim() and input.shape[0] else 0
    row_out = output[0].numel() if output.dim() and output.shape[0] else 0
    if input.dim() and output.dim() and input.shape[1:] != output.shape[1:]:
        errors.append(f"input rows {tuple(input.shape[1:])} and output rows "
                      f"{tuple(output.shape[1:])} differ in shape")
    io = _Writable([output])

    def run(algo: str) -> None:
        outs = list(io.buffers[0].split(out_rows))
        ins = list(input.contiguous().split(in_rows))
        lookup("all_to_all", algo)(outs, ins, g)
        io.copy_back()

    return _launch("all_to_all", g, algorithm, run, nbytes=input.numel() * _itemsize(input),
                   async_op=async_op, send=[r * row_in for r in in_rows],
                   recv=[r * row_out for r in out_rows], dtype=input.dtype, errors=errors,
                   device=input.device)


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0,
           group: Any = None, *, algorithm: str = "auto", async_op: bool = False) -> Any:
    """On `dst`, gather_list[i] = rank i's tensor; other ranks pass no list."""
    g = resolve_group(group)
    tensor = _data(tensor)
    errors: list[str] = []
    dst = _check_root(g, dst, "dst", errors)
    me, p, n = g.ranks[g.rank], g.size, tensor.numel()
    is_root = me == dst
    sizes = _check_list(gather_list, p, tensor, "gather_list", errors) if is_root else [0] * p
    send = [n if g.ranks[j] == dst else 0 for j in range(p)]
    io = _Writable(list(gather_list) if is_root and not errors else [])

    def run(algo: str) -> None:
        lookup("gather", algo)(tensor.contiguous(), io.buffers if is_root else None, dst, g)
        io.copy_back()

    return _launch("gather", g, algorithm, run, nbytes=n * p * _itemsize(tensor),
                   async_op=async_op, send=send, recv=sizes, dtype=tensor.dtype, root=dst,
                   errors=errors, device=tensor.device)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int = 0,
            group: Any = None, *, algorithm: str = "auto", async_op: bool = False) -> Any:
    """tensor on rank i = scatter_list[i] of `src`; other ranks pass no list."""
    g = resolve_group(group)
    scatter_list = _data(scatter_list)
    errors: list[str] = []
    src = _check_root(g, src, "src", errors)
    me, p, n = g.ranks[g.rank], g.size, tensor.numel()
    is_root = me == src
    sizes = _check_list(scatter_list, p, tensor, "scatter_list", errors) if is_root else [0] * p
    recv = [n if g.ranks[j] == src else 0 for j in range(p)]
    io = _Writable([tensor])

    def run(algo: str) -> None:
        inputs = [t.contiguous() for t in scatter_list] if is_root and scatter_list else None
        lookup("scatter", algo)(io.buffers[0], inputs, src, g)
        io.copy_back()

    return _launch("scatter", g, algorithm, run, nbytes=n * p * _itemsize(tensor),
                   async_op=async_op, send=sizes, recv=recv, dtype=tensor.dtype, root=src,
                   errors=errors, device=tensor.device)


def barrier(group: Any = None, *, algorithm: str = "auto", async_op: bool = False) -> Any:
    """Return on no rank before every rank of the group has entered."""
    g = resolve_group(group)

    def run(algo: str) -> None:
        lookup("barrier", algo)(g)

    return _launch("barrier", g, algorithm, run, nbytes=0, async_op=async_op,
                   send=[0] * g.size, recv=[0] * g.size, device=transport.default_device(g))
