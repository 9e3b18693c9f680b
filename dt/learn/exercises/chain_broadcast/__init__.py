"""Exercise: broadcast down a chain."""

from dt.learn.exercises import Exercise

EXERCISE = Exercise(
    name="chain_broadcast",
    title="Broadcast down a chain",
    function="broadcast",
    collective="broadcast",
    target="ring",
    see="dt model broadcast --size 1MB,1GB --world 8   (chain, tree, scatter+all-gather)",
    statement="""\
Write broadcast(tensor, src, group=None) as torch.distributed has it: on
return every rank's tensor holds what `src`'s held. `src` is a global rank,
as in torch, and need not be 0 (nor, in a subgroup, a member's rank 0).

The chain: number the ranks from the root, v = (r - root) mod p. Rank v
receives the tensor from v-1 and sends it to v+1; the root only sends, the
last only receives. No rank sends more than the tensor once, the least any
rank can: the chain is what the bytes are held to. It pays p-1 hops of
latency (the tree exercise pays lg p).""",
    hints=(
        "The root's group rank: dist.get_group_rank(group, src) for a subgroup, src itself for the "
        "world (group=None).",
        "Relative rank v = (r - root) % p; the previous in the chain is (r - 1) % p, the next (r + 1) % p.",
        "Receive (if v > 0) before you send (if v < p - 1): that order is the chain.",
        "An empty tensor needs no message.",
    ),
)
