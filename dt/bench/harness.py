"""One call of any collective by name, on buffers built for it, and the loop that times it.

Four places time collectives: `dt bench collectives` (nccl-tests' columns), the
scaling study's all-reduce tables, `dt tune`'s algorithm sweep and `dt model
--measured`. They share this file, so a size means the same buffers and a time
the same measurement in all four:

- `BenchCase(collective, count)` builds this rank's buffers for one (collective,
  size) and `case.call(algorithm, inplace)` returns a function that runs one
  call, by any of dt's algorithms or by torch.distributed's own ("torch"),
  out of place or in place;
- `time_calls(calls, reps)` times several such calls interleaved, each after a
  barrier, in an order that rotates every round (on a shared machine a call's
  time depends on what ran just before it, so none keeps one slot);
- `reduction_seconds_per_byte()` measures gamma, the cost model's seconds per
  reduced byte, for `dt tune` and the study alike.

Sizes follow nccl-tests: `count` is the elements of the whole buffer, which for
all-gather, reduce-scatter, all-to-all, gather and scatter is p blocks of
count // p. A barrier moves no data: its count is 0 whatever was asked.

Results are checked as nccl-tests checks them: against the value the inputs
imply (`BenchCase.expected`), computed here from the same pattern, not against
another library's call. `BenchCase.wrong(inplace)` counts the elements that differ
after `BenchCase.prepare_check(inplace)` and one call.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

import dt
from dt.collectives import barrier as dt_barrier
from dt.collectives.registry import ALGORITHMS
from dt.cost.records import FORMS, family
from dt.device import Stopwatch
from dt.transport import default_device, resolve_group
from dt.transport.connect import shm_ready

__all__ = ["CASE_BUFFERS", "COLLECTIVES", "REDUCED", "ROOTED", "TORCH", "BenchCase", "Reduction", "barrier",
           "check_bytes", "group_wires", "pattern", "reduction_seconds_per_byte", "registry_name", "rotated",
           "slope", "time_calls", "wire_group"]

TORCH = "torch"  # the algorithm name that runs torch.distributed's own collective
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
               "gather", "scatter", "barrier")
IN_PLACE_ONLY = ("all_reduce", "broadcast", "reduce")  # torch's APIs for these have no output buffer
BLOCKED = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")  # p blocks of count // p
ROOTED = ("broadcast", "reduce", "gather", "scatter")  # one rank is the root (nccl-tests' -r, default 0)
ROOT_RESULT = ("reduce", "gather")  # only the root's buffer holds a result

K = TypeVar("K", bound=Hashable)


def registry_name(collective: str) -> str:
    """The name dt's registry and `auto` know the timed API by ('all_gather' -> ..._into_tensor):
    the collective's tensor form where algorithms are registered for one (BenchCase times that form)."""
    base = family(collective)
    return next((form for form, of in FORMS.items() if of == base and form in ALGORITHMS), base)


def wire_group(name: str) -> Any:
    """A group of every rank that talks over wire `name` ("shm": shared memory within a host,
    "torch": torch.distributed only), connected: the same processes can time both. One per wire
    for the process's life (shared_group): a study's runs reuse it."""
    from dt import transport

    before = transport.get_transport()
    transport.set_transport("auto" if name == "shm" else "torch")
    try:
        g = transport.shared_group(range(dist.get_world_size()), f"the {name} wire")
        dt_barrier(group=g, algorithm="dissemination")  # its first collective connects it
    finally:
        transport.set_transport(before)
    return g


def group_wires(group: Any = None) -> list[str]:
    """The wires this rank talks to its peers over in `group` (default: the world), as connected.

    What a report names, rather than a guess: a group connects its wires at its
    first collective (dt.transport.connect), so call this after the measured run.
    """
    g = resolve_group(group)
    return sorted({g.wire_for(q).name for q in range(g.size) if q != g.rank})


