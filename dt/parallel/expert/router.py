"""The router: which experts each token goes to, which assignments fit, and the balance loss.

For tokens x [b, s, h] and E experts (Switch Transformer, GShard):

    probs = softmax(x W^T)                 [b, s, E]
    experts, p = top_k(probs)              k = 1 (Switch) or 2 (GShard)
    gates = p (k = 1), p / sum(p) (k > 1)  the weights the experts' outputs are combined with

Capacity. An expert accepts at most C = ceil(capacity_factor * k * S / E)
assignments from one group of S tokens (dt.layout.expert_capacity). Within a
group, assignments claim places in priority order: every token's first
choice before any second choice, earlier positions first. The rest are
dropped: their gate counts for nothing and the token keeps only the residual
path for that choice. capacity_factor=None never drops (dropless).

Load-balancing loss, per group: E * sum_e f_e * P_e, with f_e the fraction
of the group's k*S assignments routed to e (before drops) and P_e the mean
router probability of e. It is 1 for perfectly even routing and grows as the
router favours a few experts; its gradient (through P) pushes them apart.

Groups are sequences. GShard's groups are whatever each device holds; here
every sequence is a group, so drops and the loss do not depend on how the
batch is split over data-parallel ranks and micro-batches (DeepSeek-V2 calls
this the sequence-wise balance loss). Under context parallelism a sequence is
spread over the cp group: the router then gathers the per-chunk counts of
each (sequence, expert, choice) over that group (one all-gather of
b*E*k*chunks int64) to place its assignments in the sequence's priority
order, and all-reduces the probability sums (b*E numbers, and again in
backward), so the result is exactly that of the whole sequence on one rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.collectives import all_gather
from dt.layout import SequenceLayout, expert_capacity
from dt.parallel.exchange import all_reduce_sum
from dt.transport import Group, charged_to, resolve_group

__all__ = ["LABEL", "ShardedRouter", "Routing", "router_probs"]

LABEL = "moe"  # dt.traffic() charges every byte an MoE layer moves to this name


@dataclass
class Routing:
    """One forward's routing decisions for this rank's tokens [b, s]."""

    probs: torch.Tensor  # [b, s, E] router probabilities
    experts: torch.Tensor  # [b, s, k] chosen experts (int64)
    gates: torch.Tensor  # [b, s, k] combine weights (differentiable)
    keep: torch.Tensor  # [b, s, k] within capacity
    aux_per_sequence: torch.Tensor  # [b] load-balancing loss of each sequence (differentiable)
    capacity: int | None  # per (sequence, expert)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def aux_loss(self) -> torch.Tensor:
        """Mean over this rank's sequences of the load-balancing loss."""
        return self.aux_per_sequence.mean()


def router_probs(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """softmax(x W^T) in the weight's precision, autocast or not: a router in 16 bits would
    pick its top-k from rounded logits (the usual rule, Switch Transformer's: the router in float32)."""
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.to(weight.dtype), weight).softmax(dim=-1)


