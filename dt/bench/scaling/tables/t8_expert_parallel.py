"""Table 8: expert parallelism, the all-to-all's bytes and time per MoE layer vs ep and k.

One MoE layer (dt.parallel.expert) with its experts spread over ep ranks, each
rank routing its own tokens, forward and backward: the counts exchange, then
dispatch and combine forward, and their gradients back. Bytes per rank are
what the transport counted, next to dt.cost's figure for the routing the
router made (exact: dt.cost.moe_layer_traffic) and the uniform-routing model
(4 token all-to-alls of T k (ep-1)/ep rows: dt.cost.moe_all_to_all_bytes,
plus the counts). Dropped: assignments past an expert's capacity.
"""

from __future__ import annotations

from typing import Any

from dt import cost
from dt.bench import report as R
from dt.bench.scaling.layer_workers import moe_worker
from dt.bench.scaling.tables.base import Needs, Results, Run, Table, TableSpec, contention_notes

TITLE = "Expert parallel: all-to-all bytes and time per MoE layer vs ep and top-k"


def label(ep: int) -> str:
    return f"MoE layer ep={ep}"


def needs(s: Any) -> Needs:
    return Needs(runs={label(ep): Run(ep, moe_worker, (s.moe_tokens, s.moe_hidden, s.moe_experts,
                                                       s.moe_top_ks, s.moe_capacity, s.moe_reps, 1))
                       for ep in s.moe_worlds})


def uniform_bytes(s: Any, ep: int, k: int) -> float:
    """Per rank and layer with uniform routing and no drops: four token all-to-alls and the counts."""
    held = cost.split_sizes(s.moe_experts, ep)
    counts = (s.moe_experts - held[0]) * cost.COUNT_ITEMSIZE if ep > 1 else 0
    return 4 * cost.moe_all_to_all_bytes(s.moe_tokens, s.moe_hidden, k, ep, 4) + counts


def build(st: Results) -> Table:
    s, rows, data = st.s, [], []
    for ep in s.moe_worlds:
        res = st.runs.get(label(ep))
        for k in s.moe_top_ks:
            if res is None:
                rows.append([ep, k] + ["not measured"] + ["-"] * 7)
                continue
            first = [r[k][0] for r in res]  # routing is the same every repetition
            sent = [f["bytes_sent"] for f in first]
            exact = [f["model_exact"] for f in first]
            dropped = sum(f["dropped"] for f in first) / sum(f["assignments"] for f in first)
            step = R.Stat.of(R.per_rep_max([[x["step"] for x in r[k]] for r in res]))
            comm = R.Stat.of(R.per_rep_max([[x["comm"] for x in r[k]] for r in res]))
            uniform = uniform_bytes(s, ep, k)
            rows.append([ep, k, R.fmt_pct(dropped, 1), R.fmt_bytes(max(sent)),
                         "yes" if sent == exact else "NO", R.fmt_bytes(uniform),
                         max(f["messages_sent"] for f in first), R.fmt_stat_time(comm),
                         R.fmt_stat_time(step), R.fmt_pct(comm.median / step.median)])
            data.append({"ep": ep, "top_k": k, "dropped": dropped, "bytes_sent_per_rank": sent,
                         "model_exact_per_rank": exact, "model_uniform": uniform,
                         "comm": comm, "step": step})
    notes = [f"one MoE layer: {s.moe_experts} experts (Linear {s.moe_hidden} -> {2 * s.moe_hidden} -> "
             f"{s.moe_hidden}, float32) over ep ranks, {s.moe_tokens} tokens per rank (each rank its "
             f"own), capacity factor {s.moe_capacity}; forward + backward, one thread per rank, "
             "median over repetitions of the slowest rank.",
             "bytes/rank: the most any rank sent (counts + dispatch + combine forward, both token "
             "all-to-alls again backward); = dt.cost: every rank's count equals "
             "dt.cost.moe_layer_traffic for the routing the router made; uniform model: "
             "4 T k (ep-1)/ep h itemsize + the counts. Dropped assignments are not sent, so drops "
             "save bytes (GShard pads every expert to its capacity instead).",
             "all-to-all time: seconds blocked in the layer's collectives (dt.traffic().seconds), "
             "its share of the layer's step beside it. ep=1 moves nothing."]
    notes += contention_notes(s.moe_worlds, st.cores)
    return Table(8, TITLE, ["ep", "top-k", "dropped", "bytes/rank", "= dt.cost", "uniform model",
                            "messages/rank", "all-to-all time", "layer fwd+bwd", "comm share"],
                 rows, notes, data)


SPEC = TableSpec(8, TITLE, needs, build)
