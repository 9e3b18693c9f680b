# dt exercise: recursive_doubling_all_reduce
import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401
from torch.distributed import ReduceOp

from dt.collectives.ops import combine, finish, op_name  # noqa: F401  (what each ReduceOp means)
from dt.layout import Fold  # noqa: F401  (MPICH's fold of p ranks onto a power of two)


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """Reduce `tensor` over the group in place: recursive doubling, folded when p is no power of two."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # fold in; lg p' exchanges of the whole tensor with rank vrank ^ d; fold out
    raise NotImplementedError("write recursive doubling")
