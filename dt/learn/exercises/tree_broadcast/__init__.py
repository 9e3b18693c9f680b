"""Exercise: broadcast down a binomial tree."""

from dt.learn.exercises import Exercise

EXERCISE = Exercise(
    name="tree_broadcast",
    title="Broadcast down a binomial tree",
    function="broadcast",
    collective="broadcast",
    target="binomial",
    see="dt model broadcast --size 1KB,1GB --world 8   (the tree wins small, the chain large)",
    statement="""\
Write broadcast(tensor, src, group=None) again, as a binomial tree: in
ceil(lg p) rounds the set of ranks holding the data doubles. Number the
ranks from the root, v = (r - root) mod p. Rank v's parent is v with its
lowest set bit cleared; its children are v + 2^k for every 2^k below that
bit (while v + 2^k < p). Receive from your parent, then send to your
children, largest subtree first.

The tree pays ceil(lg p) steps of latency where the chain pays p-1, but the
root sends the whole tensor ceil(lg p) times: the judge holds your bytes to
the tree's figure, not the chain's.""",
    hints=(
        "dt.layout.lowest_bit(v, p) and dt.layout.children(v, p) are this tree (the one dt's "
        "binomial broadcast and its cost model share).",
        "A rank's peers are relative ranks: the real group rank of relative rank u is (u + root) % p.",
        "The root's group rank: dist.get_group_rank(group, src), or src for the world.",
        "Post every child's send with isend, then wait on them all.",
    ),
)
