"""What `dt train` trains: the plain model, its grid, the plan applied, the step and its optimizer.

    run = build(args, vocab_size)
    loss = run.step(tokens, targets)        # one whole step (dt.train.step.TrainStep)

The model is plain (dt.models.gpt.GPT or dt.models.llama.Llama, `--model`),
built from the seed on every rank; dt.parallelize applies the grid's
parallelism to it in its fixed order (dt.parallel.plan), and under pp > 1 a
rank then keeps only its stage's layers (dt.parallel.pipeline.cut). With --experts
every block's MLP is a mixture of experts (dt.models.moe), expert parallel
over the grid's ep split of the dp x cp plane (dt.parallel.expert.style).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import torch

from dt.models.gpt import GPT, GPTConfig
from dt.models.llama import Llama, LlamaConfig
from dt.parallel.grid import Grid
from dt.parallel.plan import (
    Parallel,
    ParallelPlan,
    gpt_blocks,
    gpt_context,
    gpt_experts,
    gpt_plan,
    gpt_recompute,
    llama_blocks,
    llama_context,
    llama_plan,
    llama_recompute,
    parallelize,
)
from dt.train.optim import Adam
from dt.train.precision import Precision
from dt.train.step import TrainStep, make_optimizer

__all__ = ["Built", "build", "grid_of", "plain_model"]


@dataclass
class Built:
    """One rank's run: the step to call, its optimizer, and the parallelized model they step."""

    step: TrainStep  # step(tokens, targets) -> loss; .times, .bytes_sent, .stats
    optimizer: Any  # make_optimizer's: Adam, or ZeRO's sharded optimizer around it
    parallel_model: Parallel  # this rank's share of the model: what checkpoints save and load
    cfg: GPTConfig | LlamaConfig  # the model's config, recorded in checkpoints
    rank: int
    coords: tuple[int, int, int, int, int]  # (dp, tp, pp, cp, ep): the report's order
    device: torch.device
    world: int
    parameters: list[torch.nn.Parameter]


def grid_of(args: argparse.Namespace) -> Grid:
    """The run's grid: pp, dp, cp, tp (tp innermost, or outermost with --layout tp-across)."""
    sizes = {"pp": args.pp, "dp": args.dp, "cp": args.cp, "tp": args.tp}
    return Grid(sizes, order=getattr(args, "layout", "tp-inside"), ep=args.ep)


def plain_model(args: argparse.Namespace, vocab_size: int) -> tuple[torch.nn.Module, Any]:
    """The plain model `args` describe, and its config."""
    common = {"vocab_size": vocab_size, "block_size": args.block_size, "n_layer": args.n_layer,
              "n_head": args.n_head, "n_embd": args.n_embd, "tied": not args.untied, "seed": args.seed,
              "dtype": args.dtype}
    if getattr(args, "model", "gpt") == "llama":
        cfg = LlamaConfig(**common, n_kv_head=args.n_kv_head or args.n_head)
        return Llama(cfg), cfg
    experts = {"n_experts": args.experts, "top_k": args.top_k, "capacity_factor": args.capacity_factor,
               "aux_loss_coef": args.aux_loss_coef} if args.experts else {}
    cfg = GPTConfig(**common, **experts)
    return GPT(cfg), cfg


def _precision(args: argparse.Namespace, device: torch.device) -> Precision | None:
    """--precision's autocast and loss scale (dt.train.precision); None for float32 (nothing to do)."""
    kind = getattr(args, "precision", "float32")
    return None if kind == "float32" else Precision(kind, device)


def build(args: argparse.Namespace, vocab_size: int) -> Built:
    """Collective over the world: every rank builds the model and makes the grid's groups."""
    grid = grid_of(args)
    model, cfg = plain_model(args, vocab_size)
    llama = isinstance(model, Llama)
    # --recompute: "none", "selective", "full"; a bool where a layout gives one (True: "full")
    recompute = (llama_recompute if llama else gpt_recompute)(cfg, getattr(args, "recompute", False))
    context = (llama_context if llama else gpt_context)(cfg, args.tp, args.cp, args.cp_attention)
    sp = getattr(args, "sequence_parallel", False)
    tensor = llama_plan(cfg, args.tp, sp) if llama else gpt_plan(cfg, args.tp, sp, experts=False)
    plan = ParallelPlan(tensor=tensor, context=context, experts={} if llama else gpt_experts(cfg),
                        recompute=recompute, blocks=llama_blocks if llama else gpt_blocks,
                        virtual=args.virtual, prefetch=not getattr(args, "no_prefetch", False),
                        data_parallel="ddp" if not args.zero else f"zero{args.zero}")
    par = parallelize(model, grid, plan)
    optimizer = make_optimizer(par, Adam, zero=args.zero, lr=args.lr)
    step = TrainStep(par, optimizer, micro_batches=args.micro_batches, schedule=args.schedule,
                     clip=getattr(args, "clip", None), loss_fn=model.loss,  # the plan may have swapped it
                     precision=_precision(args, par.device))
    c = grid.coords()
    return Built(step, optimizer, par, cfg, grid.rank, (c["dp"], c["tp"], c["pp"], c["cp"], c["ep"]),
                 par.device, grid.world, par.parameters())
