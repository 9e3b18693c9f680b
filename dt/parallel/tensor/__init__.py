"""Tensor parallelism (Megatron-LM): one layer's matrices split across a group.

    from dt.parallel import tensor as tp
    mlp = tp.ParallelMLP(hidden, 4 * hidden, group)      # this rank's slices
    y = mlp(x)                                           # one all-reduce forward, one backward

A linear layer y = x W^T + b can be split by W's output rows (column
parallel: no communication forward, the input gradient all-reduced backward)
or by its input columns (row parallel: the partial outputs all-reduced
forward, nothing backward). Column followed by row (an MLP, or attention's
QKV then output projection) needs no communication in between: the column
layer's output slice is exactly the row layer's input slice. So a whole
block costs one all-reduce forward and one backward, Megatron's f and g:

    x -> f -> ColumnParallelLinear -> GELU -> RowParallelLinear -> g -> y

Sequence parallelism splits each of those all-reduces into its reduce-scatter
and all-gather halves, so what runs between blocks holds s/p tokens per rank.

Worked example (GPT-2 small, h = 768, 8 sequences of 1024 tokens, float32):
one activation is n = 8*1024*768*4 = 25.2 MB. A transformer layer has two
tensor-parallel blocks (attention, MLP), so it runs 2 all-reduces forward and
2 backward; at p = 4 each sends 2*(3/4)*25.2 = 37.7 MB per rank, 151 MB per
layer per step, whatever the layer's parameter count. That is why tensor
parallelism stays inside a node, where links are fastest.

- mappings.py   who holds what (shard_range), f / g and the sequence-parallel
                pairs as autograd functions, and their exact bytes (collective_bytes)
- layers.py     ColumnParallelLinear, RowParallelLinear, ParallelMLP, SequenceParallelLayerNorm
- attention.py  ParallelSelfAttention: heads split whole across ranks
- vocab.py      VocabParallelEmbedding, parallel_lm_logits, vocab_parallel_cross_entropy
- styles.py     the styles dt.parallelize swaps a plain module for: Colwise, Rowwise, VocabParallel(Head)

Every layer is checked against an unsharded twin built from the same seed
(torch's nn.Linear / nn.Embedding, or tests/twins.py).
"""

from dt.parallel.tensor.attention import ParallelSelfAttention
from dt.parallel.tensor.layers import (
    ColumnParallelLinear,
    ParallelMLP,
    RowParallelLinear,
    SequenceParallelLayerNorm,
)
from dt.parallel.tensor.mappings import (
    SEQUENCE_DIM,
    all_reduce_bytes,
    collective_bytes,
    copy_to_region,
    gather_from_region,
    gather_from_sequence_region,
    reduce_from_region,
    reduce_scatter_to_sequence_region,
    scatter_to_region,
    scatter_to_sequence_region,
    shard_range,
)
from dt.parallel.tensor.styles import (
    ColwiseParallel,
    FusedAttentionParallel,
    FusedColwiseParallel,
    ParallelLMHead,
    RowwiseParallel,
    SequenceParallelNorm,
    ShardSequence,
    Style,
    VocabParallel,
    VocabParallelHead,
)
from dt.parallel.tensor.vocab import (
    VocabParallelEmbedding,
    parallel_lm_logits,
    vocab_parallel_cross_entropy,
)

# The names dt.traffic() charges this package's layers' collectives to (f, g, the sequence-
# parallel all-gathers and reduce-scatters, the gathered logits): dt's own collectives'.
LABELS = ("all_reduce", "all_gather", "reduce_scatter")

__all__ = [
    "LABELS",
    "SEQUENCE_DIM",
    "ColumnParallelLinear",
    "ColwiseParallel",
    "FusedAttentionParallel",
    "FusedColwiseParallel",
    "ParallelLMHead",
    "ParallelMLP",
    "ParallelSelfAttention",
    "RowParallelLinear",
    "RowwiseParallel",
    "SequenceParallelLayerNorm",
    "SequenceParallelNorm",
    "ShardSequence",
    "Style",
    "VocabParallel",
    "VocabParallelEmbedding",
    "VocabParallelHead",
    "all_reduce_bytes",
    "collective_bytes",
    "copy_to_region",
    "gather_from_region",
    "gather_from_sequence_region",
    "parallel_lm_logits",
    "reduce_from_region",
    "reduce_scatter_to_sequence_region",
    "scatter_to_region",
    "scatter_to_sequence_region",
    "shard_range",
    "vocab_parallel_cross_entropy",
]
