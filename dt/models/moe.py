"""A mixture of experts, written plainly: a router and E expert MLPs, every expert here.

    moe = MoE(hidden=64, ffn_hidden=256, num_experts=4, top_k=2, capacity_factor=1.25)
    y = moe(x)                   # x, y: [b, s, h]; the balance loss rides on y's gradient

For tokens x [b, s, h] (Switch Transformer, GShard):

    probs = softmax(x W^T)                  [b, s, E]
    experts, p = top_k(probs)               k = 1 (Switch) or 2 (GShard)
    gates = p (k = 1), p / sum(p) (k > 1)   the weights the experts' outputs are combined with
    y_t = sum over kept choices j of gates_tj * expert_{experts_tj}(x_t)

Capacity, per sequence: an expert accepts at most
C = ceil(capacity_factor * k * s / E) assignments (dt.layout.expert_capacity);
every token's first choice claims its place before any second choice,
earlier positions first; the rest are dropped (the residual path carries the
token). capacity_factor=None drops nothing.

Balance loss, per sequence: E * sum_e f_e * P_e (f_e: the fraction of the
sequence's k*s assignments routed to e before drops, P_e: e's mean router
probability). BalanceLoss weights the sum over the forward's sequences by
aux_loss_coef / (sequences in the batch) and attaches it to y: y's value is
unchanged and its backward sends gradient 1 into the weighted loss
(Megatron's aux-loss scaler; times the loss scale under float16,
set_loss_scale), so the balance loss reaches the gradients on
whichever pipeline stage holds the layer, while the model's returned loss
stays the task's cross-entropy (what dt train reports).
A step that cuts a batch of B sequences into micro-batches and weights each
micro-batch's loss by its share sets `set_batch_sequences(model, B)` first.

Names and seeds are dt.parallel.expert.ShardedMoE's (router.weight,
experts.{e}.fc_in / fc_out): built after the same seed, this module holds
the weights that layer holds at ep = 1, and dt.parallel.expert.style's
ExpertParallel swaps it for that layer, moving these very parameters.
The arithmetic is written here again, plainly, because dt/models imports
nothing from dt.parallel (the parallel router also places a sequence split
over context-parallel ranks; the expert MLP is ExpertMLP here, Expert there,
built in the same order from one seed); tests/test_styles_expert.py holds
the two equal.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.layout import expert_capacity

__all__ = ["BalanceLoss", "ExpertMLP", "MoE", "Router", "router_probs", "set_batch_sequences",
           "set_loss_scale"]


class ExpertMLP(nn.Module):
    """One expert, plainly: Linear(h, ffn), GELU, Linear(ffn, h) (dt.parallel.expert.layer.Expert's
    twin, written again because dt/models imports nothing from dt.parallel)."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.fc_in = nn.Linear(hidden, ffn_hidden)
        self.fc_out = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


def router_probs(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """softmax(x W^T) in the weight's precision, autocast or not: a router in 16 bits would
    pick its top-k from rounded logits (the usual rule, Switch Transformer's: the router in float32)."""
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.to(weight.dtype), weight).softmax(dim=-1)