class ShardedRouter(nn.Module):
    """Top-k gating with capacity and the Switch/GShard load-balancing loss.

    The weight is replicated on every rank (a dense parameter: its gradient is
    averaged with the other dense ones).
    """

    def __init__(self, hidden: int, num_experts: int, top_k: int = 1,
                 capacity_factor: float | None = None, *, dtype: torch.dtype | None = None,
                 device: Any = None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be between 1 and the {num_experts} experts, got {top_k}")
        expert_capacity(capacity_factor, top_k, 1, num_experts)  # rejects a bad factor now
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.weight = nn.Parameter(nn.Linear(hidden, num_experts, bias=False, dtype=dtype,
                                             device=device).weight.detach())

    def forward(self, x: torch.Tensor, group: Any = None,
                layout: SequenceLayout | None = None) -> Routing:
        """Route x [b, s, h]. `group` and `layout`: the context-parallel group this
        rank's tokens are one share of, and how the sequence is spread over it
        (None: this rank holds whole sequences)."""
        g = resolve_group(group) if group is not None else None
        cp = g.size if g is not None else 1
        b, s, _ = x.shape
        if layout is None:
            if cp > 1:
                raise ValueError("a sequence split over a group needs its SequenceLayout")
            layout = SequenceLayout(s, 1, zigzag=False)
        me = g.rank if g is not None else 0
        if layout.parts != cp or layout.size(me) != s:
            raise ValueError(f"rank {me} holds {s} tokens but the layout {layout} gives it "
                             f"{layout.size(me) if me < layout.parts else None} of {layout.parts}")
        E, k, S = self.num_experts, self.top_k, layout.seq_len
        probs = router_probs(x, self.weight)
        top_p, experts = probs.topk(k, dim=-1)
        gates = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)

        # Per-chunk counts of every (sequence, expert, choice), gathered over the group.
        chunks = layout.chunks(me)
        onehot = F.one_hot(experts, E)  # [b, s, k, E]
        counts = torch.zeros(b, E, k, len(chunks), dtype=torch.int64, device=x.device)
        lo = 0
        for c, (a, z) in enumerate(chunks):
            counts[..., c] = onehot[:, lo:lo + z - a].sum(dim=1).transpose(1, 2)
            lo += z - a
        every = _gather(counts, g)  # [cp, b, E, k, chunks]
        capacity = expert_capacity(self.capacity_factor, k, S, E)
        keep = torch.ones_like(experts, dtype=torch.bool)
        if capacity is not None:
            keep = self._within_capacity(onehot, experts, every, chunks, layout, capacity)

        # Load balance per sequence: f from the gathered counts, P all-reduced.
        f = every.sum(dim=(0, 3, 4)).to(probs.dtype) / max(S * k, 1)  # [b, E]
        prob_sum = probs.sum(dim=1)  # [b, E]
        if g is not None:
            prob_sum = all_reduce_sum(prob_sum, g, label=LABEL)
        aux = E * (f * prob_sum / max(S, 1)).sum(dim=-1)
        dropped = int((~keep).sum())
        stats = {"assignments": b * s * k, "dropped": dropped,
                 "tokens_dropped": int((~keep).all(dim=-1).sum())}
        return Routing(probs, experts, gates, keep, aux, capacity, stats)

    @staticmethod
    def _within_capacity(onehot: torch.Tensor, experts: torch.Tensor, every: torch.Tensor,
                         chunks: list[tuple[int, int]], layout: SequenceLayout,
                         capacity: int) -> torch.Tensor:
        """keep[b, t, j]: the assignment's place in its sequence's priority order is < capacity.

        place = (assignments of earlier choices to the same expert, anywhere in
        the sequence) + (same choice, same expert, in chunks that start before
        this one: on any rank) + (same choice, same expert, earlier in this chunk).
        """
        starts = torch.tensor([[a for a, _ in layout.chunks(r)] for r in range(layout.parts)],
                              device=every.device)
        by_chunk = every.permute(0, 4, 1, 2, 3)  # [cp, chunks, b, E, k]
        total = by_chunk.sum(dim=(0, 1))  # [b, E, k]
        earlier_choices = total.cumsum(dim=-1) - total  # [b, E, k]
        place = torch.empty_like(experts)
        lo = 0
        for a, z in chunks:
            before = by_chunk[starts < a].sum(dim=0)  # [b, E, k], chunks that start earlier
            mine = onehot[:, lo:lo + z - a]  # [b, n, k, E]
            within = mine.cumsum(dim=1) - mine  # earlier in this chunk, same choice and expert
            base = (earlier_choices + before).transpose(1, 2).unsqueeze(1)  # [b, 1, k, E]
            place[:, lo:lo + z - a] = ((within + base) * mine).sum(dim=-1)
            lo += z - a
        return place < capacity


def _gather(counts: torch.Tensor, g: Group | None) -> torch.Tensor:
    """Every rank's per-chunk counts, stacked [cp, ...] (one all-gather)."""
    if g is None or g.size == 1:
        return counts.unsqueeze(0)
    parts = [torch.empty_like(counts) for _ in range(g.size)]
    with charged_to(LABEL, "all_gather"):
        all_gather(parts, counts.contiguous(), group=g)
    return torch.stack(parts)

