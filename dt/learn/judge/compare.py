"""Is the learner's result torch's? If not, the first element that differs, and a guess at why.

Integers and bool must match exactly; floating types within their rounding
(the inputs are small integers, so a correct collective is usually exact,
but dividing chunk by chunk for AVG may round differently from torch).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["first_difference"]

# (rtol, atol) per floating dtype, as torch.testing uses them.
TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
             torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def _close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    if got.dtype in TOLERANCE:
        rtol, atol = TOLERANCE[got.dtype]
        return torch.isclose(got, want, rtol=rtol, atol=atol)
    return got == want


def _index(shape: torch.Size, flat: int) -> str:
    if len(shape) <= 1:
        return str(flat)
    idx = []
    for dim in reversed(shape):
        idx.append(flat % dim)
        flat //= dim
    return ", ".join(map(str, reversed(idx)))


def _value(t: torch.Tensor, i: int) -> Any:
    return t.reshape(-1)[i].item()


def first_difference(outputs: list[tuple[str, torch.Tensor]], expected: list[torch.Tensor], *,
                     started: list[torch.Tensor] | None = None, op: str | None = None,
                     group_size: int = 1) -> dict[str, Any] | None:
    """None if every output matches; else where, what was found, what was expected, and a hint.

    `started` holds the outputs' contents before the call (to recognise a
    tensor left unchanged); `op` and `group_size` let the hint recognise a
    sum where AVG was asked for.
    """
    for k, ((name, got), want) in enumerate(zip(outputs, expected)):
        if got is None:
            return {"where": name, "problem": f"{name} is None"}
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            return {"where": name, "problem": f"{name} is {got.dtype} {tuple(got.shape)}, "
                                               f"expected {want.dtype} {tuple(want.shape)}"}
        same = _close(got, want)
        if bool(same.all()):
            continue
        bad = (~same).reshape(-1).nonzero()
        i = int(bad[0])
        got_v, want_v = _value(got, i), _value(want, i)
        hint = _hint(got, want, got_v, want_v, started[k] if started else None, op, group_size)
        return {"where": f"{name}[{_index(got.shape, i)}]", "got": got_v, "expected": want_v,
                "wrong": int(bad.numel()), "of": got.numel(), "hint": hint}
    return None


def _hint(got: torch.Tensor, want: torch.Tensor, got_v: Any, want_v: Any, before: torch.Tensor | None,
          op: str | None, p: int) -> str:
    if op == "AVG" and got.dtype.is_floating_point and bool(_close(got, want * p).all()):
        return f"that is the sum: ReduceOp.AVG divides it by the group size ({p})"
    if before is not None and torch.equal(got, before) and not torch.equal(before, want):
        if got.dtype.is_floating_point and bool(got.isnan().all()):
            return "nothing was written into it: the result goes into the tensors you were given"
        return ("it still holds what it held before the call: write the result into the tensors "
                "you were given, in place (t.copy_(...), not t = ...)")
    if isinstance(got_v, float) and got_v != got_v:
        return "NaN: this element was never written"
    return ""
