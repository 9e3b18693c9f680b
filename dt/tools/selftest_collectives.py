"""`dt selftest`'s first check: every dt collective against torch's, on the same backend.

Every collective of dt's registry is checked with every one of its
algorithms, in each form torch has: the tensor forms (all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single) and the list forms (all_gather,
reduce_scatter, all_to_all), the rooted ones (reduce, broadcast, gather,
scatter) and barrier. A registry collective without a case here is reported
as a failure, so a new one cannot go unchecked.

torch's reference calls are its current names (all_gather_single,
reduce_scatter_single) where the installed torch has them: from 2.13 the older
all_gather_into_tensor and reduce_scatter_tensor warn that they are
deprecated, and before it (2.11, which the first GPU machine had) the new
names do not exist.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CASES", "DTYPES", "SelftestCase", "check_collectives", "rank_device"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}
LATE_S = 0.2  # how late the last rank comes to a checked barrier
TORCH_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
TORCH_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def rank_device() -> torch.device:
    """The device this rank's default group moves tensors on."""
    from dt.transport import default_device, resolve_group

    return default_device(resolve_group(None))


def _data(n: int, dtype: torch.dtype, rank: int, device: torch.device, salt: int = 0) -> torch.Tensor:
    """Per-rank inputs whose sums stay exact in every dtype (small integers; bool alternates)."""
    base = (torch.arange(n, device=device) * (rank + 1) + salt + rank) % 5
    return (base % 2 == 0) if dtype == torch.bool else base.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        return torch.allclose(a.float(), b.float(), rtol=2e-2 if a.dtype == torch.bfloat16 else 1e-5)
    return torch.equal(a, b)


def _cat(tensors: list[torch.Tensor] | None, like: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors]) if tensors else like.flatten()[:0]


@dataclass(frozen=True)
class SelftestCase:
    """One form of a collective: `run(algo, n, dtype, p, r, device)` -> (dt's result, torch's)."""

    collective: str  # its name in dt's registry: the algorithms come from there
    label: str
    run: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    sized: bool = True  # False: no data (barrier), one run per algorithm


def _all_reduce(algo, n, dtype, p, r, device):
    import dt

    a = _data(n, dtype, r, device)
    b = a.clone()
    dt.all_reduce(a, algorithm=algo)
    dist.all_reduce(b)
    return a, b


def _broadcast(algo, n, dtype, p, r, device):
    import dt

    a = _data(n, dtype, r, device)
    b = a.clone()
    dt.broadcast(a, src=p - 1, algorithm=algo)
    dist.broadcast(b, src=p - 1)
    return a, b


def _reduce(algo, n, dtype, p, r, device):
    import dt

    a = _data(n, dtype, r, device)
    b = a.clone()
    dt.reduce(a, dst=p - 1, algorithm=algo)
    dist.reduce(b, dst=p - 1)
    return (a, b) if r == p - 1 else (a[:0], b[:0])  # only the root's result is defined


def _all_gather_into_tensor(algo, n, dtype, p, r, device):
    import dt

    x = _data(n, dtype, r, device)
    a = torch.empty(n * p, dtype=dtype, device=device)
    b = torch.empty_like(a)
    dt.all_gather_into_tensor(a, x, algorithm=algo)
    TORCH_ALL_GATHER(b, x)
    return a, b


def _all_gather_list(algo, n, dtype, p, r, device):
    import dt

    x = _data(n, dtype, r, device)
    a = [torch.empty(n, dtype=dtype, device=device) for _ in range(p)]
    b = [torch.empty_like(t) for t in a]
    dt.all_gather(a, x, algorithm=algo)
    dist.all_gather(b, x)
    return _cat(a, x), _cat(b, x)


def _reduce_scatter_tensor(algo, n, dtype, p, r, device):
    import dt

    x = _data(n * p, dtype, r, device)
    a = torch.empty(n, dtype=dtype, device=device)
    b = torch.empty_like(a)
    dt.reduce_scatter_tensor(a, x, algorithm=algo)
    TORCH_REDUCE_SCATTER(b, x)
    return a, b


def _reduce_scatter_list(algo, n, dtype, p, r, device):
    import dt

    xs = [_data(n, dtype, r, device, salt=i) for i in range(p)]
    a = torch.empty(n, dtype=dtype, device=device)
    b = torch.empty_like(a)
    dt.reduce_scatter(a, xs, algorithm=algo)
    dist.reduce_scatter(b, [x.clone() for x in xs])
    return a, b


def _all_to_all_single(algo, n, dtype, p, r, device):
    import dt

    x = _data(n * p, dtype, r, device)
    a, b = torch.empty_like(x), torch.empty_like(x)
    dt.all_to_all_single(a, x, algorithm=algo)
    dist.all_to_all_single(b, x)
    return a, b


