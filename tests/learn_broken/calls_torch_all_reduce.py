"""Broken on purpose: it calls torch's own all_reduce instead of writing one."""

import torch.distributed as dist
from torch.distributed import ReduceOp


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    dist.all_reduce(tensor, op=op, group=group)
