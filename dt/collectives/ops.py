"""Reduction operators: what "reduce" means for each ReduceOp and dtype.

Matches torch.distributed on gloo: SUM, PRODUCT, MIN, MAX on every dtype dt
supports, AVG on floating types (the sum divided by the group size once, at
the end), and bool reduced as logic (SUM and MAX are OR, PRODUCT and MIN AND).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

SUPPORTED_DTYPES = (
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

OP_NAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")


def op_name(op: object) -> str:
    """'SUM', 'AVG', ... for a torch ReduceOp (or its RedOpType, or a name)."""
    if isinstance(op, str) and op.upper() in OP_NAMES:
        return op.upper()
    for name in OP_NAMES:
        if op == getattr(ReduceOp, name):
            return name
    raise ValueError(f"unsupported reduce op {op!r}: dt supports {', '.join(OP_NAMES)}")


def check_reducible(op: str, dtype: torch.dtype) -> str | None:
    """Why `op` cannot reduce `dtype`, or None if it can."""
    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype} is not supported (supported: {', '.join(map(str, SUPPORTED_DTYPES))})"
    if op == "AVG" and not dtype.is_floating_point:
        return f"ReduceOp.AVG needs a floating dtype, got {dtype} (as in torch.distributed)"
    return None


def combine(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str) -> None:
    """out = a (op) b, elementwise; `out` may alias `a`. AVG combines as SUM."""
    if out.dtype == torch.bool:
        if op in ("SUM", "MAX"):
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
    else:  # pragma: no cover - op_name() rejects anything else first
        raise ValueError(op)


def finish(t: torch.Tensor, op: str, group_size: int) -> None:
    """The one step AVG adds after the sum: divide by the group size."""
    if op == "AVG" and group_size > 1:
        t.div_(group_size)
