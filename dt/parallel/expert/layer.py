"""The mixture-of-experts feed-forward layer, experts spread over an expert-parallel group.

    moe = ShardedMoE(hidden, ffn_hidden, num_experts=8, top_k=2, capacity_factor=1.25, group=ep_group)
    y = moe(x)               # x, y: [b, s, h]; this rank's tokens
    loss = task_loss + 0.01 * moe.routing.aux_loss

Each expert is an MLP (Linear h -> ffn, GELU, Linear ffn -> h). Every rank
routes its own tokens (dt.parallel.expert.router), sends each kept
assignment to the rank holding its expert, runs its own experts on what it
received, and sends the results back (dt.parallel.expert.dispatch).

Initialisation convention (as dt.parallel.tensor's): built right after
torch.manual_seed(s), the layer holds the router and exactly the experts the
unsharded layer built after the same seed would hold at those indices: every
rank builds all E experts in order and keeps its own.

Gradients: the router is replicated (a dense parameter: average it with the
others over the data-parallel ranks); an expert's gradient already sums the
contributions of every token of the ep group routed to it, so it is summed
only over the ranks that hold the same expert in other ep groups.

Cost per rank and layer: dt.cost.moe_layer_traffic, exactly; with uniform
routing and T tokens per rank, each of the four token all-to-alls (two
forward, two backward) sends T k (ep-1)/ep rows of h numbers
(dt.cost.moe_all_to_all_bytes), plus (E - E/ep) int64 counts forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.layout import SequenceLayout, edges, split_sizes
from dt.parallel.expert.dispatch import RoutingPlan, combine, dispatch
from dt.parallel.expert.router import Routing, ShardedRouter
from dt.transport import resolve_group

__all__ = ["Expert", "MoE", "ShardedMoE"]


class Expert(nn.Module):
    """One expert: Linear(h, ffn), GELU, Linear(ffn, h)."""

    def __init__(self, hidden: int, ffn_hidden: int, *, dtype: torch.dtype | None = None,
                 device: Any = None):
        super().__init__()
        self.fc_in = nn.Linear(hidden, ffn_hidden, dtype=dtype, device=device)
        self.fc_out = nn.Linear(ffn_hidden, hidden, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class ShardedMoE(nn.Module):
    """Top-k mixture of experts over the ranks of `group` (None: the world; size 1: all local)."""

    def __init__(self, hidden: int, ffn_hidden: int, num_experts: int, top_k: int = 1,
                 capacity_factor: float | None = None, group: Any = None, *,
                 dtype: torch.dtype | None = None, device: Any = None):
        super().__init__()
        self.group = resolve_group(group)
        self.num_experts, self.top_k = num_experts, top_k
        self.router = ShardedRouter(hidden, num_experts, top_k, capacity_factor, dtype=dtype, device=device)
        self.held = split_sizes(num_experts, self.group.size)
        e = edges(self.held)
        self.first = e[self.group.rank]
        mine = range(e[self.group.rank], e[self.group.rank + 1])
        built = [Expert(hidden, ffn_hidden, dtype=dtype, device=device) for _ in range(num_experts)]
        self.experts = nn.ModuleList(built[i] for i in mine)
        self.routing: Routing | None = None  # the last forward's, for its aux loss and stats
        self.plan: RoutingPlan | None = None
        self.counted: dict[str, int] = {}  # routing stats summed over every forward

    def forward(self, x: torch.Tensor, sequence_group: Any = None,
                layout: SequenceLayout | None = None) -> torch.Tensor:
        """x [b, s, h] -> [b, s, h]. sequence_group / layout: see ShardedRouter.forward."""
        b, s, h = x.shape
        routing = self.router(x, sequence_group, layout)
        received, plan = dispatch(x.reshape(b * s, h), routing, self.group)
        out = self._run_experts(received, plan)
        y = combine(out, plan, routing, b * s, self.group)
        self.routing, self.plan = routing, plan
        for key, n in routing.stats.items():
            self.counted[key] = self.counted.get(key, 0) + n
        return y.view(b, s, h)

    def _run_experts(self, rows: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
        """Each local expert on its rows; rows arrive grouped by source rank, then by expert."""
        local = len(self.experts)
        if local == 0:
            return rows  # no experts here, so nothing was sent here (rows is empty)
        sources = plan.recv_counts.shape[0]
        expert_ids = torch.arange(local, device=rows.device).repeat(sources)  # [src0: 0..L-1, src1: ...]
        which = torch.repeat_interleave(expert_ids, plan.recv_counts.reshape(-1))
        order = torch.argsort(which, stable=True)  # by expert, sources in rank order
        per_expert = rows[order].split(plan.recv_counts.sum(dim=0).tolist())
        out = torch.cat([expert(part) for expert, part in zip(self.experts, per_expert)])
        return out[torch.argsort(order)]  # back to arrival order

    def extra_repr(self) -> str:
        return (f"experts {self.first}..{self.first + len(self.experts) - 1} of {self.num_experts} "
                f"(held per rank {self.held}), top_k={self.top_k}, "
                f"capacity_factor={self.router.capacity_factor}")


MoE = ShardedMoE  # the older public name, kept importable (README's expert-parallel example uses it)
