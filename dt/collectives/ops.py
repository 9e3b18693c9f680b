"""Reduction operators: what "reduce" means for each ReduceOp and dtype.

Matches torch.distributed on gloo (torch 2.13, checked op by op, dtype by
dtype; tests/test_dropin.py holds dt to it):

- SUM, PRODUCT, MIN, MAX on every dtype gloo reduces (REDUCIBLE_DTYPES);
- AVG on floating types: the sum, divided by the group size once, at the end;
- BAND, BOR, BXOR on integers and bool; refused on floats with torch's words;
- bool reduced as logic: SUM and MAX are OR, PRODUCT and MIN are AND;
- complex tensors reduced as pairs of reals (`as_real`), which is right for
  SUM and AVG only; every other op is refused with torch's own message.
  (Moving complex data, as broadcast or all_gather do, needs no op at all.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

REDUCIBLE_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
)

OP_NAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
BITWISE = ("BAND", "BOR", "BXOR")
COMPLEX_OPS = ("SUM", "AVG")  # torch.distributed.supports_complex: the rest mean nothing on pairs


def op_name(op: object) -> str:
    """'SUM', 'AVG', ... for a torch ReduceOp (or its RedOpType, or a name)."""
    if isinstance(op, str) and op.upper() in OP_NAMES:
        return op.upper()
    for name in OP_NAMES:
        if op == getattr(ReduceOp, name):
            return name
    raise ValueError(f"unsupported reduce op {op!r}: dt supports {', '.join(OP_NAMES)}")


def as_real(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its pairs of reals (a view: writes land in `t`); others unchanged."""
    return torch.view_as_real(t) if t.is_complex() else t


def check_reducible(op: str, dtype: torch.dtype, collective: str = "all_reduce") -> str | None:
    """Why `collective` cannot reduce `dtype` with `op`, or None if it can."""
    if dtype.is_complex:
        if op not in COMPLEX_OPS:
            return f"{collective} does not support RedOpType.{op} on complex tensors"
        dtype = torch.empty(0, dtype=dtype).real.dtype  # host: only its dtype is read
    if dtype not in REDUCIBLE_DTYPES:
        return (f"dtype {dtype} is not supported (supported: "
                f"{', '.join(map(str, REDUCIBLE_DTYPES))}, and complex as pairs of reals)")
    if op == "AVG" and not dtype.is_floating_point:
        return f"ReduceOp.AVG needs a floating dtype, got {dtype} (as in torch.distributed)"
    if op in BITWISE and dtype.is_floating_point:
        return f"Cannot use ReduceOp.{op} with non-integral dtype"
    return None


def combine(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str) -> None:
    """out = a (op) b, elementwise; `out` may alias `a`. AVG combines as SUM."""
    if out.dtype == torch.bool and op not in BITWISE:
        if op in ("SUM", "AVG", "MAX"):
            torch.logical_or(a, b, out=out)
        else:
            torch.logical_and(a, b, out=out)
    elif op in ("SUM", "AVG"):
        torch.add(a, b, out=out)
    elif op == "PRODUCT":
        torch.mul(a, b, out=out)
    elif op == "MIN":
        torch.minimum(a, b, out=out)
    elif op == "MAX":
        torch.maximum(a, b, out=out)
    elif op == "BAND":
        torch.bitwise_and(a, b, out=out)
    elif op == "BOR":
        torch.bitwise_or(a, b, out=out)
    elif op == "BXOR":
        torch.bitwise_xor(a, b, out=out)
    else:  # pragma: no cover - op_name() rejects anything else first
        raise ValueError(op)


def finish(t: torch.Tensor, op: str, group_size: int) -> None:
    """The one step AVG adds after the sum: divide by the group size."""
    if op == "AVG" and group_size > 1:
        t.div_(group_size)


def reduce_rows(out: torch.Tensor, rows: torch.Tensor | list[torch.Tensor], op: str) -> None:
    """out = rows[0] (op) rows[1] (op) ... in rank order (AVG: the sum; call `finish` after).

    `rows` is a (p, n) tensor (every rank's buffer as one strided view: one
    kernel reads each row once) or a list of p tensors (combined pairwise).
    `out` may be one of the rows only when `rows` is a list whose first row it is.
    """
    p = len(rows)
    if p == 1:
        if out.data_ptr() != rows[0].data_ptr():
            out.copy_(rows[0])
        return
    if isinstance(rows, torch.Tensor) and p > 2 and op not in BITWISE:
        if op in ("SUM", "AVG"):
            torch.sum(rows, 0, out=out)
        elif op == "PRODUCT":
            torch.prod(rows, 0, out=out)
        elif op == "MAX":
            torch.amax(rows, 0, out=out)
        else:
            torch.amin(rows, 0, out=out)
        return
    combine(out, rows[0], rows[1], op)
    for i in range(2, p):
        combine(out, out, rows[i], op)
