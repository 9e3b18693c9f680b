# dt exercise: ring_all_reduce
import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name  # noqa: F401  (what each ReduceOp means)
from dt.layout import split_sizes  # noqa: F401  (p chunks of n elements, uneven allowed)


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """Reduce `tensor` over the group, in place, on every rank: a ring, from isend/irecv."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # 1. cut tensor.view(-1) into p chunks
    # 2. reduce-scatter: p-1 steps, send right, receive left, reduce into your chunk
    # 3. AVG: divide your finished chunk by p
    # 4. all-gather: p-1 steps, send right, receive left
    raise NotImplementedError("write the ring")