def _device() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU (also before any group exists)."""
    return default_device(resolve_group(None)) if dist.is_initialized() else torch.device("cpu")


def barrier() -> None:
    """dt's cheapest barrier on the world's wire, named so `auto` (and its tuning) never runs
    while timing: one sync on the board where the world has one, else dissemination's rounds.

    How far apart the ranks leave it is how far apart the timed call starts, and so part of
    that call's time: the board's sync leaves them a few loads apart; dissemination's channel
    messages leave them tens of microseconds apart, as long as a small all-reduce itself takes.
    """
    g = resolve_group(None)
    shm = g.size > 1 and shm_ready(g) and _device().type == "cpu"
    dt_barrier(algorithm="one_shot" if shm else "dissemination")


def pattern(count: int, rank: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank `rank`'s input: (i + 3 rank) mod 5, less 2 where the dtype has negatives.

    Small integers that differ by rank, so a result is checked element by element:
    sums, products, minima and maxima of them are exact in every dtype (an integer
    type's overflow wraps, and wrapping arithmetic gives one answer in any order), and an
    average is one division of an exact sum.
    """
    values = (torch.arange(count, device=device) + 3 * rank) % 5
    return (values - 2 if dtype.is_signed or dtype.is_floating_point else values).to(dtype)


def _reduce(a: torch.Tensor, b: torch.Tensor, op: str) -> torch.Tensor:
    if op in ("SUM", "AVG"):
        return a + b
    if op == "PRODUCT":
        return a * b
    return torch.minimum(a, b) if op == "MIN" else torch.maximum(a, b)


CASE_BUFFERS = 2  # what a BenchCase holds: its input and its output, each at most the size's bytes
REDUCED = ("all_reduce", "reduce", "reduce_scatter")  # `expected` reduces every rank's pattern


