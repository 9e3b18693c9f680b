"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

The notebook's one-liner: data parallel is an all-reduce, ZeRO a
reduce-scatter and an all-gather, the pipeline point-to-point, and expert
parallelism an all-to-all. Tokens go to the rank of the expert the router
chose, and come back.

- router.py    top-k gating, capacity and dropped tokens, the Switch/GShard balance loss
- dispatch.py  the two all-to-alls (counts first, then rows with uneven splits) and the combine
- layer.py     MoE: router + dispatch + local experts + combine; attach_loss for the balance loss

What it costs: dt.cost.moe_layer_traffic (exact) and dt.cost.moe_all_to_all_bytes
(uniform routing).
"""

from dt.parallel.expert.dispatch import Plan, combine, dispatch
from dt.parallel.expert.layer import Expert, MoE, attach_loss
from dt.parallel.expert.router import Router, Routing

__all__ = ["Expert", "MoE", "Plan", "Router", "Routing", "attach_loss", "combine", "dispatch"]
