"""Experts in `dt train`: still dt.models.gpt.ParallelGPT's own step.

Until dt.train.step syncs expert gradients (summed over edp) and checkpoints
experts by their global index, a run with --experts builds ParallelGPT (model and step at once) and
this adapter gives it the interface of dt.train.step.TrainStep: one call is
one whole step, with .times, .bytes_sent and .stats.
"""

from __future__ import annotations

import argparse
from typing import Any

from dt.device import clock
from dt.models.gpt import GPTConfig, ParallelGPT
from dt.parallel.mesh import mesh as build_mesh
from dt.train.optim import Adam
from dt.train.placement import LAYOUTS

__all__ = ["LegacyStep", "build_legacy"]


class LegacyStep:
    """ParallelGPT's train_step and the optimizer's step, as one call."""

    def __init__(self, model: ParallelGPT, optimizer: Any):
        self.model, self.optimizer = model, optimizer
        self.times, self.bytes_sent = model.times, model.bytes_sent
        self.stats: dict[str, Any] = {"peak_stash": 0, "moe": {}}

    def __call__(self, tokens: Any, targets: Any) -> float:
        self.optimizer.zero_grad()
        loss = self.model.train_step(tokens, targets)
        t0 = clock(self.model.device)
        self.optimizer.step()
        self.times["compute"] += clock(self.model.device) - t0
        self.stats["peak_stash"] = max(self.stats["peak_stash"], self.model.pipe.stats.peak_stash)
        self.stats["moe"] = self.model.moe_stats()
        return loss


def build_legacy(args: argparse.Namespace, vocab_size: int) -> dict[str, Any]:
    """dt.train.build.Built's fields for a ParallelGPT run."""
    m = build_mesh(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
                   tp_across=LAYOUTS[getattr(args, "layout", "tp-inside")])
    cfg = GPTConfig(vocab_size=vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd, tied=not args.untied, seed=args.seed,
                    dtype=args.dtype, n_experts=args.experts, top_k=args.top_k,
                    capacity_factor=args.capacity_factor, aux_loss_coef=args.aux_loss_coef)
    model = ParallelGPT(cfg, m, micro_batches=args.micro_batches, schedule=args.schedule,
                        virtual=args.virtual, cp_attention=args.cp_attention)
    optimizer = Adam(model.stage.parameters(), lr=args.lr)  # --zero needs cp = 1, no experts (cli)
    params = list(model.stage.parameters())
    return {"step": LegacyStep(model, optimizer), "optimizer": optimizer, "saved": model, "cfg": cfg,
            "rank": m.rank, "coords": m.coords(), "device": model.device, "world": m.world,
            "parameters": params}
