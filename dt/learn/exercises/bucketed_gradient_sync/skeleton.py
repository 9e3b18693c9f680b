# dt exercise: bucketed_gradient_sync
import torch  # noqa: F401
from torch.distributed import ReduceOp  # noqa: F401

import dt  # noqa: F401  (dt.all_reduce(buffer, ReduceOp.AVG, group, algorithm="ring"))


def sync_gradients(params, bucket_bytes, group=None):
    """Average every p.grad over the group, one ring all-reduce per bucket of >= bucket_bytes."""
    # form the buckets; flatten each; all-reduce it; copy the averages back into each .grad
    raise NotImplementedError("write the bucketed sync")
