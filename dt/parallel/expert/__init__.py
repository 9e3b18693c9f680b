"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

The notebook's one-liner: data parallel is an all-reduce, ZeRO a
reduce-scatter and an all-gather, the pipeline point-to-point, and expert
parallelism an all-to-all. Tokens go to the rank of the expert the router
chose, and come back.

- router.py    top-k gating, capacity and dropped tokens, the Switch/GShard balance loss
- dispatch.py  the two all-to-alls (counts first, then rows with uneven splits) and the combine
- layer.py     ShardedMoE: router + dispatch + local experts + combine (the balance loss rides on the output:
               dt.models.moe.BalanceLoss, which ExpertParallel keeps)
- style.py     ExpertParallel: the plain model's MoE swapped for this one (dt.parallelize);
               split_parameters, EXPERT_GROUP, dense_axes: how a step syncs the gradients

What it costs: dt.cost.moe_layer_traffic (exact) and dt.cost.moe_all_to_all_bytes
(uniform routing).
"""

from dt.parallel.expert.dispatch import RoutingPlan, combine, dispatch
from dt.parallel.expert.layer import Expert, MoE, ShardedMoE
from dt.parallel.expert.router import Routing, ShardedRouter
from dt.parallel.expert.style import EXPERT_GROUP, ExpertParallel, dense_axes, split_parameters

__all__ = ["EXPERT_GROUP", "Expert", "ExpertParallel", "MoE", "Routing", "RoutingPlan", "ShardedMoE",
           "ShardedRouter", "combine", "dense_axes", "dispatch", "split_parameters"]
