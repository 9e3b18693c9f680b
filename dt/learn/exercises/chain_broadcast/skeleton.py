# dt exercise: chain_broadcast
import torch.distributed as dist  # noqa: F401


def broadcast(tensor, src, group=None):
    """Every rank's tensor = src's (src a global rank), passed down a chain from the root."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # the root's group rank; v = (r - root) % p; receive from the left, send to the right
    raise NotImplementedError("write the chain")
