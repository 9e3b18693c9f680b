"""Exercise: ring all-gather with uneven shards."""

from dt.learn.exercises import Exercise

EXERCISE = Exercise(
    name="ring_all_gather",
    title="Ring all-gather, shards of different lengths",
    function="all_gather",
    collective="all_gather",
    target="ring",
    see="dt demo primitives   (what all_gather leaves on each rank)",
    statement="""\
Write all_gather(tensor_list, tensor, group=None) as torch.distributed has
it: on return, tensor_list[i] on every rank holds rank i's `tensor`. Unlike
torch's gloo backend, yours must accept shards of different lengths
(tensor_list[i] has rank i's length, which every rank knows: 3, 4, 5, 0, 1
elements, or everything on one rank), as ZeRO and tensor parallelism need
when a parameter does not divide by p.

The ring: copy your shard into tensor_list[r], then p-1 times send the
shard you received last (first your own) to your right and receive the
next one from your left. Every shard travels once around the ring.""",
    hints=(
        "At step s rank r sends shard (r-s) mod p and receives shard (r-s-1) mod p, straight into "
        "tensor_list[(r-s-1) % p]: no extra buffer needed.",
        "The receive has the length of the shard that arrives: tensor_list[i].numel(), which every "
        "rank knows. Skip empty shards on both sides.",
        "Post each step's irecv and isend together, then wait on both.",
        "Peers by group rank: dist.irecv(t, group=group, group_src=(r - 1) % p).",
    ),
)
