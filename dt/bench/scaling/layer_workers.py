"""Rank workers for the all-to-all parallelisms' tables (8: expert parallel, 9: context parallel).

Each times one layer forward and backward, repeatedly, with the configurations
taking turns within each repetition (so a drift in the machine's load hits
them alike), and returns this rank's raw figures: seconds per repetition, the
seconds spent blocked in the layer's communication (dt.traffic().seconds), and
the bytes and messages the transport counted next to what dt.cost predicts
for this rank. Validation is off while timing, and every rank computes on one
thread (one core per rank, whatever the world size: a world-1 process with
the machine's threads would race a loaded machine's other work, not the
algorithm).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from dt import cost, transport
from dt.bench.harness import barrier
from dt.device import clock
from dt.layout import SequenceLayout, edges, split_sizes
from dt.parallel.context import attention, ring_attention, ulysses_attention
from dt.parallel.expert import ShardedMoE

__all__ = ["attention_worker", "moe_worker"]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)  # a pool's worker is reused by the next measurement


def moe_worker(tokens: int, hidden: int, experts: int, top_ks: Sequence[int],
               capacity_factor: float | None, reps: int, warmup: int) -> dict[int, list[dict[str, float]]]:
    """One MoE layer (ep = the world) on `tokens` tokens per rank, for each top_k.

    Per repetition and k: the layer's forward + backward seconds, the seconds
    blocked in its all-to-alls, its bytes and messages sent (dt.traffic(),
    "moe"), the exact model for the routing it made (dt.cost.moe_layer_traffic)
    and the assignments it dropped.
    """
    transport.set_validation(False)
    with _one_thread():
        return _moe(tokens, hidden, experts, top_ks, capacity_factor, reps, warmup)


def _moe(tokens: int, hidden: int, experts: int, top_ks: Sequence[int], capacity_factor: float | None,
         reps: int, warmup: int) -> dict[int, list[dict[str, float]]]:
    r = dist.get_rank()
    device = transport.default_device(transport.resolve_group(None))  # the rank's GPU under NCCL
    layers, inputs = {}, {}
    for k in top_ks:
        torch.manual_seed(0)
        layers[k] = ShardedMoE(hidden, 2 * hidden, experts, k, capacity_factor).to(device)
        gen = torch.Generator().manual_seed(1 + r)  # each rank its own tokens
        inputs[k] = torch.randn(1, tokens, hidden, generator=gen).to(device)
    out: dict[int, list[dict[str, float]]] = {k: [] for k in top_ks}
    for it in range(warmup + reps):
        order = list(top_ks)[it % len(top_ks):] + list(top_ks)[:it % len(top_ks)]
        for k in order:
            layer, x = layers[k], inputs[k].clone().requires_grad_(True)
            barrier()
            t0 = clock(device)
            with transport.traffic() as t:
                y = layer(x)
                y.sum().backward()
            step = clock(device) - t0
            layer.zero_grad(set_to_none=True)
            if it < warmup:
                continue
            plan, routing = layer.plan, layer.routing
            fwd, bwd = cost.moe_layer_traffic(plan.send_rows, plan.recv_rows, plan.experts, hidden,
                                              x.element_size(), r)
            moe = t.by_collective["moe"]
            out[k].append({"step": step, "comm": t.seconds, "bytes_sent": moe.bytes_sent,
                           "messages_sent": moe.messages_sent,
                           "model_exact": fwd.bytes_sent + bwd.bytes_sent,
                           "dropped": routing.stats["dropped"],
                           "assignments": routing.stats["assignments"]})
    return out


def attention_worker(seq_lens: Sequence[int], batch: int, heads: int, head_dim: int, reps: int,
                     warmup: int) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Causal attention forward + backward over sequences split (zig-zag) over the world.

    Methods: "ring", "ulysses" on every rank, and "none": the whole sequence
    on rank 0 alone while the others wait (one process). The one process cuts
    the sequence into the same 2p chunks and skips the masked chunk pairs as
    the ranks do (flash attention's block skipping), so all three do the same
    arithmetic. Per repetition: seconds, seconds blocked communicating, bytes
    and messages sent by this rank, and dt.cost's figure for them.
    """
    transport.set_validation(False)
    with _one_thread():
        return _attention(seq_lens, batch, heads, head_dim, reps, warmup)


def _attention(seq_lens: Sequence[int], batch: int, heads: int, head_dim: int, reps: int,
               warmup: int) -> dict[tuple[str, int], list[dict[str, float]]]:
    r, p = dist.get_rank(), dist.get_world_size()
    device = transport.default_device(transport.resolve_group(None))
    methods = ("none", "ring", "ulysses") if p > 1 else ("none",)
    out: dict[tuple[str, int], list[dict[str, float]]] = {}
    for S in seq_lens:
        layout = SequenceLayout(S, p, zigzag=True)
        e = edges(split_sizes(S, 2 * p))
        whole = [(e[i], e[i + 1]) for i in range(2 * p)]  # in order: one process, same blocks
        gen = torch.Generator().manual_seed(S)
        full = [torch.randn(batch, heads, S, head_dim, generator=gen).to(device) for _ in range(4)]
        pos = torch.tensor(layout.positions(r), device=device)
        mine = [t[:, :, pos].contiguous() for t in full]
        model = {"ring": cost.ring_attention_traffic, "ulysses": cost.ulysses_traffic}
        for it in range(warmup + reps):
            for method in methods[it % len(methods):] + methods[:it % len(methods)]:
                barrier()
                if method == "none" and r != 0:
                    barrier()  # rank 0 times the single-process attention alone
                    continue
                src = full if method == "none" else mine
                q, k, v = (t.clone().requires_grad_(True) for t in src[:3])
                t0 = clock(device)
                with transport.traffic() as t:
                    if method == "none":
                        o = attention(q, k, v, whole, whole, causal=True)
                    else:
                        fn = ring_attention if method == "ring" else ulysses_attention
                        o = fn(q, k, v, layout=layout, causal=True)
                    (o * src[3]).sum().backward()
                step = clock(device) - t0
                if method == "none":
                    barrier()
                if it < warmup:
                    continue
                entry: dict[str, float] = {"step": step, "comm": t.seconds, "bytes_sent": t.bytes_sent,
                                           "messages_sent": t.messages_sent, "model": 0.0}
                if method in model:
                    fwd, bwd = model[method](layout.sizes(), batch, heads, head_dim, 4, r)
                    entry["model"] = fwd.bytes_sent + bwd.bytes_sent
                out.setdefault((method, S), []).append(entry)
    return out
