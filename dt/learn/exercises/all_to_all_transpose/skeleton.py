# dt exercise: all_to_all_transpose
import torch.distributed as dist  # noqa: F401


def all_to_all(output_tensor_list, input_tensor_list, group=None):
    """output_tensor_list[j] = rank j's input_tensor_list[r]: row r of the blocks becomes column r."""
    p, r = dist.get_world_size(group), dist.get_rank(group)  # noqa: F841
    # your own block stays; then p-1 pairwise steps
    raise NotImplementedError("write the pairwise exchange")
