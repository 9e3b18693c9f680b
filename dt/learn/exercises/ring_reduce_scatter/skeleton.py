# dt exercise: ring_reduce_scatter
import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name  # noqa: F401  (what each ReduceOp means)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None):
    """output on rank r = input_list[r] reduced over the group; blocks may differ in length."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # p-1 steps: send a partial block right, receive one from the left, reduce your input into it
    raise NotImplementedError("write the ring reduce-scatter")
