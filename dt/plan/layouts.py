"""Every layout of a model on a world that `dt train` accepts, and the grammar of a layout's name.

The sizes dp x cp x tp x pp multiply to the world (ep divides dp x cp), and each mesh is
crossed with a ZeRO stage (0-3), a schedule (1f1b; with pp > 1 also gpipe and Megatron's
interleaved 1F1B with 2, 3 or 4 chunks per stage), a micro-batch count (gradient accumulation at pp 1 too: see
micro_batch_counts), ring or Ulysses attention when cp > 1, sequence parallel when tp > 1,
activation recompute (none, selective, full; as asked), and tp inside or across hosts
when there are hosts. What runs is decided by dt.train.layouts.layout_error, dt train's
own rule: the planner never invents a layout dt train would refuse.

A layout's name (NAME_GRAMMAR) is the key of `dt plan --explain` and the rows of its table:

    dp2.tp2.pp2.z1.1f1b.m8              dp 2, tp 2, pp 2, ZeRO 1, 1F1B over 8 micro-batches
    dp4.tp1.pp1.z0.1f1b.m4.rc           gradient accumulation of 4, full recompute
    dp1.tp4.pp2.cp2ulysses.z0.interleaved.m8.v2.sp.rcsel
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from dt.plan.model import ModelShape
from dt.train.layouts import layout_error

CLIP = 1.0  # the --clip dt plan --check runs with: its cost does not depend on the value

__all__ = ["CLIP", "NAME_GRAMMAR", "RECOMPUTE", "Layout", "divisors", "enumerate_layouts", "grid",
           "micro_batch_counts", "parse_name", "train_args"]

RECOMPUTE = ("none", "selective", "full")  # dt train --recompute's choices
NAME_GRAMMAR = ("dp<D>.tp<T>.pp<P>[.cp<C>ring|.cp<C>ulysses][.ep<E>].z<0-3>.<1f1b|gpipe|interleaved>.m<M>"
                "[.v<V>][.sp][.across][.rc|.rcsel][.clip]")


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
    micro_batches: int = 1  # per pipeline, per step: gradient accumulation's count at pp 1
    cp_attention: str = "ring"
    tp_across: bool = False
    recompute: str = "none"  # RECOMPUTE: none, selective (attention's core) or full (every block)
    sequence_parallel: bool = False  # tp's norms and residual stream split over tp's ranks too
    clip: bool = False  # --clip: the global norm's all-reduce and pass (a user's choice, not searched)

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def name(self) -> str:
        """NAME_GRAMMAR: dp2.tp1.pp2.z0.1f1b.m4, with the optional parts where they apply."""
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}{self.cp_attention}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        parts += [f"z{self.zero}", self.schedule, f"m{self.micro_batches}"]
        if self.virtual > 1:
            parts.append(f"v{self.virtual}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.tp_across:
            parts.append("across")
        if self.recompute != "none":
            parts.append({"full": "rc", "selective": "rcsel"}[self.recompute])
        if self.clip:
            parts.append("clip")
        return ".".join(parts)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


_NAME = re.compile(r"dp(?P<dp>\d+)\.tp(?P<tp>\d+)\.pp(?P<pp>\d+)"
                   r"(?:\.cp(?P<cp>\d+)(?P<cp_attention>ring|ulysses))?(?:\.ep(?P<ep>\d+))?"
                   r"\.z(?P<zero>[0-3])\.(?P<schedule>1f1b|gpipe|interleaved)\.m(?P<micro_batches>\d+)"
                   r"(?:\.v(?P<virtual>\d+))?(?P<sp>\.sp)?(?P<across>\.across)?(?P<rc>\.rcsel|\.rc)?(?P<clip>\.clip)?$")


def parse_name(name: str) -> Layout:
    """The layout a name spells (NAME_GRAMMAR); ValueError saying the grammar otherwise."""
    found = _NAME.match(name.strip())
    if not found:
        raise ValueError(f"{name!r} is not a layout name: {NAME_GRAMMAR}")
    fields = found.groupdict()
    whole = {name: int(fields[name]) for name in ("dp", "tp", "pp", "zero", "micro_batches")}
    return Layout(**whole, cp=int(fields["cp"] or 1), ep=int(fields["ep"] or 1), schedule=fields["schedule"],
                  virtual=int(fields["virtual"] or 1), cp_attention=fields["cp_attention"] or "ring",
                  tp_across=bool(fields["across"]), sequence_parallel=bool(fields["sp"]),
                  clip=bool(fields["clip"]),
                  recompute={None: "none", ".rc": "full", ".rcsel": "selective"}[fields["rc"]])


def divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def train_args(layout: Layout, model: ModelShape, batch: int, seq: int) -> SimpleNamespace:
    """The layout as dt train's options (the names dt.train.layouts reads)."""
    return SimpleNamespace(dp=layout.dp, tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep,
                           zero=layout.zero, schedule=layout.schedule, virtual=layout.virtual,
                           micro_batches=layout.micro_batches, cp_attention=layout.cp_attention,
                           batch_size=batch, block_size=seq, n_layer=model.n_layer, n_head=model.n_head,
                           n_embd=model.n_embd, experts=model.experts, top_k=model.top_k, model=model.family,
                           n_kv_head=model.n_kv_head or None, untied=not model.tied,
                           clip=CLIP if layout.clip else None, recompute=layout.recompute,
                           sequence_parallel=layout.sequence_parallel)


