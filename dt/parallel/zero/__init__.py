"""ZeRO: data parallel that stops keeping N copies of everything.

Plain data parallel holds, on every rank, Psi parameters, Psi gradients and
the optimizer state: in fp32 with Adam that is 4 + 4 + 8 = 16 bytes per
parameter (baseline 16 Psi). ZeRO (Rajbhandari et al., 2020) shards what each
rank does not need in full:

    stage 1  optimizer state sharded           4 Psi + 4 Psi   + K Psi / N
    stage 2  + gradients sharded               4 Psi + (4 + K) Psi / N
    stage 3  + parameters sharded (FSDP)       (4 + 4 + K) Psi / N

(fp32 parameters and gradients, K bytes of optimizer state per parameter:
Adam K = 8, SGD with momentum K = 4, plain SGD K = 0; `zero_memory_formula`.)

Communication per step, per rank, with the ring (dt.cost):

    stage 1, 2  reduce-scatter gradients + all-gather parameters
                = exactly the bytes of DDP's ring all-reduce, about 2 * 4 Psi
    stage 3     all-gather (forward) + all-gather (backward) + reduce-scatter
                about 3 * 4 Psi: 1.5x DDP, the price of not holding parameters

The reduce-scatters and all-gathers run the ring by default (`algorithm=`):
shards are large, the ring is bandwidth-optimal and takes uneven shards as they
come, and the figures above are its exact arithmetic.

Each rank owns one contiguous shard of the flattened parameters
(`dt.layout.split_sizes`: any count, uneven shards, empty shards when
there are fewer elements than ranks) and runs the real torch optimizer on that
shard only.

- memory.py     the memory and traffic formulas, and the measured bytes held
- shards.py     gathering a sharded flat buffer (parameters, optimizer state) back
- optimizer.py  ZeroOptimizer: stages 1 and 2
- parts.py      ZeroParts: ZeroOptimizers over several groups as one (experts over their replicas)
- fsdp.py       FullyShardedDataParallel: stage 3
- prefetch.py   stage 3's all-gathers issued one unit ahead, behind the unit before
"""

from dt.parallel.zero.fsdp import FullyShardedDataParallel
from dt.parallel.zero.memory import memory_held, zero_memory_formula, zero_traffic_formula
from dt.parallel.zero.optimizer import ShardedOptimizer, ZeroOptimizer
from dt.parallel.zero.parts import ZeroParts

__all__ = ["FullyShardedDataParallel", "ShardedOptimizer", "ZeroOptimizer", "ZeroParts", "memory_held",
           "zero_memory_formula", "zero_traffic_formula"]
