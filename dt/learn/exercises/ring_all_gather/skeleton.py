# dt exercise: ring_all_gather
import torch  # noqa: F401
import torch.distributed as dist  # noqa: F401


def all_gather(tensor_list, tensor, group=None):
    """tensor_list[i] = rank i's tensor on every rank; lengths may differ from rank to rank."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # copy your tensor into tensor_list[r]; then p-1 steps around the ring
    raise NotImplementedError("write the ring all-gather")