def check_bytes(collective: str, nbytes: int, dtype: torch.dtype) -> int:
    """Bytes `BenchCase.expected` and `wrong` hold at once, beside the case's buffers: for a
    reduction the exact accumulator, a rank's pattern cast to it and their reduction (8-byte
    elements, float64 or int64) with the pattern itself; else the expected result and one
    rank's pattern; and the mismatch mask (a byte an element)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    count = max(1, nbytes // itemsize)
    if family(collective) in REDUCED:
        return count * (3 * 8 + itemsize + 1)
    return count * (2 * itemsize + 1)


class BenchCase:
    """This rank's buffers for one (collective, size), and one call of it by any algorithm.

    The input holds a small pattern that differs by rank (`pattern`), so a result is
    checked element by element against the value it implies (`expected`). `root`: the
    rank broadcast, reduce, gather and scatter are rooted at.
    """

    def __init__(self, collective: str, count: int, dtype: torch.dtype = torch.float32,
                 op: str = "SUM", p: int | None = None, r: int | None = None,
                 shared: Any = None, root: int = 0):
        c = family(collective)
        if c not in COLLECTIVES:
            raise ValueError(f"no harness for {collective!r}; one of {COLLECTIVES}")
        self.p = dist.get_world_size() if p is None else p
        self.r = dist.get_rank() if r is None else r
        self.collective, self.dtype, self.op = c, dtype, op.upper()
        if c == "barrier":
            count = 0
        per = max(1, count // self.p) if c in BLOCKED else count
        self.per, self.count = per, per * self.p if c in BLOCKED else count
        self.device = _device()  # the rank's GPU under NCCL, else the CPU
        if not 0 <= root < self.p:
            raise ValueError(f"root {root} is no rank of a world of {self.p}")
        self.root = root
        self.input = pattern(self.count, self.r, dtype, self.device)
        self.output = torch.empty(per if c in ("reduce_scatter", "scatter") else self.count, dtype=dtype,
                                  device=self.device)
        if shared is not None:  # a group: the buffers live in its shared memory (dt.shm_empty)
            self.input = _shared_copy(self.input, shared)
            self.output = _shared_copy(self.output, shared)
        self.redop = getattr(dist.ReduceOp, self.op)

    @property
    def nbytes(self) -> int:
        return self.count * self.input.element_size()

    @property
    def has_result(self) -> bool:
        """Whether this rank's result buffer is defined (reduce and gather fill only the root's)."""
        return self.collective not in ROOT_RESULT or self.r == self.root

    def reset(self) -> None:
        """Put the input back where the in-place calls work (they overwrite it every call)."""
        if self.collective in IN_PLACE_ONLY:
            self.output.copy_(self.input)

    def call(self, algorithm: str, inplace: bool | None = None,
             group: Any = None) -> Callable[[], Any] | None:
        """A function that runs one call; None where the API has no such mode (in-place all-to-all).

        inplace=None: as the API is usually called (in place where it has no output
        buffer, else out of place). Out of place for all_reduce, broadcast and reduce
        copies the input into the output first: what such a call costs through torch's
        in-place API. `group`: the process group dt's call runs on (its wire), default
        the world; torch's always runs on the world.
        """
        c, x, y, r, root = self.collective, self.input, self.output, self.r, self.root
        if inplace is None:
            inplace = c in IN_PLACE_ONLY
        lib: Any = dist if algorithm == TORCH else dt
        kw = {} if algorithm == TORCH else {"algorithm": algorithm, "group": group}
        op = self.redop if algorithm == TORCH else self.op
        if c in IN_PLACE_ONLY:
            def run() -> None:
                if not inplace:
                    y.copy_(x)
                if c == "all_reduce":
                    lib.all_reduce(y, op, **kw)
                elif c == "broadcast":
                    lib.broadcast(y, root, **kw)
                else:
                    lib.reduce(y, root, op, **kw)
            return run
        if c == "all_gather":
            src = y[r * self.per:(r + 1) * self.per] if inplace else x[: self.per]
            if inplace:
                src.copy_(x[: self.per])
            return lambda: lib.all_gather_into_tensor(y, src, **kw)
        if c == "reduce_scatter":
            dst = x[r * self.per:(r + 1) * self.per] if inplace else y
            return lambda: lib.reduce_scatter_tensor(dst, x, op, **kw)
        if c == "barrier":  # no buffers: in place and out of place are the same call
            return None if inplace else lambda: lib.barrier(**kw)
        if inplace:  # all_to_all, gather, scatter: out of place only (torch's APIs)
            return None
        if c == "gather":
            parts = list(y.split(self.per)) if r == root else None
            return lambda: lib.gather(x[: self.per], parts, root, **kw)
        if c == "scatter":
            parts = list(x.split(self.per)) if r == root else None
            return lambda: lib.scatter(y, parts, root, **kw)
        return lambda: lib.all_to_all_single(y, x, **kw)

    def result(self, inplace: bool) -> torch.Tensor:
        """The buffer that holds this rank's result after call(..., inplace)."""
        if self.collective == "reduce_scatter" and inplace:
            return self.input[self.r * self.per:(self.r + 1) * self.per]
        return self.output

    def prepare_check(self, inplace: bool) -> None:
        """The buffers as before a first call: the inputs the pattern, the result buffer poisoned
        (NaN, or an integer the pattern never holds), so a call that leaves an element unwritten
        gets it counted wrong."""
        self.input.copy_(pattern(self.count, self.r, self.dtype, self.device))
        self.output.fill_(math.nan if self.dtype.is_floating_point else 99)
        if self.collective in IN_PLACE_ONLY:
            self.output.copy_(self.input)
        if self.collective == "all_gather" and inplace:  # this rank's block is its input there
            self.output[self.r * self.per:(self.r + 1) * self.per].copy_(self.input[: self.per])

    def expected(self) -> torch.Tensor | None:
        """What this rank's result buffer must hold after one call; None where it holds nothing
        (a barrier, reduce's and gather's other ranks)."""
        c, p, r, per = self.collective, self.p, self.r, self.per
        if c == "barrier" or not self.has_result:
            return None

        def block(rank: int, i: int) -> torch.Tensor:  # a copy: the whole pattern is freed at once
            return pattern(self.count, rank, self.dtype, self.device)[i * per:(i + 1) * per].clone()

        if c == "broadcast":
            return pattern(self.count, self.root, self.dtype, self.device)
        if c == "scatter":
            return block(self.root, r)
        if c in ("all_gather", "gather"):
            return torch.cat([block(q, 0) for q in range(p)])
        if c == "all_to_all":
            return torch.cat([block(q, r) for q in range(p)])
        reduced = self._reduced()  # all_reduce, reduce, reduce_scatter
        return reduced[r * per:(r + 1) * per] if c == "reduce_scatter" else reduced

    def _reduced(self) -> torch.Tensor:
        """Every rank's input reduced by the op: exactly (float64, or int64 that wraps as the
        dtype does when cast), then rounded once to the dtype."""
        exact = torch.float64 if self.dtype.is_floating_point else torch.int64
        acc = pattern(self.count, 0, self.dtype, self.device).to(exact)
        for q in range(1, self.p):
            acc = _reduce(acc, pattern(self.count, q, self.dtype, self.device).to(exact), self.op)
        if self.op == "AVG":
            acc = acc / self.p
        return acc.to(self.dtype)

    def wrong(self, inplace: bool) -> int:
        """Elements of this rank's result that differ from `expected` (after prepare_check and
        one call). An average may round once more than the exact one: within p ulps."""
        want = self.expected()
        if want is None:
            return 0
        got = self.result(inplace)
        if self.op == "AVG" and self.dtype.is_floating_point:
            bad = ~torch.isclose(got, want, rtol=self.p * torch.finfo(self.dtype).eps, atol=0.0)
        else:
            bad = got != want
        return int(bad.sum())