MIN_CP_TOKENS = 512  # past EVERY_CP ranks, cp is enumerated while a rank keeps this many tokens of a sequence
EVERY_CP = 64  # worlds up to this size enumerate every cp dt train runs


def meshes(world: int, experts: int, seq: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(dp, tp, pp, cp, ep) multiplying to the world; on a world of more than EVERY_CP ranks, cp
    while a rank keeps MIN_CP_TOKENS tokens of a sequence, or 2 (shorter shares are latency, not
    arithmetic, and would multiply a big world's grid: dt train runs them, the planner skips them)."""
    cp_limit = world if world <= EVERY_CP else max(2, seq // MIN_CP_TOKENS)
    for tp in divisors(world):
        for pp in divisors(world // tp):
            for cp in (c for c in divisors(world // tp // pp) if c <= cp_limit):
                dp = world // tp // pp // cp
                for ep in divisors(dp * cp) if experts else [1]:
                    yield dp, tp, pp, cp, ep


def micro_batch_counts(pp: int, per_rank: int) -> list[int]:
    """Micro-batches per step for a rank's `per_rank` sequences: every count that makes micro-batches
    of 1, 2, 4, 8, ... sequences (ceil(per_rank / size): the last ones one shorter, as dt train's
    tensor_split cuts them), and pp, 2pp, 4pp, 8pp (the pipeline's fill against its bubble)."""
    sizes = {-(-per_rank // (1 << i)) for i in range(per_rank.bit_length() + 1)}
    return sorted(m for m in sizes | {pp, 2 * pp, 4 * pp, 8 * pp} if 1 <= m <= per_rank)


def grid(world: int, batch: int, hosts: int = 1, experts: int = 0,
         recompute: tuple[str, ...] = ("none",), clip: bool = False, seq: int = 1 << 30) -> Iterator[Layout]:
    """Every combination the planner considers, valid or not (the test checks the rule on all of it)."""
    placements = (False, True) if hosts > 1 else (False,)
    for dp, tp, pp, cp, ep in meshes(world, experts, seq):
        per_rank = max(1, batch // dp)
        piped = [("gpipe", 1)] + [("interleaved", v) for v in (2, 3, 4)] if pp > 1 else []  # v 1 is 1F1B
        choices = itertools.product(
            (0, 1, 2, 3) if dp * cp > 1 else (0,),  # ZeRO shards over dp x cp
            [("1f1b", 1), *piped],
            micro_batch_counts(pp, per_rank),
            ("ring", "ulysses") if cp > 1 else ("ring",),
            placements if tp > 1 else (False,),
            (False, True) if tp > 1 and not experts else (False,),  # sequence parallel
            recompute)
        for zero, (schedule, virtual), micro_batches, attention, across, sequence_parallel, rc in choices:
            yield Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, schedule=schedule, virtual=virtual,
                         micro_batches=micro_batches, cp_attention=attention, tp_across=across, recompute=rc,
                         sequence_parallel=sequence_parallel, clip=clip)


def enumerate_layouts(model: ModelShape, world: int, batch: int, seq: int, hosts: int = 1,
                      recompute: tuple[str, ...] = ("none",), clip: bool = False) -> list[Layout]:
    """The grid's layouts dt train accepts for this model, batch and sequence."""
    return [layout for layout in grid(world, batch, hosts, model.experts, recompute, clip, seq)
            if layout_error(train_args(layout, model, batch, seq)) is None]
