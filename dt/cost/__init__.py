"""What distributed training costs, as arithmetic: bytes, messages, steps and time.

- records.py    every algorithm's cost record (traffic, formula, two-level schedule, wires), declared
                beside the algorithm (dt.collectives' @algorithm): the one table the rest reads
- traffic.py    per-rank bytes/messages/steps of every point-to-point algorithm; traffic_for
- time.py       the alpha-beta-gamma model: steps, critical-path bytes, reduced bytes -> seconds
- textbook.py   each point-to-point algorithm's closed form (the reference table)
- bandwidth.py  algbw and busbw as nccl-tests report them
- levels.py     the two-level model: bytes inside and across hosts, time as the slower level's
- loadstore.py  the shared-memory (load/store) algorithms' reads, syncs and copies
- memory.py     memory communication holds (the ring's scratch buffers)
- machine.py    this machine's alpha, beta, gamma (sync, mem for shared memory) and measured
                winners (`dt tune` saves them)
- moe.py        a mixture-of-experts layer's two all-to-alls (expert parallel)
- context.py    Ulysses' all-to-alls and ring attention's passes (context parallel)
- flops.py      FLOPs of dt's decoders per layer and kind: forward, backward, recompute, splits
- activations.py  bytes autograd keeps per layer (tp, sp, cp, recompute), to the byte of dt's layers
- context_backward.py  the bytes context parallel's attention backward holds at once, to the byte
- devices.py    the catalogue: A100, H100, H200 peak FLOP/s, HBM, NVLink, NIC, each with its source
- compute_rate.py  this machine's matmul rate per shape and thread count (`dt tune` saves it)

Everything is importable from here: `from dt import cost; cost.ring_all_reduce(...)`.
The shard and schedule arithmetic the counts are built on lives in dt.layout.
"""

from dt.cost.bandwidth import BUSBW_FACTOR, bus_bandwidth
from dt.cost.context import ring_attention_traffic, ulysses_traffic
from dt.cost.levels import Levels, TwoLevelEstimate, level_bytes, schedule, two_level
from dt.cost.machine import DEFAULT_MACHINE, DEFAULT_SHM_MACHINE, Machine
from dt.cost.moe import COUNT_ITEMSIZE, moe_all_to_all_bytes, moe_layer_traffic
from dt.cost.time import Estimate, estimate, formula
from dt.cost.traffic import *  # noqa: F401,F403
from dt.cost.traffic import __all__ as _traffic_all
from dt.layout import segment_count, split_sizes  # noqa: F401  (where older code looked for them)

__all__ = [*_traffic_all, "BUSBW_FACTOR", "COUNT_ITEMSIZE", "DEFAULT_MACHINE", "DEFAULT_SHM_MACHINE",
           "Estimate", "Levels", "Machine", "TwoLevelEstimate", "level_bytes", "schedule", "two_level",
           "bus_bandwidth", "estimate", "formula", "moe_all_to_all_bytes",
           "moe_layer_traffic", "ring_attention_traffic", "ulysses_traffic"]

# The planner's arithmetic (appended: each a module of its own, re-exported here).
from dt.cost.activations import layer_activation_bytes, stage_activation_bytes  # noqa: E402
from dt.cost.devices import DEVICES, Device, device  # noqa: E402
from dt.cost.flops import Decoder, StepFlops, layer_forward, step_flops, train_flops_per_token  # noqa: E402

__all__ += ["DEVICES", "Decoder", "Device", "StepFlops", "device", "layer_activation_bytes", "layer_forward",
            "stage_activation_bytes", "step_flops", "train_flops_per_token"]
