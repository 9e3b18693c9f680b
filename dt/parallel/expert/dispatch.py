"""The token exchange: each kept assignment to the rank of its expert, and the result back.

Experts are spread over the expert-parallel group by split_sizes(E, ep):
rank q holds experts [e_q, e_q+1), so rows sorted by expert are also sorted
by destination rank, and one all-to-all with uneven splits moves them all.

    dispatch: sort the kept assignments by expert (stable: earlier first),
              exchange the per-expert counts (the receivers must size their
              buffers: an all-to-all of experts[q] int64 to each rank q),
              then send the rows: send_rows[q] x hidden to rank q.
    combine:  the experts' outputs go back along the same splits, reversed,
              and each token sums its k outputs weighted by their gates.

Both token moves are dt.parallel.exchange.all_to_all, whose backward is the
same all-to-all reversed: gradients flow back to the tokens' ranks and into
the gates (hence the router). dt.traffic() counts all of it under "moe".
Cost per rank, exactly: dt.cost.moe_layer_traffic
(send_rows, recv_rows, experts, hidden, itemsize, rank); with uniform
routing and no drops each token all-to-all sends T k (ep-1)/ep rows of
hidden (dt.cost.moe_all_to_all_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dt.collectives import all_to_all as raw_all_to_all
from dt.layout import edges, split_sizes
from dt.parallel import exchange
from dt.parallel.expert.router import LABEL, Routing
from dt.transport import Group, charged_to

__all__ = ["RoutingPlan", "combine", "dispatch"]


@dataclass
class RoutingPlan:
    """Where this rank's kept assignments went and where the rows it received came from."""

    assignment: torch.Tensor  # [A] flat (token * k + choice) of each sent row, in sending order
    token: torch.Tensor  # [A] the row's token (flat index into [b*s])
    send_rows: list[int]  # rows sent to each rank
    recv_rows: list[int]  # rows received from each rank
    recv_counts: torch.Tensor  # [ep, local experts]: rows from rank q for each local expert
    experts: list[int]  # experts held by each rank


def dispatch(x: torch.Tensor, routing: Routing, g: Group) -> tuple[torch.Tensor, RoutingPlan]:
    """Send the kept assignments' rows of x [T, h] to their experts' ranks.

    Returns the rows this rank's experts must process, [R, h] (grouped by
    source rank, then by expert), and the plan to send the results back.
    """
    num_experts, k = routing.probs.shape[-1], routing.experts.shape[-1]
    p, me = g.size, g.rank
    held = split_sizes(num_experts, p)
    e = edges(held)
    flat_expert = routing.experts.reshape(-1)
    kept = routing.keep.reshape(-1).nonzero().squeeze(1)
    assignment = kept[torch.argsort(flat_expert[kept], stable=True)]
    token = torch.div(assignment, k, rounding_mode="floor")
    counts = torch.bincount(flat_expert[assignment], minlength=num_experts)
    send_rows = [int(counts[e[q]:e[q + 1]].sum()) for q in range(p)]
    if p == 1:
        recv_counts = counts.unsqueeze(0)
    else:  # 1. the counts, so every receiver can size its buffer
        recv_list = [counts.new_empty(held[me]) for _ in range(p)]
        with charged_to(LABEL, "all_to_all"):
            raw_all_to_all(recv_list, [counts[e[q]:e[q + 1]].contiguous() for q in range(p)], group=g)
        recv_counts = torch.stack(recv_list)
    recv_rows = [int(n) for n in recv_counts.sum(dim=1)]
    h = x.shape[-1]
    # 2. the rows themselves, uneven splits
    rows = x[token]
    got = exchange.all_to_all(list(rows.split(send_rows)), [(n, h) for n in recv_rows], g, LABEL)
    return torch.cat(got), RoutingPlan(assignment, token, send_rows, recv_rows, recv_counts, held)


def combine(out: torch.Tensor, plan: RoutingPlan, routing: Routing, tokens: int, g: Group) -> torch.Tensor:
    """Send the experts' outputs [R, h] back and sum each token's k of them, gate-weighted.

    Returns y [tokens, h]; a token whose every choice was dropped gets zeros
    (the residual connection around the layer carries it).
    """
    h = out.shape[-1]
    back = exchange.all_to_all(list(out.split(plan.recv_rows)), [(n, h) for n in plan.send_rows], g,
                               LABEL)
    rows = torch.cat(back)  # in sending order: aligned with plan.assignment
    gates = routing.gates.reshape(-1)[plan.assignment].unsqueeze(1)
    weighted = rows * gates  # under autocast: 16-bit rows times float32 gates, in float32
    return weighted.new_zeros(tokens, h).index_add(0, plan.token, weighted)
