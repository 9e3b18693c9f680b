"""Every collective, written from point-to-point send/recv.

One file per family of algorithms:

- ring.py     ring reduce-scatter / all-gather / all-reduce, chain broadcast; the reference
              ring first; ring_engine.py its schedule and its two drivers
- flat.py     one root talks to all: reduce, broadcast, gather, scatter, naive all-reduce
- bruck.py    latency-optimal all-gather (Bruck) and the dissemination barrier
- pairwise.py pairwise-exchange all-to-all
- doubling.py recursive doubling all-reduce / all-gather, Rabenseifner all-reduce
- hierarchical.py  two-level all-reduce / reduce-scatter / all-gather: inside each host, then
              across hosts among the ranks of a rail (dt.hosts)
- tree.py     binomial-tree broadcast and reduce, scatter + all-gather broadcast
- one_shot.py, one_shot_copy.py, two_shot.py   load/store algorithms over shared memory
              (a group on one host): one-shot all-reduce / reduce / reduce-scatter /
              barrier / all-gather / broadcast / all-to-all / gather / scatter, two-shot all-reduce

api.py holds the torch.distributed-shaped dispatchers, arguments.py what their
arguments mean, auto.py the choice of algorithm, validate.py the cross-rank
argument check, plan.py what a connected group decides once per call shape
(and the fast path that reuses it), ops.py the reductions.
Built on api.py, with torch.distributed's signatures too: sparse.py (sparse
COO all-reduce), coalesced.py (many tensors, one collective), objects.py
(picklable objects), monitored.py (the barrier that names missing ranks);
point-to-point (isend ... batch_isend_irecv) comes from dt.transport.
"""

from dt.collectives import (  # noqa: F401  (registers algorithms)
    bruck,
    doubling,
    flat,
    hierarchical,
    one_shot,
    one_shot_copy,
    pairwise,
    ring,
    tree,
    two_shot,
)
from dt.collectives.api import (
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    shm_empty,
)
from dt.collectives.bruck import bruck_all_gather, bruck_all_gather_into_tensor, dissemination_barrier
from dt.collectives.coalesced import all_gather_coalesced, all_reduce_coalesced
from dt.collectives.doubling import (
    rabenseifner_all_reduce,
    recursive_doubling_all_gather,
    recursive_doubling_all_gather_into_tensor,
    recursive_doubling_all_reduce,
)
from dt.collectives.flat import flat_broadcast, flat_gather, flat_reduce, flat_scatter, naive_all_reduce
from dt.collectives.hierarchical import (
    hierarchical_all_gather,
    hierarchical_all_reduce,
    hierarchical_reduce_scatter,
)
from dt.collectives.monitored import monitored_barrier
from dt.collectives.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from dt.collectives.one_shot import one_shot_all_reduce, one_shot_reduce_scatter
from dt.collectives.one_shot_copy import one_shot_all_gather, one_shot_all_to_all, one_shot_broadcast
from dt.collectives.ops import ReduceOp
from dt.collectives.pairwise import pairwise_all_to_all
from dt.collectives.registry import ALGORITHMS
from dt.collectives.ring import (
    reference_ring_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_broadcast,
    ring_pass,
    ring_reduce_scatter,
)
from dt.collectives.tree import binomial_broadcast, binomial_reduce, scatter_allgather_broadcast
from dt.collectives.two_shot import two_shot_all_reduce
from dt.transport import P2POp, batch_isend_irecv, irecv, isend, recv, send

__all__ = [
    "ALGORITHMS",
    "P2POp",
    "ReduceOp",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "binomial_broadcast",
    "binomial_reduce",
    "broadcast",
    "broadcast_object_list",
    "bruck_all_gather",
    "bruck_all_gather_into_tensor",
    "dissemination_barrier",
    "flat_broadcast",
    "flat_gather",
    "flat_reduce",
    "flat_scatter",
    "gather",
    "gather_object",
    "hierarchical_all_gather",
    "hierarchical_all_reduce",
    "hierarchical_reduce_scatter",
    "irecv",
    "isend",
    "monitored_barrier",
    "naive_all_reduce",
    "one_shot_all_gather",
    "one_shot_all_reduce",
    "one_shot_all_to_all",
    "one_shot_broadcast",
    "one_shot_reduce_scatter",
    "pairwise_all_to_all",
    "rabenseifner_all_reduce",
    "recursive_doubling_all_gather",
    "recursive_doubling_all_gather_into_tensor",
    "recursive_doubling_all_reduce",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "reference_ring_all_reduce",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_broadcast",
    "ring_pass",
    "ring_reduce_scatter",
    "scatter",
    "scatter_allgather_broadcast",
    "shm_empty",
    "two_shot_all_reduce",
    "scatter_object_list",
    "send",
    "send_object_list",
]
