"""Reference solution: bucketed gradient averaging.

Gradients join the current bucket in order until it holds at least
bucket_bytes; each bucket is flattened into one buffer and averaged with one
ring all-reduce, so the latency is paid once per bucket, not per gradient.
"""

import torch
from torch.distributed import ReduceOp

import dt


def sync_gradients(params, bucket_bytes, group=None):
    buckets, current, size = [], [], 0
    for p in params:
        if p.grad is None:
            continue
        current.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    for grads in buckets:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dt.all_reduce(flat, ReduceOp.AVG, group, algorithm="ring")
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
