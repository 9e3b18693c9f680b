"""What ZeRO holds and moves per rank: the formulas, and the measurement they are checked against.

The formulas are stated once here and used by the optimizer (stages 1-2),
FSDP (stage 3), the tests and the benchmarks; the bytes sent come from
dt.cost's ring arithmetic, the same table dt.traffic() is held to.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dt.cost import ring_all_gather, ring_reduce_scatter
from dt.cost.memory import ring_reduce_scatter_scratch, scratch_held

__all__ = ["comm_scratch_formula", "memory_held", "zero_memory_formula", "zero_traffic_formula"]


def zero_memory_formula(psi: int, n: int, stage: int, k: int = 8, shard: float | None = None,
                        param_bytes: int = 4, grad_bytes: int = 4) -> dict[str, float]:
    """Bytes one rank holds for parameters, gradients and optimizer state.

    stage 0 (plain DDP): 4Psi, 4Psi, K Psi    -> 16 Psi with fp32 + Adam
    stage 1:             4Psi, 4Psi, K Psi/N  -> 8 Psi + 8 Psi/N
    stage 2:             4Psi, 4Psi/N, K Psi/N -> 4 Psi + 12 Psi/N
    stage 3:             4Psi/N, 4Psi/N, K Psi/N -> 16 Psi/N
    `shard` is this rank's element count, Psi/N when N divides Psi.
    """
    s = psi / n if shard is None else shard
    p = psi if stage < 3 else s
    g = psi if stage < 2 else s
    o = psi if stage < 1 else s
    return {"params": param_bytes * p, "grads": grad_bytes * g, "optimizer": k * o}


def zero_traffic_formula(shard_lists: list[list[int]], rank: int, stage: int,
                         itemsize: int = 4, micro_batches: int = 1) -> int:
    """Bytes this rank sends per step: ring reduce-scatter + ring all-gather per sharded
    buffer (stages 1, 2: the bytes of a ring all-reduce), plus a second all-gather
    before backward at stage 3. `shard_lists`: element counts of each buffer's shards.

    With `micro_batches` backwards per step (gradient accumulation, a pipeline's
    micro-batches): stage 1 reduce-scatters once, from the accumulated full gradient;
    stage 2 keeps no full gradient to accumulate into, so it reduce-scatters in every
    backward; stage 3 also gathers the parameters for every forward and backward.
    """
    m = micro_batches
    scatters, gathers = {1: (1, 1), 2: (m, 1), 3: (m, 2 * m)}.get(stage, (1, 1))
    total = 0
    for sizes in shard_lists:
        total += ring_reduce_scatter(sizes, itemsize, rank).bytes_sent * scatters
        total += ring_all_gather(sizes, itemsize, rank).bytes_sent * gathers
    return total


def comm_scratch_formula(chunk_lists: list[list[int]], itemsize: int, rank: int,
                         algorithm: str = "ring") -> int:
    """Bytes the ring reduce-scatters of `chunk_lists` leave in scratch on this rank.

    The ring keeps its landing buffers and its reduce-scatter pool (dt.cost.memory):
    about a full input's size of the largest reduce-scatter, on top of what ZeRO
    shards. Other algorithms hold none.
    """
    if algorithm != "ring":
        return 0
    return scratch_held([ring_reduce_scatter_scratch(c, itemsize, rank) for c in chunk_lists])


def memory_held(params: Iterable[torch.Tensor], grads: Iterable[torch.Tensor | None],
                optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Measured bytes held: distinct storages behind params, grads and optimizer state.

    Counting storages, not tensors, means views into one flat buffer count once
    and freed (resized to 0) buffers count 0. Adam's `step` counters (one scalar
    per tensor) are left out, as in the ZeRO paper's K.
    """
    def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            if t is not None:
                s = t.untyped_storage()
                seen[s.data_ptr() if s.nbytes() else -id(s)] = s.nbytes()
        return sum(seen.values())

    state = [v for st in optimizer.state.values() for key, v in st.items()
             if isinstance(v, torch.Tensor) and key != "step"]
    return {"params": storage_bytes(params), "grads": storage_bytes(grads),
            "optimizer": storage_bytes(state)}
