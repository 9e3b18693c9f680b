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

__all__ = ["SHARD_ALGORITHM", "comm_scratch_formula", "fsdp_gathered_formula", "memory_held",
           "zero_memory_formula", "zero_memory_parts", "zero_traffic_formula"]

# ZeRO's and FSDP's reduce-scatters and all-gathers run the ring: their shards are uneven lists
# (dt.layout.split_sizes), and the ring's traffic and scratch are what this file prices
SHARD_ALGORITHM = "ring"


def zero_memory_formula(psi: int, n: int, stage: int, k: int = 8, shard: float | None = None,
                        param_bytes: int = 4, grad_bytes: int = 4, kept: float = 0) -> dict[str, float]:
    """Bytes one rank holds for parameters, gradients and optimizer state.

    stage 0 (plain DDP): 4Psi, 4Psi, K Psi    -> 16 Psi with fp32 + Adam
    stage 1:             4Psi, 4Psi, K Psi/N  -> 8 Psi + 8 Psi/N
    stage 2:             4Psi, 4Psi/N, K Psi/N -> 4 Psi + 12 Psi/N
    stage 3:             4Psi/N, 4Psi/N, K Psi/N -> 16 Psi/N
    `shard` is this rank's element count, Psi/N when N divides Psi. `kept`: elements whose
    full gradient stage 2 holds until the step (a tied weight two pipeline stages sum).
    """
    s = psi / n if shard is None else shard
    p = psi if stage < 3 else s
    g = psi if stage < 2 else s + (kept if stage == 2 else 0)
    o = psi if stage < 1 else s
    return {"params": param_bytes * p, "grads": grad_bytes * g, "optimizer": k * o}


def fsdp_gathered_formula(root: float, others: list[float], itemsize: int = 4,
                          prefetch: bool = True) -> float:
    """Bytes stage 3 (dt.parallel.zero.fsdp) holds whole on top of its shards at a step's worst
    moment: the root unit (a tied weight, gathered for the whole forward and the whole backward)
    and the largest other unit, each with its full gradient before the reduce-scatter; with
    prefetch (dt.parallel.zero.prefetch) one more unit gathered ahead, never the one computing:
    at most the second largest. `root`, `others`: the units' element counts."""
    ranked = sorted(others, reverse=True)
    ahead = ranked[1] if prefetch and len(ranked) > 1 else 0
    return 2 * itemsize * (root + (ranked[0] if ranked else 0)) + itemsize * ahead


def zero_memory_parts(parts: list[tuple[float, int]], stage: int, k: int = 8, param_bytes: int = 4,
                      grad_bytes: int = 4, kept: float = 0) -> dict[str, float]:
    """zero_memory_formula summed over parts sharded over different counts of ranks: (Psi, N) each.

    With experts (dt.parallel.zero.parts): the dense (Psi_d, dp * cp) and this rank's
    experts (Psi_e, dp * cp / ep, their replicas). `kept`: the first part's elements whose
    full gradient stage 2 keeps (a tied weight two pipeline stages sum).
    """
    out = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    for j, (psi, n) in enumerate(parts):
        held = kept if j == 0 else 0
        for key, v in zero_memory_formula(psi, n, stage, k, None, param_bytes, grad_bytes, held).items():
            out[key] += v
    return out


def zero_traffic_formula(shard_lists: list[list[int]], rank: int, stage: int,
                         itemsize: int = 4, micro_batches: int = 1,
                         kept_lists: tuple[list[int], ...] | list[list[int]] = ()) -> int:
    """Bytes this rank sends per step: ring reduce-scatter + ring all-gather per sharded
    buffer (stages 1, 2: the bytes of a ring all-reduce), plus a second all-gather
    before backward at stage 3. `shard_lists`: element counts of each buffer's shards.

    With `micro_batches` backwards per step (gradient accumulation, a pipeline's
    micro-batches, times its chunks per rank when interleaved: each backward call
    finishes every bucket, zeros for the other chunk's): stage 1 reduce-scatters
    once, from the accumulated full gradient; stage 2 keeps no full gradient to
    accumulate into, so it reduce-scatters in every backward; stage 3 also gathers
    the parameters for every forward and backward.
    `kept_lists`: the shard cuts of ranges stage 2 keeps whole until the step (a tied
    weight), scattered once, not per backward (the ring's bytes add up over ranges).
    """
    m = micro_batches
    scatters, gathers = {1: (1, 1), 2: (m, 1), 3: (m, 2 * m)}.get(stage, (1, 1))
    total = 0
    for sizes in shard_lists:
        total += ring_reduce_scatter(sizes, itemsize, rank).bytes_sent * scatters
        total += ring_all_gather(sizes, itemsize, rank).bytes_sent * gathers
    for sizes in kept_lists:
        total -= ring_reduce_scatter(sizes, itemsize, rank).bytes_sent * (scatters - 1)
    return total


def comm_scratch_formula(chunk_lists: list[list[int]], itemsize: int, rank: int,
                         algorithm: str = SHARD_ALGORITHM) -> int:
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
