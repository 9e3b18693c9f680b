"""Context parallelism: one sequence's tokens over the ranks of a `cp` group.

Everything in a transformer but attention is per token, so it runs on each
rank's share of the sequence unchanged. Attention mixes tokens; two ways to
let each rank's queries see every key:

- ulysses.py         an all-to-all from sequence-sharded to head-sharded and back
                     (DeepSpeed-Ulysses); bytes per rank fall as 1/cp; heads must divide by cp
- ring_attention.py  keys and values travel around the ring, the online softmax merges
                     the pieces; bytes per rank stay flat in cp but hide behind compute
- blocks.py          the block-wise attention arithmetic both use (online softmax, chunked
                     causal masks, flash-style backward)
- layer.py           ContextParallelSelfAttention: the tensor-parallel projections around either
- style.py           the styles dt.parallelize applies to a plain model (ContextParallel,
                     SharePositions, ShareLoss) and shard_sequence, which splits the inputs

How the tokens are placed: dt.layout.SequenceLayout (zig-zag balances the
causal mask's work). What it costs: dt.cost.ulysses_traffic and
dt.cost.ring_attention_traffic.
"""

from dt.parallel.context.blocks import attention
from dt.parallel.context.layer import ContextParallelSelfAttention
from dt.parallel.context.ring_attention import LABEL as RING_LABEL
from dt.parallel.context.ring_attention import ring_attention
from dt.parallel.context.style import ContextParallel, ShareLoss, SharePositions, shard_sequence
from dt.parallel.context.ulysses import LABEL as ULYSSES_LABEL
from dt.parallel.context.ulysses import ulysses_attention

# The names dt.traffic() charges this package's bytes to: ring attention's hops, Ulysses' all-to-alls.
LABELS = (RING_LABEL, ULYSSES_LABEL)

__all__ = ["LABELS", "ContextParallel", "ContextParallelSelfAttention", "SharePositions", "ShareLoss",
           "attention", "ring_attention", "shard_sequence", "ulysses_attention"]
