"""What a mixture-of-experts layer moves: two all-to-alls forward, two backward.

An expert-parallel group of ep ranks holds the experts (split_sizes(E, ep):
rank q holds experts[q] of them). Each rank routes its tokens, then

1. counts: every rank tells every other how many rows it will send to each
   of its experts (int64, experts[q] numbers to rank q), so receivers can
   size their buffers: the token all-to-all has uneven splits;
2. dispatch: rank r sends rank q the rows (hidden numbers each) routed to
   q's experts: send_rows[q] of them, and receives recv_rows[q] from q;
3. combine: the experts' outputs go back the way they came.

Backward sends the gradients of 3 then of 2 the other way: the same bytes.
All of it is dt's pairwise all-to-all (dt.cost.pairwise_all_to_all).

With uniform routing and no drops, a rank with T tokens sends
T * k * (ep-1)/ep rows per token all-to-all: moe_all_to_all_bytes. GShard
and DeepSpeed pad every expert's buffer to its capacity C and always send
E * C rows; dt sends only the rows that were kept (uneven splits), so
dropped tokens also save bytes.
"""

from __future__ import annotations

from dt.cost.traffic import RankTraffic, pairwise_all_to_all

__all__ = ["COUNT_ITEMSIZE", "moe_all_to_all_bytes", "moe_layer_traffic"]

COUNT_ITEMSIZE = 8  # the per-expert row counts travel as int64


def moe_layer_traffic(send_rows: list[int], recv_rows: list[int], experts: list[int], hidden: int,
                      itemsize: int, rank: int) -> tuple[RankTraffic, RankTraffic]:
    """(forward, backward) all-to-all traffic of one MoE layer on `rank`, exactly.

    send_rows[q]: rows (kept token assignments) this rank sends to rank q's
    experts; recv_rows[q]: rows it receives from rank q; experts[q]: how many
    experts rank q holds. Forward = counts + dispatch + combine; backward =
    the two token all-to-alls reversed (same bytes, 2 (ep-1) steps).
    """
    p = len(experts)
    if not (len(send_rows) == len(recv_rows) == p and 0 <= rank < p):
        raise ValueError(f"send_rows {send_rows}, recv_rows {recv_rows} and experts {experts} "
                         f"must each have one entry per rank (rank {rank})")
    counts = pairwise_all_to_all(list(experts), [experts[rank]] * p, COUNT_ITEMSIZE, rank)
    send = [r * hidden for r in send_rows]
    recv = [r * hidden for r in recv_rows]
    dispatch = pairwise_all_to_all(send, recv, itemsize, rank)
    combine = pairwise_all_to_all(recv, send, itemsize, rank)
    return counts + dispatch + combine, combine + dispatch


def moe_all_to_all_bytes(tokens: int, hidden: int, top_k: int, ep: int, itemsize: int) -> float:
    """Bytes one rank sends in ONE token all-to-all, with uniform routing and no drops.

    tokens * top_k * (ep-1)/ep * hidden * itemsize: each of the tokens * top_k
    assignments goes to a uniformly chosen expert, (ep-1)/ep of them on another
    rank. A layer runs two forward (dispatch, combine) and two backward.
    """
    return tokens * top_k * (ep - 1) / ep * hidden * itemsize
