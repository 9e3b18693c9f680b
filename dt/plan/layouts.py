"""Every layout of a model on a world that `dt train` accepts.

The sizes dp x cp x tp x pp multiply to the world (ep divides dp x cp), and
each is crossed with a ZeRO stage (0-3; 3 on one stage), a schedule (1f1b, gpipe,
interleaved with 1, 2 or 4 chunks), micro-batch counts (1, pp, 2pp, 4pp and
the per-rank batch up to 8pp, as the per-rank batch allows), ring or Ulysses
attention when cp > 1, and tp inside or across hosts when there are hosts.
What runs is decided by dt.train.layouts.layout_error, dt train's own rule:
the planner never invents a layout dt train would refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from dt.plan.model import ModelShape
from dt.train.layouts import layout_error

CLIP = 1.0  # the --clip dt plan --check runs with: its cost does not depend on the value

__all__ = ["CLIP", "Layout", "divisors", "enumerate_layouts", "grid", "train_args"]


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    schedule: str = "1f1b"
    virtual: int = 1
    micro_batches: int = 1
    cp_attention: str = "ring"
    tp_across: bool = False
    recompute: bool = False
    clip: bool = False  # --clip: the global norm's all-reduce and pass (a user's choice, not searched)

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def name(self) -> str:
        """dp2.tp1.pp2.z0.1f1b.m4 (and .v2, .cp2ring, .ep2, .across, .rc when they apply): --explain's key."""
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}{self.cp_attention}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        parts += [f"z{self.zero}", self.schedule, f"m{self.micro_batches}"]
        if self.virtual > 1:
            parts.append(f"v{self.virtual}")
        if self.tp_across:
            parts.append("across")
        if self.recompute:
            parts.append("rc")
        if self.clip:
            parts.append("clip")
        return ".".join(parts)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def train_args(lay: Layout, model: ModelShape, batch: int, seq: int) -> SimpleNamespace:
    """The layout as dt train's options (the names dt.train.layouts reads)."""
    return SimpleNamespace(dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, zero=lay.zero,
                           schedule=lay.schedule, virtual=lay.virtual, micro_batches=lay.micro_batches,
                           cp_attention=lay.cp_attention, batch_size=batch, block_size=seq,
                           n_layer=model.n_layer, n_head=model.n_head, n_embd=model.n_embd,
                           experts=model.experts, top_k=model.top_k, model=model.family,
                           n_kv_head=model.n_kv_head or None, untied=not model.tied,
                           clip=CLIP if lay.clip else None, recompute=lay.recompute)


def _meshes(world: int, experts: int) -> Iterator[tuple[int, int, int, int, int]]:
    for tp in divisors(world):
        for pp in divisors(world // tp):
            for cp in divisors(world // tp // pp):
                dp = world // tp // pp // cp
                for ep in divisors(dp * cp) if experts else [1]:
                    yield dp, tp, pp, cp, ep


def _micro_counts(pp: int, per_rank: int) -> list[int]:
    """1, pp, 2pp, 4pp and the whole per-rank batch when it is no more than 8pp: past that the
    bubble is a few percent and each micro-batch only smaller."""
    return sorted({m for m in (1, pp, 2 * pp, 4 * pp, per_rank if per_rank <= 8 * pp else 1)
                   if 1 <= m <= per_rank})


def grid(world: int, batch: int, hosts: int = 1, experts: int = 0,
         recompute: tuple[bool, ...] = (False,), clip: bool = False) -> Iterator[Layout]:
    """Every combination the planner considers, valid or not (the test checks the rule on all of it)."""
    placements = (False, True) if hosts > 1 else (False,)
    for dp, tp, pp, cp, ep in _meshes(world, experts):
        per_rank = max(1, batch // dp)
        piped = [("gpipe", 1)] + [("interleaved", v) for v in (1, 2, 4)] if pp > 1 else []
        schedules = [("1f1b", 1), *piped]
        for zero in (0, 1, 2, 3) if dp * cp > 1 else (0,):  # ZeRO shards over dp x cp
            for schedule, virtual in schedules:
                for m in _micro_counts(pp, per_rank) if pp > 1 else [1]:
                    for attention in ("ring", "ulysses") if cp > 1 else ("ring",):
                        for across in placements if tp > 1 else (False,):
                            for rc in recompute:
                                yield Layout(dp, tp, pp, cp, ep, zero, schedule, virtual, m, attention,
                                             across, rc, clip)


def enumerate_layouts(model: ModelShape, world: int, batch: int, seq: int, hosts: int = 1,
                      recompute: tuple[bool, ...] = (False,), clip: bool = False) -> list[Layout]:
    """The grid's layouts dt train accepts for this model, batch and sequence."""
    return [lay for lay in grid(world, batch, hosts, model.experts, recompute, clip)
            if layout_error(train_args(lay, model, batch, seq)) is None]
