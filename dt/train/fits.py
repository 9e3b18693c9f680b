"""Will `dt train`'s options fit in memory? A lower bound on what the run holds, checked up front.

A run whose options cannot fit (`--block-size 100000`: attention scores of
micro-batch x heads x T x T floats, 1.28 TB) would otherwise start its
processes and end in a traceback from the allocator. The bound counts only
what the run certainly holds, so it refuses nothing that could have fitted:

- attention scores: the softmax's output is kept for backward, one tensor of
  micro-batch x local heads x queries x keys per block of this rank's stage
  (ring attention: T/cp queries by T/cp keys a step, heads / tp; Ulysses:
  T by T, heads / (tp x cp)), for one micro-batch in flight;
- parameters, gradients and Adam's two moments of the transformer blocks
  (12 C^2 weights each: attention's 4 C^2 and the MLP's 8 C^2, an MLP per
  expert of this rank's share of --experts over --ep; split over tp and pp;
  dt.parallel.zero's formula).

On CPU every rank of the run shares this machine's memory; on a GPU each rank
has its own device, so one rank's bound is held to one device's free memory.
"""

from __future__ import annotations

import argparse
import math

import torch

from dt import args as args_
from dt.device import gpu_free
from dt.parallel.zero import zero_memory_formula
from dt.units import fmt_bytes

__all__ = ["memory_needed", "why_it_cannot_fit"]


def _scores(args: argparse.Namespace) -> tuple[int, int, int, int]:
    """(micro-batch, local heads, queries, keys) of one attention score tensor on one rank."""
    micro = math.ceil(args.batch_size // args.dp / args.micro_batches)
    if args.cp > 1 and args.cp_attention == "ulysses":
        return micro, args.n_head // (args.tp * args.cp), args.block_size, args.block_size
    t = args.block_size // args.cp
    return micro, args.n_head // args.tp, t, t


def _block_weights(args: argparse.Namespace) -> int:
    """One transformer block's weights on one rank: attention's 4 C^2 and 8 C^2 per MLP (one,
    or one per expert this rank holds: --experts over --ep), split over tp."""
    experts = max(1, args.experts // args.ep) if args.experts else 1
    return (4 + 8 * experts) * args.n_embd ** 2 // args.tp


def memory_needed(args: argparse.Namespace) -> dict[str, int]:
    """Bytes one rank certainly holds: {"scores": one tensor, "kept": all blocks', "state": params+}."""
    item = torch.finfo(getattr(torch, args.dtype)).bits // 8
    scores = math.prod(_scores(args)) * item
    blocks = max(1, args.n_layer // args.pp)  # this rank's stage holds at least its share
    psi = _block_weights(args) * blocks
    state = zero_memory_formula(psi, args.dp, args.zero, k=2 * item, param_bytes=item, grad_bytes=item)
    return {"scores": scores, "kept": scores * blocks, "state": int(sum(state.values()))}


def why_it_cannot_fit(args: argparse.Namespace, ranks_here: int, on_gpu: bool) -> str | None:
    """None when the lower bound fits; else one line: what is needed, what there is, what to change."""
    need = memory_needed(args)
    per_rank = need["kept"] + need["state"]
    total = per_rank if on_gpu else per_rank * ranks_here
    free = gpu_free("cuda") if on_gpu else args_.available_memory()
    if free is None or total <= free:
        return None
    where = (f"one GPU has {fmt_bytes(free)} free" if on_gpu else
             f"{ranks_here} rank{'s' if ranks_here > 1 else ''} on this machine, {fmt_bytes(free)} available")
    if need["state"] > need["kept"]:
        experts = f" with {args.experts} experts over --ep {args.ep}" if args.experts else ""
        return (f"this run cannot fit in memory: the weights, gradients and Adam's moments of its blocks "
                f"(--n-embd {args.n_embd}, --n-layer {args.n_layer}{experts}) are "
                f"{fmt_bytes(need['state'])} per rank, at least {fmt_bytes(per_rank)} with the attention "
                f"scores; {where} (lower --n-embd, --n-layer or --experts, or raise --tp, --pp, --ep "
                "or --zero)")
    b, h, q, k = _scores(args)
    return (f"this run cannot fit in memory: each attention score tensor is micro-batch {b} x heads {h} x "
            f"{q} x {k} (--block-size {args.block_size}) = {fmt_bytes(need['scores'])}, at least "
            f"{fmt_bytes(per_rank)} per rank with "
            f"the kept ones and the weights; {where} (lower --block-size or "
            "--batch-size, or raise --micro-batches or --cp)")
