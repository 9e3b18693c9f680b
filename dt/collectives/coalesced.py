"""Coalescing: many tensors, one collective.

A step that all-reduces fifty small gradients pays fifty times the latency
term (alpha: ceil(lg p) or 2(p-1) message starts each) for very few bytes.
Coalescing copies the tensors into one flat buffer, runs ONE collective on
it, and copies the results back: the latency is paid once, at the price of
two local copies of the data. (dt's data parallel buckets gradients for the
same reason.)

- all_reduce_coalesced, all_gather_coalesced: torch.distributed's, with its
  signatures; with async_op=True they return a torch.futures.Future, as torch's do;
- all_gather_into_tensor_coalesced, reduce_scatter_tensor_coalesced: the
  coalesced forms torch's ProcessGroup offers (DTensor and FSDP call them);
  dt.ProcessGroup runs them here.

Cost: exactly that of the one collective on the flat buffer (dt.cost.traffic_for
with the summed element count), charged to it in dt.traffic().
"""

from __future__ import annotations

from typing import Any

import torch

from dt.collectives.api import dispatch
from dt.collectives.arguments import check_op
from dt.collectives.ops import ReduceOp, as_real
from dt.collectives.registry import lookup
from dt.transport import resolve_group

__all__ = [
    "all_gather_coalesced",
    "all_gather_into_tensor_coalesced",
    "all_reduce_coalesced",
    "reduce_scatter_tensor_coalesced",
]


def _same_dtype(tensors: list[torch.Tensor], errors: list[str]) -> torch.dtype:
    """The common dtype, noting torch's error when there is none (complex mixes with its reals)."""
    dtypes = [as_real(t).dtype for t in tensors]
    for d in dtypes[1:]:
        if d != dtypes[0]:
            errors.append(f"Invalid usage of tensors with different dtypes Found {dtypes[0]} and {d}")
            break
    complex_ = [t.dtype for t in tensors if t.is_complex()]
    return complex_[0] if complex_ else dtypes[0] if dtypes else torch.float32


def _flatten(tensors: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=dtype, device=device)
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(piece.view_as(t))


def _device(tensors: list[torch.Tensor]) -> torch.device:
    return tensors[0].device if tensors else torch.device("cpu")


def _itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _real_dtype(reals: list[torch.Tensor], dtype: torch.dtype) -> torch.dtype:
    return reals[0].dtype if reals else dtype