class Router(nn.Module):
    """Top-k gating over whole sequences: which experts, their gates, which fit, the balance loss."""

    def __init__(self, hidden: int, num_experts: int, top_k: int = 1, capacity_factor: float | None = None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be between 1 and the {num_experts} experts, got {top_k}")
        expert_capacity(capacity_factor, top_k, 1, num_experts)  # a bad factor is refused now
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        # nn.Linear's draw, so the same seed gives dt.parallel.expert.ShardedRouter's weight
        self.weight = nn.Parameter(nn.Linear(hidden, num_experts, bias=False).weight.detach())

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        """experts, gates, keep [b, s, k]; aux_per_sequence [b]; stats."""
        E, k = self.num_experts, self.top_k
        b, s, _ = x.shape
        probs = router_probs(x, self.weight)
        top_p, experts = probs.topk(k, dim=-1)
        gates = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
        onehot = F.one_hot(experts, E)  # [b, s, k, E]
        per_choice = onehot.sum(dim=1)  # [b, k, E]
        keep = torch.ones_like(experts, dtype=torch.bool)
        capacity = expert_capacity(self.capacity_factor, k, s, E)
        if capacity is not None:
            # place = (earlier choices to the same expert, anywhere) + (same choice, earlier tokens)
            earlier_choices = (per_choice.cumsum(dim=1) - per_choice).unsqueeze(1)  # [b, 1, k, E]
            within = onehot.cumsum(dim=1) - onehot
            keep = ((within + earlier_choices) * onehot).sum(dim=-1) < capacity
        f = per_choice.sum(dim=1).to(probs.dtype) / max(s * k, 1)  # [b, E]
        aux = E * (f * probs.sum(dim=1) / max(s, 1)).sum(dim=-1)
        stats = {"assignments": b * s * k, "dropped": int((~keep).sum()),
                 "tokens_dropped": int((~keep).all(dim=-1).sum())}
        return {"experts": experts, "gates": gates, "keep": keep, "aux_per_sequence": aux, "stats": stats}


class _Attach(torch.autograd.Function):
    """y unchanged forward; backward also sends gradient `scale` (1, or float16's loss scale)
    into `loss`."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.shape, ctx.dtype, ctx.device, ctx.scale = loss.shape, loss.dtype, loss.device, scale
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return grad, torch.full(ctx.shape, ctx.scale, dtype=ctx.dtype, device=ctx.device), None


class BalanceLoss(nn.Module):
    """Attach aux_loss_coef x (the batch's mean balance loss, this forward's share of it) to y."""

    def __init__(self, aux_loss_coef: float):
        super().__init__()
        self.aux_loss_coef = aux_loss_coef
        self.batch_sequences: int | None = None  # None: this forward's sequences are the batch
        self.loss_scale = 1.0  # what the task loss's backward starts from (float16's loss scale)
        self.last: torch.Tensor | None = None  # the last forward's per-sequence losses, for reports

    def forward(self, y: torch.Tensor, aux_per_sequence: torch.Tensor) -> torch.Tensor:
        self.last = aux_per_sequence.detach()
        n = self.batch_sequences or aux_per_sequence.shape[0]
        return _Attach.apply(y, aux_per_sequence.sum() * (self.aux_loss_coef / n), self.loss_scale)


def set_batch_sequences(model: nn.Module, sequences: int | None) -> None:
    """Weight every balance loss of `model` by 1 / sequences (the whole batch a micro-batch is of)."""
    for m in model.modules():
        if isinstance(m, BalanceLoss):
            m.batch_sequences = sequences


def set_loss_scale(model: nn.Module, scale: float) -> None:
    """Start every balance loss's backward at `scale`, as the task loss's is (float16's loss scale:
    the gradients are divided by it after backward, the balance loss's with them)."""
    for m in model.modules():
        if isinstance(m, BalanceLoss):
            m.loss_scale = scale


class MoE(nn.Module):
    """Top-k mixture of num_experts Expert MLPs, all on this process; the balance loss attached."""

    def __init__(self, hidden: int, ffn_hidden: int, num_experts: int, top_k: int = 1,
                 capacity_factor: float | None = None, aux_loss_coef: float = 0.01):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = Router(hidden, num_experts, top_k, capacity_factor)
        self.experts = nn.ModuleList(ExpertMLP(hidden, ffn_hidden) for _ in range(num_experts))
        self.balance = BalanceLoss(aux_loss_coef)
        self.counted: dict[str, int] = {}  # routing stats summed over every forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        r = self.router(x)
        k = self.top_k
        flat_expert = r["experts"].reshape(-1)
        kept = r["keep"].reshape(-1).nonzero().squeeze(1)
        assignment = kept[torch.argsort(flat_expert[kept], stable=True)]  # by expert, earlier first
        token = torch.div(assignment, k, rounding_mode="floor")
        counts = torch.bincount(flat_expert[assignment], minlength=self.num_experts)
        parts = x.reshape(b * s, h)[token].split(counts.tolist())
        rows = torch.cat([expert(part) for expert, part in zip(self.experts, parts)])
        gates = r["gates"].reshape(-1)[assignment].unsqueeze(1)
        weighted = rows * gates  # under autocast: 16-bit rows times float32 gates, in float32
        y = weighted.new_zeros(b * s, h).index_add(0, token, weighted).view(b, s, h)
        for key, n in r["stats"].items():
            self.counted[key] = self.counted.get(key, 0) + n
        return self.balance(y, r["aux_per_sequence"])
