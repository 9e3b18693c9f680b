"""Vocabulary parallelism: the embedding table and the output logits split by vocabulary rows.

The vocabulary is the largest matrix of a small GPT (V x h), and the logits
the largest activation (b*s*V). Split by rows, rank r holds V/p rows of the
table; the tied output head reuses the same rows, and the cross-entropy is
assembled from per-rank pieces without ever gathering the b*s*V logits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt.collectives import all_reduce
from dt.collectives.ops import ReduceOp
from dt.layout import edges, split_sizes
from dt.parallel.tensor.mappings import (
    copy_to_region,
    gather_from_sequence_region,
    gather_shards,
    reduce_from_region,
    shard_range,
    shard_sizes,
)
from dt.transport import Group, resolve_group

__all__ = ["VocabParallelEmbedding", "parallel_lm_logits", "vocab_parallel_cross_entropy"]


class VocabParallelEmbedding(nn.Module):
    """An embedding table split by vocabulary rows.

    Rank r holds rows shard_range(vocab). Each rank looks up the tokens it
    owns and writes zeros for the others; g (reduce_from_region) sums the
    results, so every token gets exactly its one row.
    Cost per rank, n = b*s*dim*itemsize: forward one all-reduce of n;
    backward nothing (each rank's rows get their gradient locally).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group: Any = None, *,
                 dtype: torch.dtype | None = None, device: Any = None, full: nn.Embedding | None = None):
        super().__init__()
        self.group = resolve_group(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start, self.vocab_end = shard_range(num_embeddings, self.group)
        self.sizes = split_sizes(num_embeddings, self.group.size)
        self.shard_dims = {"weight": 0}  # rows split by self.sizes (checkpoints)
        if full is None:
            full = nn.Embedding(num_embeddings, embedding_dim, dtype=dtype, device=device)
        self.weight = nn.Parameter(full.weight.detach()[self.vocab_start:self.vocab_end].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local_ids = (ids - self.vocab_start).masked_fill(outside, 0)
        weight = self.weight
        if weight.shape[0] == 0:  # vocab smaller than the group: give index 0 a zero row
            weight = torch.cat([weight, weight.new_zeros(1, self.embedding_dim)])
        out = F.embedding(local_ids, weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_region(out, self.group)

    def full_weight(self) -> torch.Tensor:
        return gather_shards(self.weight.detach(), 0, self.sizes, self.group)


def parallel_lm_logits(x: torch.Tensor, weight: torch.Tensor, group: Any = None, *,
                       sequence_parallel: bool = False, seq_len: int | None = None) -> torch.Tensor:
    """This rank's slice of the vocabulary logits, x @ weight_r^T, for a tied head.

    `weight` is a VocabParallelEmbedding's shard [V_r, h]: the same rows a
    ColumnParallelLinear(h, V) would hold, so the embedding and the output
    head share one split table. Feed the result to vocab_parallel_cross_entropy.
    Cost: as ColumnParallelLinear's input: backward one all-reduce of x
    (sequence parallel: forward all-gather, backward reduce-scatter).
    """
    if sequence_parallel:
        x = gather_from_sequence_region(x, group, seq_len=seq_len)
    else:
        x = copy_to_region(x, group)
    return F.linear(x, weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary, never gathering them.

    loss = log(sum_j exp(z_j - m)) - (z_target - m), m = max_j z_j, where each
    sum, max and the target logit are assembled from per-rank pieces with
    three all-reduces of b*s numbers (not b*s*V).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, g: Group,
                vocab_start: int) -> torch.Tensor:
        vocab_end = vocab_start + logits.shape[-1]
        # 1. the global max, for a numerically safe exp
        if logits.shape[-1]:
            logits_max = logits.amax(dim=-1)
        else:  # this rank holds no vocabulary entries
            logits_max = logits.new_full(logits.shape[:-1], float("-inf"))
        if g.size > 1:
            all_reduce(logits_max, op=ReduceOp.MAX, group=g)
        shifted = logits - logits_max.unsqueeze(-1)

        # 2. the target's logit: only the rank that owns the target id has it
        outside = (target < vocab_start) | (target >= vocab_end)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        if logits.shape[-1]:
            target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
            target_logit = target_logit.masked_fill(outside, 0.0)
        else:
            target_logit = shifted.new_zeros(shifted.shape[:-1])
        if g.size > 1:
            all_reduce(target_logit, group=g)

        # 3. the softmax denominator
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        if g.size > 1:
            all_reduce(sum_exp, group=g)

        loss = sum_exp.log() - target_logit
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        # d loss / d z_j = softmax_j - [j == target]: local to each rank's slice.
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax.clone()
        if grad.shape[-1]:
            owned = (~outside).to(grad.dtype)
            grad.scatter_add_(-1, local_target.unsqueeze(-1), -owned.unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor,
                                 group: Any = None, *, vocab_size: int | None = None
                                 ) -> torch.Tensor:
    """Per-token cross-entropy from logits split by vocabulary ([..., V_r] on rank r).

    `target` holds global token ids ([...]); returns the per-token loss [...]
    (take .mean() for F.cross_entropy's default). The shards are laid out by
    split_sizes(vocab_size): pass `vocab_size` when they are uneven (with
    none, equal shards are assumed). Backward is local: softmax minus one-hot.

    Cost per rank, n = b*s*itemsize: forward three all-reduces of n (max,
    target logit, sum of exponentials) instead of gathering b*s*V logits;
    backward nothing.
    """
    g = resolve_group(group)
    local = local_logits.shape[-1]
    sizes = shard_sizes(vocab_size, local, g, None)
    if sizes[g.rank] != local:
        raise ValueError(f"rank {g.rank} holds {local} logits but split_sizes({vocab_size}, "
                         f"{g.size}) gives it {sizes[g.rank]}")
    return _VocabParallelCrossEntropy.apply(local_logits, target, g, edges(sizes)[g.rank])