def all_reduce_coalesced(tensors: list[torch.Tensor], op: Any = ReduceOp.SUM, group: Any = None,
                         async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """Every tensor of `tensors` all-reduced in place, as one all-reduce of them all."""
    g = resolve_group(group)
    errors: list[str] = []
    dtype = _same_dtype(tensors, errors)
    name = check_op(op, dtype, errors, "all_reduce")
    reals = [as_real(t) for t in tensors]
    real_dtype = _real_dtype(reals, dtype)
    n = sum(t.numel() for t in reals)

    def run(algo: str) -> list[torch.Tensor]:
        flat = _flatten(reals, real_dtype, _device(reals))
        lookup("all_reduce", algo)(flat, name, g)
        _unflatten(flat, reals)
        return list(tensors)

    work = dispatch("all_reduce", g, algorithm, run, nbytes=n * _itemsize(real_dtype),
                    async_op=async_op, send=[n] * g.size, recv=[n] * g.size, dtype=real_dtype,
                    op=name, errors=errors, device=_device(reals))
    return work.get_future() if async_op else None


def all_gather_coalesced(output_tensor_lists: list[list[torch.Tensor]],
                         input_tensor_list: list[torch.Tensor], group: Any = None,
                         async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """output_tensor_lists[r][i] = rank r's input_tensor_list[i], as one all-gather of them all."""
    g = resolve_group(group)
    errors: list[str] = []
    p = g.size
    dtype = _same_dtype(input_tensor_list, errors)
    ins = [as_real(t) for t in input_tensor_list]
    if not isinstance(output_tensor_lists, list) or len(output_tensor_lists) != p:
        errors.append(f"output_tensor_lists must be a list of {p} lists (one per rank)")
        outs: list[list[torch.Tensor]] = [[] for _ in range(p)]
    else:
        outs = [[as_real(t) for t in row] for row in output_tensor_lists]
    for row in outs:
        _same_dtype([*input_tensor_list[:1], *row], errors)
    n = sum(t.numel() for t in ins)
    expects = [sum(t.numel() for t in row) for row in outs]
    real_dtype = _real_dtype(ins, dtype)

    def run(algo: str) -> list[list[torch.Tensor]]:
        gathered = torch.empty(n * p, dtype=real_dtype, device=_device(ins))
        lookup("all_gather_into_tensor", algo)(gathered, _flatten(ins, real_dtype, _device(ins)), g)
        for r, row in enumerate(outs):
            _unflatten(gathered[r * n:(r + 1) * n], row)
        return output_tensor_lists

    work = dispatch("all_gather_into_tensor", g, algorithm, run, nbytes=n * p * _itemsize(real_dtype),
                    async_op=async_op, send=[n] * p, recv=expects, dtype=real_dtype, errors=errors,
                    device=_device(ins))
    return work.get_future() if async_op else None


def all_gather_into_tensor_coalesced(outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                     group: Any = None, async_op: bool = False, *,
                                     algorithm: str = "auto") -> Any:
    """outputs[i] = every rank's inputs[i] concatenated in rank order, as one all-gather."""
    g = resolve_group(group)
    errors: list[str] = []
    p = g.size
    dtype = _same_dtype([*inputs, *outputs], errors)
    ins, outs = [as_real(t) for t in inputs], [as_real(t) for t in outputs]
    real_dtype = _real_dtype(ins, dtype)
    sizes = [t.numel() for t in ins]
    if len(outs) != len(ins) or any(o.numel() != s * p for o, s in zip(outs, sizes)):
        errors.append(f"outputs must be {len(ins)} tensors of {p} x their input's elements")
    n = sum(sizes)

    def run(algo: str) -> list[torch.Tensor]:
        flat_in = _flatten(ins, real_dtype, _device(ins))
        gathered = torch.empty(n * p, dtype=flat_in.dtype, device=flat_in.device).view(p, n)
        lookup("all_gather_into_tensor", algo)(gathered.view(-1), flat_in, g)
        for o, piece in zip(outs, gathered.split(sizes, dim=1)):
            o.copy_(piece.reshape(o.shape))
        return list(outputs)

    return dispatch("all_gather_into_tensor", g, algorithm, run, nbytes=n * p * _itemsize(real_dtype),
                    async_op=async_op, send=[n] * p, recv=[n] * p, dtype=real_dtype, errors=errors,
                    device=_device(ins))


def reduce_scatter_tensor_coalesced(outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    op: Any = ReduceOp.SUM, group: Any = None,
                                    async_op: bool = False, *, algorithm: str = "auto") -> Any:
    """outputs[i] on rank r = the r-th of p slices of inputs[i], reduced over ranks; one collective."""
    g = resolve_group(group)
    errors: list[str] = []
    p = g.size
    dtype = _same_dtype([*inputs, *outputs], errors)
    name = check_op(op, dtype, errors, "reduce_scatter_tensor")
    ins, outs = [as_real(t) for t in inputs], [as_real(t) for t in outputs]
    real_dtype = _real_dtype(outs, dtype)
    sizes = [t.numel() for t in outs]
    if len(outs) != len(ins) or any(i.numel() != s * p for i, s in zip(ins, sizes)):
        errors.append(f"inputs must be {len(outs)} tensors of {p} x their output's elements")
    n = sum(sizes)

    def run(algo: str) -> list[torch.Tensor]:
        # Slice r of every input, side by side, is block r of the flat input.
        blocks = [t.reshape(p, s) for t, s in zip(ins, sizes)]
        flat_in = torch.cat(blocks, dim=1).view(-1) if blocks else \
            torch.empty(0, dtype=real_dtype, device=_device(outs))
        flat_out = torch.empty(n, dtype=real_dtype, device=flat_in.device)
        lookup("reduce_scatter_tensor", algo)(flat_out, flat_in, name, g)
        _unflatten(flat_out, outs)
        return list(outputs)

    return dispatch("reduce_scatter_tensor", g, algorithm, run, nbytes=n * p * _itemsize(real_dtype),
                    async_op=async_op, send=[n] * p, recv=[n] * p, dtype=real_dtype, op=name,
                    errors=errors, device=_device(outs))
