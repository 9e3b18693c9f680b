"""Ulysses (DeepSpeed-Ulysses): context parallelism as a transpose between sequence and heads.

Attention heads are independent. A rank holding s_r tokens of every head can
trade, in one all-to-all, for every token of H/cp heads: rank r sends rank
j its tokens' slice of j's heads. Then each rank runs ordinary attention
over the whole sequence on its heads, and a second all-to-all trades back.
That is the notebook's exercise: a distributed transpose of a [sequence,
heads] matrix whose rows are spread over the ranks.

    q, k, v [b, H, s_r, d]  --all-to-all-->  [b, H/cp, S, d]  (q, k, v in one message)
    attention (causal by position: dt.parallel.context.blocks)
    out [b, H/cp, S, d]      --all-to-all-->  [b, H, s_r, d]

The heads must divide by cp (each rank takes whole heads); the sequence need
not (uneven splits go through the all-to-all's uneven blocks). Tokens are
whatever dt.layout.SequenceLayout gives each rank (zig-zag or contiguous):
the gathered sequence is in layout order and the causal mask follows the
positions, not the order.

Cost per rank (dt.cost.ulysses_traffic, exact): forward one all-to-all of
q, k, v and one of the output: (cp-1)/cp of 3 + 1 of this rank's
[b, H, s_r, d]; backward the same two reversed. The bytes fall as 1/cp.
"""

from __future__ import annotations

from typing import Any

import torch

from dt.layout import SequenceLayout
from dt.parallel import exchange
from dt.parallel.context.blocks import attention
from dt.transport import resolve_group

__all__ = ["LABEL", "ulysses_attention"]

LABEL = "ulysses"  # dt.traffic() charges both all-to-alls, forward and backward, to this name


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None,
                      layout: SequenceLayout | None = None, causal: bool = True) -> torch.Tensor:
    """Attention of this rank's tokens over the whole sequence, by two all-to-alls.

    q, k, v: [b, heads, s_r, d], this rank's tokens as `layout` places them
    (default: a contiguous split with every rank holding s_r). heads must be
    divisible by the group size. Returns [b, heads, s_r, d]. Differentiable.
    """
    g = resolve_group(group)
    p = g.size
    b, heads, s, d = q.shape
    if heads % p:
        raise ValueError(f"rank {g.ranks[g.rank]}: Ulysses gives each of the {p} ranks of the context-"
                         f"parallel group whole attention heads, but {heads} heads do not divide by "
                         f"{p}; use ring attention, or a head count divisible by {p}")
    if layout is None:
        layout = SequenceLayout(s * p, p, zigzag=False)
    if layout.parts != p or layout.size(g.rank) != s:
        raise ValueError(f"rank {g.ranks[g.rank]}: holds {s} tokens but the layout gives it "
                         f"{layout.size(g.rank) if g.rank < layout.parts else None} of {layout.parts}")
    hp, sizes = heads // p, layout.sizes()
    qkv = torch.stack([q, k, v])  # [3, b, H, s_r, d]: one all-to-all for the three
    got = exchange.all_to_all([qkv[:, :, j * hp:(j + 1) * hp] for j in range(p)],
                              [(3, b, hp, n, d) for n in sizes], g, LABEL)
    full = torch.cat(got, dim=3)  # [3, b, H/cp, S, d], tokens in layout order
    order = [c for rank in range(p) for c in layout.chunks(rank)]
    out = attention(full[0], full[1], full[2], order, order, causal)
    back = exchange.all_to_all(list(out.split(sizes, dim=2)), [(b, hp, s, d)] * p, g, LABEL)
    return torch.cat(back, dim=1)  # [b, H, s_r, d]: heads back in rank order