def _shared_copy(t: torch.Tensor, group: Any) -> torch.Tensor:
    out = dt.shm_empty(t.shape, dtype=t.dtype, group=group)
    out.copy_(t)
    return out


def rotated(keys: Sequence[K], round_: int) -> list[K]:
    """keys started at position round_ (mod len): round k's order when calls take turns."""
    k = round_ % len(keys) if keys else 0
    return list(keys[k:]) + list(keys[:k])


def time_calls(calls: dict[K, Callable[[], Any]], reps: int, warmup: int = 1,
               reset: Callable[[], None] | None = None) -> dict[K, list[float]]:
    """Seconds of each call on this rank, `reps` rounds after `warmup` untimed ones.

    Every round runs each call once, in an order rotated by one each round, so
    drifting load hits them alike. Before each call, `reset` (untimed) restores
    the buffers, then a barrier lines the ranks up: a call's time on the slowest
    rank is the collective's time, which the caller takes (max over ranks). On a
    GPU each call is timed with CUDA events (dt.device.Stopwatch): the time the
    device spent, not the time to launch it.
    """
    device = _device()
    keys = list(calls)
    times: dict[K, list[float]] = {k: [] for k in keys}
    for round_ in range(warmup + reps):
        for key in rotated(keys, round_):
            if reset is not None:
                reset()
            barrier()
            watch = Stopwatch(device).start()
            calls[key]()
            elapsed = watch.stop().seconds()
            if round_ >= warmup:
                times[key].append(elapsed)
    return times


def slope(points: dict[int, float]) -> float:
    """Least-squares slope of time over bytes (never negative: noise cannot make bytes free)."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den) if den else 0.0


REDUCE_SIZES = (1 << 20, 4 << 20, 16 << 20)


@dataclass(frozen=True)
class Reduction:
    """gamma (seconds per reduced byte) and the median time of each size it was fitted to."""

    gamma: float
    times: dict[int, float]


def reduction_seconds_per_byte(sizes: Sequence[int] = REDUCE_SIZES, reps: int = 7,
                               sync: bool = True) -> Reduction:
    """gamma: the slope of the time to add one float32 buffer into another, over its bytes.

    What a reduction step of a collective does to each received chunk (a += b),
    on this rank's threads. Every rank measures at once (sync: a barrier before
    each repetition), so on a shared machine gamma includes their contention;
    up to 16 MB, larger than the caches, as the chunks of a big all-reduce are.
    The slope, not time / bytes, so a fixed cost per call is not charged per byte.
    """
    times: dict[int, float] = {}
    device = _device()
    for nbytes in sizes:
        a = torch.ones(nbytes // 4, device=device)
        b = torch.ones(nbytes // 4, device=device)
        torch.add(a, b, out=a)  # warm-up: first touch of the pages
        samples = []
        for _ in range(reps):
            if sync:
                barrier()
            watch = Stopwatch(device).start()
            torch.add(a, b, out=a)
            samples.append(watch.stop().seconds())
        times[nbytes] = statistics.median(samples)
    gamma = slope(times) if len(times) > 1 else times[sizes[0]] / sizes[0]
    return Reduction(gamma, times)