def _all_to_all_list(algo, n, dtype, p, r, device):
    import dt

    xs = [_data(n, dtype, r, device, salt=j) for j in range(p)]
    a = [torch.empty(n, dtype=dtype, device=device) for _ in range(p)]
    b = [torch.empty_like(t) for t in a]
    dt.all_to_all(a, xs, algorithm=algo)
    dist.all_to_all(b, [x.clone() for x in xs])
    return _cat(a, xs[0]), _cat(b, xs[0])


def _gather(algo, n, dtype, p, r, device):
    import dt

    x = _data(n, dtype, r, device)
    root = p - 1
    a = [torch.empty_like(x) for _ in range(p)] if r == root else None
    b = [torch.empty_like(x) for _ in range(p)] if r == root else None
    dt.gather(x, a, dst=root, algorithm=algo)
    dist.gather(x, b, dst=root)
    return _cat(a, x), _cat(b, x)  # off the root: empty, as nothing is defined there


def _scatter(algo, n, dtype, p, r, device):
    import dt

    root = p - 1
    xs = [_data(n, dtype, r, device, salt=i) for i in range(p)] if r == root else None
    a = torch.empty(n, dtype=dtype, device=device)
    b = torch.empty_like(a)
    dt.scatter(a, xs, src=root, algorithm=algo)
    dist.scatter(b, [x.clone() for x in xs] if xs else None, src=root)
    return a, b


def _holds_everyone(enter: Callable[[], Any]) -> bool:
    """Whether no rank leaves `enter()` (a barrier) before the last rank arrives.

    The last rank comes LATE_S late; each rank's arrival and departure, on its
    host's clock, are gathered, and compared among the ranks of the late one's
    host (clocks of other hosts need not agree to the millisecond).
    """
    p, r = dist.get_world_size(), dist.get_rank()
    if r == p - 1:
        time.sleep(LATE_S)
    arrived = time.time()
    enter()
    left = time.time()
    seen: list[Any] = [None] * p
    dist.all_gather_object(seen, (socket.gethostname(), arrived, left))
    host, last_arrival, _ = seen[-1]
    return all(left >= last_arrival for h, _, left in seen if h == host)


def _barrier(algo, n, dtype, p, r, device):
    import dt

    mine = _holds_everyone(lambda: dt.barrier(algorithm=algo))
    theirs = _holds_everyone(dist.barrier)
    return torch.tensor([mine, theirs]), torch.tensor([True, True])


CASES = (
    SelftestCase("all_reduce", "all_reduce", _all_reduce),
    SelftestCase("broadcast", "broadcast", _broadcast),
    SelftestCase("reduce", "reduce", _reduce),
    SelftestCase("all_gather_into_tensor", "all_gather_into_tensor", _all_gather_into_tensor),
    SelftestCase("all_gather", "all_gather (list)", _all_gather_list),
    SelftestCase("reduce_scatter_tensor", "reduce_scatter_tensor", _reduce_scatter_tensor),
    SelftestCase("reduce_scatter", "reduce_scatter (list)", _reduce_scatter_list),
    SelftestCase("all_to_all", "all_to_all_single", _all_to_all_single),
    SelftestCase("all_to_all", "all_to_all (list)", _all_to_all_list),
    SelftestCase("gather", "gather", _gather),
    SelftestCase("scatter", "scatter", _scatter),
    SelftestCase("barrier", "barrier", _barrier, sized=False),
)


def _run_case(case: SelftestCase, algo: str, sizes: tuple[int, ...], p: int, r: int,
              device: torch.device) -> list[str]:
    """What went wrong in every dtype and size of one case and algorithm ([] if nothing)."""
    bad = []
    grid = [(d, n) for d in DTYPES.items() for n in sizes] if case.sized else [(("-", None), 0)]
    for (dname, dtype), n in grid:
        where = f"{dname} n={n}" if case.sized else "the barrier"
        try:
            mine, ref = case.run(algo, n, dtype, p, r, device)
            if not _same(mine, ref):
                bad.append(f"{where}: differs from torch")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            bad.append(f"{where}: {type(exc).__name__}: {str(exc)[:120]}")
    return bad


def check_collectives(sizes: tuple[int, ...]) -> list[tuple[str, bool, str]]:
    """Every collective x form x algorithm x dtype x size, validation on and off."""
    import dt
    from dt.collectives.registry import ALGORITHMS, is_alias

    p, r, device = dist.get_world_size(), dist.get_rank(), rank_device()
    out = [(f"{name}: no selftest case", False, "dt.tools.selftest_collectives.CASES lacks it")
           for name in sorted(set(ALGORITHMS) - {c.collective for c in CASES})]
    for validate in (True, False):
        dt.set_validation(validate)
        for case in CASES:
            for algo in sorted(ALGORITHMS.get(case.collective, {})):
                if is_alias(case.collective, algo):
                    continue
                bad = _run_case(case, algo, sizes, p, r, device)
                out.append((f"{case.label}[{algo}] validation {'on' if validate else 'off'}",
                            not bad, "; ".join(bad[:3])))
    dt.set_validation(True)
    return out
