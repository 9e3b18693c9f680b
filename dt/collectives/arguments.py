"""A collective's arguments, as each rank sees them: what they mean, and what is wrong with them.

Every dispatcher (api.py, coalesced.py) reads its arguments through these:
roots given either way torch allows (a global rank, or group_src/group_dst
in the group), reduce ops checked against the dtype, complex tensors seen as
pairs of reals, per-rank tensor lists counted, row splits of all_to_all_single
resolved. What is wrong is *noted* in an `errors` list rather than raised, so
the rank still takes part in the cross-rank check (validate.py) and every
rank fails with the same message instead of the others hanging.
"""

from __future__ import annotations

from typing import Any

import torch

from dt.collectives.ops import as_real, check_reducible, op_name
from dt.transport import Group

__all__ = ["Writable", "as_real_all", "check_list", "check_op", "data", "itemsize", "root", "row_splits"]


def _check_root(g: Group, root: Any, what: str, errors: list[str]) -> int:
    if not isinstance(root, int) or root not in g.ranks:
        errors.append(f"{what}={root} is not a rank of the group {list(g.ranks)} "
                      "(src/dst are global ranks, as in torch.distributed)")
        return -1
    return root


def root(g: Group, rank: int | None, group_rank: int | None, what: str, errors: list[str],
         default: int | None = None) -> int:
    """The root as a global rank, from torch's pair (src, group_src): at most one may be given.

    Neither given: `default` (torch's global rank 0 for gather/scatter), else an error.
    """
    if rank is not None and group_rank is not None:
        errors.append(f"Can't specify both {what}={rank} and group_{what}={group_rank}")
        return -1
    if group_rank is not None:
        if not isinstance(group_rank, int) or not 0 <= group_rank < g.size:
            errors.append(f"group_{what}={group_rank} is not a rank of a group of {g.size}")
            return -1
        return g.ranks[group_rank]
    if rank is None:
        if default is None:
            errors.append(f"Must specify {what} or group_{what}")
            return -1
        rank = default
    return _check_root(g, rank, what, errors)


def check_op(op: Any, dtype: torch.dtype, errors: list[str], collective: str) -> str:
    """The op's name ("SUM", ...), noting why `collective` cannot reduce `dtype` with it."""
    try:
        name = op_name(op)
    except ValueError as exc:
        errors.append(str(exc))
        return "SUM"
    why = check_reducible(name, dtype, collective)
    if why:
        errors.append(why)
    return name


def as_real_all(tensors: Any) -> Any:
    """Complex tensors (alone or in a list) as views of pairs of reals; anything else unchanged."""
    if isinstance(tensors, torch.Tensor):
        return as_real(tensors)
    if isinstance(tensors, (list, tuple)):
        return [as_real(t) if isinstance(t, torch.Tensor) else t for t in tensors]
    return tensors


def check_list(tensors: Any, p: int, like: torch.Tensor, what: str, errors: list[str]) -> list[int]:
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


def data(x: Any) -> Any:
    """The data of a tensor (or of each tensor in a list), whether or not it requires grad.

    A collective moves data, as torch's do: it is not an autograd operation,
    and writing into a leaf that requires grad must not fail on one rank only.
    """
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return [t.detach() if isinstance(t, torch.Tensor) else t for t in x]
    return x


class Writable:
    """A contiguous stand-in for a caller's tensor, copied back after the call."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.callers = data(list(tensors))
        self.buffers = [t if t.is_contiguous() else t.contiguous() for t in self.callers]

    def copy_back(self) -> None:
        for t, b in zip(self.callers, self.buffers):
            if b is not t:
                t.copy_(b)


def itemsize(t: torch.Tensor) -> int:
    return t.element_size()


def row_splits(t: torch.Tensor, splits: list[int] | None, p: int, what: str,
                errors: list[str]) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    if splits is None or len(splits) == 0:  # torch: None or [] both mean equal splits
        if rows % p:
            errors.append(f"{what} has {rows} rows, which do not split evenly over {p} ranks; "
                          "pass split sizes")
        return [rows // p] * p
    splits = list(splits)
    if len(splits) != p or sum(splits) != rows or any(s < 0 for s in splits):
        errors.append(f"{what} split sizes {splits} must be {p} non-negative numbers summing "
                      f"to its {rows} rows")
        return ([max(0, s) for s in splits] + [0] * p)[:p]
    return splits
