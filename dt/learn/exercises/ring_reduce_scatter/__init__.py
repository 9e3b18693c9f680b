"""Exercise: ring reduce-scatter, uneven blocks included."""

from dt.learn.exercises import Exercise

EXERCISE = Exercise(
    name="ring_reduce_scatter",
    title="Ring reduce-scatter, with blocks of any length",
    function="reduce_scatter",
    collective="reduce_scatter",
    target="ring",
    see="dt demo primitives   (what reduce_scatter leaves on each rank)",
    statement="""\
Write reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None) as
torch.distributed has it: input_list holds p tensors on every rank; on
return, rank r's output holds input_list[r] reduced over all ranks. The
blocks may differ in length (uneven shards: 3, 4, 5, 0, 1 elements; one
rank may hold everything). Do not modify input_list.

The ring does it in p-1 steps: every step each rank sends one partially
reduced block to its right and receives one from its left, reduces its own
input's copy of that block into it, and passes it on, so that block r
arrives complete at rank r. This is the first half of the ring all-reduce,
and half of its bytes.""",
    hints=(
        "Schedule: at step s rank r sends block (r-s-1) mod p and receives block (r-s-2) mod p; "
        "after p-1 steps the block it received last is its own, r.",
        "Keep the running partial sums in your own buffers (clones), not in input_list.",
        "Each message has the length of the block it carries: input_list[i].numel(), the same on "
        "every rank. Skip empty blocks on both sides.",
        "Reduce with dt.collectives.ops.combine(out, a, b, op_name(op)); AVG: finish(output, name, p) "
        "once, at the end.",
        "Peers by group rank: dist.isend(t, group=group, group_dst=(r + 1) % p).",
    ),
)
