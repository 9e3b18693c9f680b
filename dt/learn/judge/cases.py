"""The shapes that break naive collectives, as the judge runs them.

A naive collective usually works for the one shape its author tried: a
world of 2 or 4, a length that divides evenly, float32, SUM. The judge runs
every case below on every world size it is given (1, 2, 3, 5, 8 by default):

- sizes 0 and 1, fewer elements than ranks (p-1), p+1, the primes 13 and
  1031, and 33 (uneven over 2, 4, 5, 8 ranks alike): a chunk may be empty,
  and chunks differ in length;
- a 2-D tensor, for code that assumes a flat one;
- every reduction op (AVG divides, PRODUCT/MIN/MAX are not sums) and every
  dtype gloo reduces (half, bfloat16, integers, bool);
- uneven lists where the collective takes lists: blocks of different
  lengths, zeros among them, everything on one rank;
- for broadcast, roots other than rank 0;
- a subgroup (ranks 1..p-1, so group rank 0 is global rank 1), for code
  that confuses a rank in the group with a rank in the world.

A `JudgeCase` is independent of the world size; `blocks`, `matrix`, `root` and
`members` turn it into concrete sizes and ranks for a given world.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dt.layout import split_sizes

__all__ = ["DTYPES", "JudgeCase", "blocks", "cases_for", "matrix", "members", "root", "torch_dtype"]

DTYPES = ("float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")
OPS = ("AVG", "PRODUCT", "MIN", "MAX")


@dataclass(frozen=True)
class JudgeCase:
    """One input shape. `name` labels it the same way on every world (a row of the report)."""

    name: str
    n: int = 0  # elements: the tensor's, or all blocks' together (-1 stands for p-1, -2 for p+1)
    dtype: str = "float32"
    op: str = "SUM"
    layout: str = "even"  # list collectives: even | uneven | one (everything on the last rank)
    root: str = "first"  # broadcast: first | middle | last group rank
    shape: tuple[int, ...] | None = None  # a multi-dimensional tensor of n elements
    subgroup: bool = False  # run on ranks 1..p-1 only
    params: tuple[tuple[int, ...], ...] = ()  # sync_gradients: parameter shapes
    frozen: tuple[int, ...] = ()  # sync_gradients: parameters without a gradient
    bucket_bytes: int = 0

    def size(self, p: int) -> int:
        """n for a world of p ranks (the "p-1" and "p+1" rows depend on it)."""
        return self.n if self.n >= 0 else {-1: max(p - 1, 0), -2: p + 1}[self.n]

    def detail(self, world: int) -> str:
        p = len(members(self, world))
        parts = [f"n={self.size(p)}"]
        if self.shape:
            parts[0] = "x".join(map(str, self.shape))
        if self.layout == "uneven":
            parts[0] = "uneven blocks, zeros among them"
        if self.layout == "one":
            parts[0] = f"n={self.size(p)} all on group rank {p - 1}"
        if self.params:
            parts[0] = f"{len(self.params)} params"
        if self.params:
            parts.append(f"buckets of {self.bucket_bytes} B")
        parts += [self.dtype] + ([self.op] if self.op != "SUM" else [])
        if self.root != "first":
            parts.append(f"root {self.root}")
        if self.subgroup:
            parts.append(f"group {members(self, world)}")
        return " ".join(parts)


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def members(case: JudgeCase, world: int) -> list[int]:
    """Global ranks taking part: all of them, or 1..p-1 for the subgroup case."""
    return list(range(1, world)) if case.subgroup else list(range(world))


def blocks(case: JudgeCase, p: int) -> list[int]:
    """Each group rank's block for list collectives (all_gather, reduce_scatter)."""
    n = case.size(p)
    if case.layout == "uneven":
        return [(7 * i + 3) % 6 for i in range(p)]  # 3, 4, 5, 0, 1, 2, ...: zeros among them
    if case.layout == "one":
        return [0] * (p - 1) + [n]
    return split_sizes(n, p)


def matrix(case: JudgeCase, p: int) -> list[list[int]]:
    """all_to_all: matrix[i][j] = elements group rank i sends to group rank j."""
    if case.layout == "uneven":
        return [[(i + 2 * j + 1) % 4 for j in range(p)] for i in range(p)]
    if case.layout == "one":
        return [[case.size(p) if j == p - 1 else 0 for j in range(p)] for _ in range(p)]
    return [split_sizes(case.size(p), p) for _ in range(p)]


def root(case: JudgeCase, p: int) -> int:
    """broadcast: the root's group rank."""
    return {"first": 0, "middle": p // 2, "last": p - 1}[case.root]


def _sizes(extra: tuple[JudgeCase, ...] = ()) -> list[JudgeCase]:
    return [JudgeCase("n=0", 0), JudgeCase("n=1", 1), JudgeCase("n=p-1 (fewer than ranks)", -1),
            JudgeCase("n=p+1", -2), JudgeCase("n=13 (prime)", 13), JudgeCase("n=33", 33),
            JudgeCase("n=1031 (prime)", 1031), *extra]


def _dtypes(n: int = 13) -> list[JudgeCase]:
    return [JudgeCase(name, n, dtype=name) for name in DTYPES]


def cases_for(collective: str, world: int, sizes: list[int] | None = None) -> list[JudgeCase]:
    """The cases `collective` is judged on at `world` ranks (only sizes, float32 SUM, if given)."""
    if collective == "sync_gradients":
        return _gradient_cases(world)
    if sizes is not None:
        return [JudgeCase(f"n={n}", n) for n in sizes]
    out = _sizes()
    if collective in ("all_reduce", "broadcast"):
        out.append(JudgeCase("2-D 3x11", 33, shape=(3, 11)))
    if collective in ("all_reduce", "reduce_scatter"):
        out += [JudgeCase(op, 13, op=op) for op in OPS]
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        out += [JudgeCase("uneven blocks", 0, layout="uneven"),
                JudgeCase("all on one rank", 13, layout="one")]
    if collective == "broadcast":
        out += [JudgeCase("root p//2", 13, root="middle"), JudgeCase("root p-1", 13, root="last")]
    out += _dtypes()
    if world >= 3:
        out.append(JudgeCase("subgroup", 13, subgroup=True, root="last"))
    return _distinct(out, world)


def _gradient_cases(world: int) -> list[JudgeCase]:
    small = ((3,), (4, 5), (7,), (2, 2, 2), (1,), (6,))
    out = [
        JudgeCase("many small gradients", params=small, bucket_bytes=64),
        JudgeCase("a gradient bigger than a bucket", params=((40,), (3,), (50,)), bucket_bytes=64),
        JudgeCase("one bucket holds all", params=small, bucket_bytes=1 << 20),
        JudgeCase("frozen parameters (grad None)", params=small, frozen=(1, 4), bucket_bytes=64),
        JudgeCase("a bucket smaller than one gradient", params=((5,), (9,)), bucket_bytes=4),
    ]
    if world >= 3:
        out.append(JudgeCase("subgroup", params=small, bucket_bytes=64, subgroup=True))
    return out


def _distinct(cases: list[JudgeCase], world: int) -> list[JudgeCase]:
    """Drop a size row that repeats an earlier one at this world (n=p-1 is n=1 at p=2)."""
    seen, out = set(), []
    for c in cases:
        key = (c.size(len(members(c, world))), c.dtype, c.op, c.layout, c.root, c.shape, c.subgroup)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
