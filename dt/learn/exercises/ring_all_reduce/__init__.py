"""Exercise: ring all-reduce from send/recv."""

from dt.learn.exercises import Exercise

EXERCISE = Exercise(
    name="ring_all_reduce",
    title="Ring all-reduce from point-to-point messages",
    function="all_reduce",
    collective="all_reduce",
    target="ring",
    see="dt demo primitives   (reduce_scatter + all_gather == all_reduce, ring bytes per rank)",
    statement="""\
Write all_reduce(tensor, op=ReduceOp.SUM, group=None) as torch.distributed
has it: on return, every rank's tensor holds the reduction of all ranks'
tensors, in place. Use only point-to-point calls (dist.isend, dist.irecv,
dist.send, dist.recv, or dt.transport): the judge forbids torch's
collectives inside, and runs yours on world sizes 1, 2, 3, 5 and 8, on
lengths 0, 1, fewer than ranks and primes, on every op and dtype, and on a
subgroup, against torch's own all_reduce.

Bandwidth-optimal means the ring: cut the tensor into p chunks; in a
reduce-scatter lap each rank sends one chunk to its right neighbour and
receives one from its left, reducing it into its own copy, p-1 times, after
which rank r holds chunk r reduced over everyone; an all-gather lap then
carries the reduced chunks around once more.""",
    hints=(
        "Chunks: dt.layout.split_sizes(n, p) cuts n elements into p chunks whose lengths differ "
        "by at most one (33 over 5: 7, 7, 7, 6, 6), and tensor.view(-1).split(sizes) gives views "
        "you can reduce into in place.",
        "A receive buffer must have the size of the chunk that *arrives*, not of yours: at step s "
        "rank r sends chunk (r-s-1) mod p and receives chunk (r-s-2) mod p.",
        "Post the step's irecv and isend before waiting on either; a blocking send before a "
        "blocking receive on every rank is a cycle nobody can leave.",
        "Peers are ranks in the group: dist.get_rank(group), dist.get_world_size(group), and "
        "dist.isend(t, group=group, group_dst=peer) / dist.irecv(t, group=group, group_src=peer).",
        "dt.collectives.ops has what each op means on each dtype: combine(out, a, b, op_name(op)) "
        "and finish(t, op_name(op), p) (AVG divides the finished sum once, by p).",
        "Zero-length chunks (fewer elements than ranks) need no message: skip them on both sides, "
        "and the counts still match.",
    ),
)
