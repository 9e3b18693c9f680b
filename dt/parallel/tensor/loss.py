"""Two more tensor-parallel styles: the loss on vocab-sharded logits, RMSNorm under sequence parallel.

    VocabParallelLoss(vocab_size)   a per-token cross-entropy module (dt.models.lm.CrossEntropy,
                                    the plain models' `loss.per_token`) -> VocabParallelCrossEntropy:
                                    dt.parallel.tensor.vocab_parallel_cross_entropy on this rank's
                                    slice of the vocabulary, never gathering the logits
    SequenceParallelRMSNorm()       an RMSNorm (Llama's) run on this rank's tokens under sequence
                                    parallelism: kept as it is, its weight's gradient summed over tp

Loss parallel (Megatron's): with the head's gather_output off, rank r holds
logits [b, s, V_r]; the loss takes the max, the target's logit and the sum
of exponentials across the vocabulary by three all-reduces of b*s numbers
over tp, instead of all-gathering b*s*V logits (and its backward is local).
The model then returns this rank's vocabulary slice of the logits.
gpt_plan / llama_plan(loss_parallel=True) set both ends.

Sequence-parallel norms: each rank normalises only its own tokens, so its
gradient for the (replicated) weight is partial. SequenceParallelLayerNorm
routes its weights through f (copy_to_region); an RMSNorm is kept whole
and its weight's gradient is all-reduced (summed) over tp by a gradient
hook as backward produces it: h numbers per norm per backward.
"""

from __future__ import annotations

import torch
from torch import nn

from dt.parallel.tensor.mappings import all_reduced
from dt.parallel.tensor.styles import Style, Ties
from dt.parallel.tensor.vocab import vocab_parallel_cross_entropy
from dt.transport import Group

__all__ = ["SequenceParallelRMSNorm", "VocabParallelCrossEntropy", "VocabParallelLoss", "sequence_shards"]

SHARDS = "sequence_shards"  # set on a norm SequenceParallelRMSNorm styled: over how many ranks


def sequence_shards(norm: nn.Module) -> int:
    """Over how many ranks the tokens a norm sees are split (SequenceParallelRMSNorm's group; else 1)."""
    return getattr(norm, SHARDS, 1)


class VocabParallelCrossEntropy(nn.Module):
    """Per-token cross-entropy [b, s] from this rank's vocabulary slice of the logits [b, s, V_r]."""

    def __init__(self, group: Group, vocab_size: int):
        super().__init__()
        self.group, self.vocab_size = group, vocab_size

    def forward(self, local_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Half precision is upcast for the softmax's sums, as the plain loss does.
        wide = local_logits.to(torch.promote_types(local_logits.dtype, torch.float32))
        return vocab_parallel_cross_entropy(wide, targets, self.group, vocab_size=self.vocab_size)

    def extra_repr(self) -> str:
        return f"vocab {self.vocab_size} over {self.group.size} ranks"


class VocabParallelLoss(Style):
    """A per-token cross-entropy (no weights; logits, targets -> [b, s]) -> VocabParallelCrossEntropy."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        if type(module).__name__ != "CrossEntropy" or any(True for _ in module.parameters()):
            raise ValueError(f"{name}: VocabParallelLoss swaps a per-token cross-entropy "
                             f"(dt.models.lm.CrossEntropy), found {type(module).__name__}")
        return VocabParallelCrossEntropy(group, self.vocab_size)


class SequenceParallelRMSNorm(Style):
    """An RMSNorm (a `weight`, an `eps`, no bias) kept as it is; its weight's gradient summed over tp."""

    replaces = False

    def apply(self, module: nn.Module, group: Group, name: str, ties: Ties) -> nn.Module:
        params = dict(module.named_parameters())
        if "RMSNorm" not in type(module).__name__ or list(params) != ["weight"]:
            raise ValueError(f"{name}: SequenceParallelRMSNorm takes an RMSNorm with a weight and no "
                             f"bias, found {type(module).__name__} with {sorted(params) or 'no weights'}")
        params["weight"].register_hook(lambda grad: all_reduced(grad, group))
        setattr(module, SHARDS, group.size)
        return module
