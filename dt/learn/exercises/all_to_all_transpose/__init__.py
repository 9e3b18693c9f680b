"""Exercise: all-to-all as the transpose of a block matrix (the notebook's exercise 2)."""

from dt.learn.exercises import Exercise

EXERCISE = Exercise(
    name="all_to_all_transpose",
    title="All-to-all: transpose a block matrix across ranks",
    function="all_to_all",
    collective="all_to_all",
    target="pairwise",
    see="dt demo primitives   (what all_to_all leaves on each rank)",
    statement="""\
Picture a p x p matrix of blocks, row i living on rank i: rank i's
input_tensor_list[j] is block (i, j). An all-to-all transposes the
distribution: afterwards rank i holds column i, output_tensor_list[j] being
block (j, i), which rank j sent it. This is how expert parallelism routes
tokens to experts and how sequence parallelism swaps a sharded sequence for
sharded heads.

Write all_to_all(output_tensor_list, input_tensor_list, group=None) as
torch.distributed has it. Blocks may differ in length, zeros included
(output_tensor_list[j] has the length rank j sends you). Pairwise exchange
does it in p-1 steps: at step k rank r sends block (r+k) mod p to rank
(r+k) mod p and receives from rank (r-k) mod p, so every step every rank
both sends and receives exactly one block, and none waits on a busy peer.""",
    hints=(
        "Your own block needs no message: output_tensor_list[r].copy_(input_tensor_list[r]).",
        "Step k = 1 .. p-1: to = (r + k) % p, frm = (r - k) % p; post the irecv into "
        "output_tensor_list[frm] and the isend of input_tensor_list[to], then wait on both.",
        "Skip empty blocks on both sides: the sender and the receiver agree on each block's length.",
    ),
)
