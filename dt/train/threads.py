"""How many torch threads each `dt train` rank computes with, unless --threads says.

    threads per rank = cores // ranks on this host, but 1 while the model's products are small

A matmul split over OpenMP threads returns when its last thread is done. On a
machine whose cores other processes also use (the ranks of the run itself
among them), a thread that finds its core taken waits for the scheduler's next
time slice, a millisecond or more, and the whole product waits with it. A
split therefore pays only when each thread's share takes longer than that:
WORK_PER_THREAD FLOPs, a few milliseconds on one core. The default model's
largest product (one micro-batch's MLP, 256 tokens x 64 x 256: 8 MFLOP) is a
small fraction of a millisecond, and one process of it ran 5-10x slower per
token on 2 threads than on 1 of a shared 2-core machine: slower than each
rank of a 2-rank run on 1 thread, the opposite of what scaling out means.
So a rank gets one thread per WORK_PER_THREAD of its largest product, at
least 1 and at most its share of the host's cores; torchrun's default of
OMP_NUM_THREADS=1 per process (torch's DDP examples) is the same rule
without the count. The rule needs no measurement: it depends on the
model's shape, the mesh and the core count only, so a run's threads are the
same every time it is started.
"""

from __future__ import annotations

import argparse

__all__ = ["WORK_PER_THREAD", "default_threads", "largest_product_flops"]

WORK_PER_THREAD = 2**28  # FLOPs: ~3 ms on one core at ~90 GFLOP/s, a few scheduler time slices


def largest_product_flops(args: argparse.Namespace) -> float:
    """FLOPs of the largest matmul a rank runs: one micro-batch's MLP up-projection on this rank
    (its tokens x n_embd x 4 n_embd, the output split over tp)."""
    sequences = max(1, args.batch_size // args.dp // max(1, args.micro_batches))
    tokens = sequences * max(1, args.block_size // args.cp)
    return 2.0 * tokens * args.n_embd * 4 * args.n_embd / args.tp


def default_threads(args: argparse.Namespace, ranks_per_host: int, cores: int) -> int:
    """Threads per rank: one per WORK_PER_THREAD FLOPs of the largest product, at least 1, at most
    cores // ranks_per_host."""
    share = max(1, cores // max(1, ranks_per_host))
    return max(1, min(share, int(largest_product_flops(args) // WORK_PER_THREAD)))
