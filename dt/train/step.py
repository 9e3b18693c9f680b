"""One training step, apart from the model: pipeline schedule, gradient sync, clipping, accounting.

    par = dt.parallelize(GPT(cfg), grid, ParallelPlan(tensor=gpt_plan(cfg, tp), blocks=gpt_blocks))
    optimizer = make_optimizer(par, Adam, zero=0, lr=1e-3)     # or 1, 2 (ZeRO over dp x cp), 3 (FSDP)
    step = TrainStep(par, optimizer, micro_batches=4, schedule="1f1b", clip=1.0)
    loss = step(tokens, targets)     # this dp rank's batch; returns the global batch's mean loss
    step.times, step.bytes_sent, step.stats

What one call does, in order:

1. the pipeline schedule (dt.parallel.pipeline: gpipe, 1f1b, interleaved) over
   this rank's chunks, each micro-batch's forward inside precision.autocast()
   and its loss scaled by precision.scale();
   Under context parallelism each rank keeps its zig-zag share of every sequence
   (dt.parallel.context.style.shard_sequence) and the plan's context styles
   match the positions and the loss's scale to it;
2. gradient sync over the dp x cp plane (dense gradients averaged): with DDP
   (dt.parallel.data_parallel) the buckets' all-reduces run during the last
   micro-batch's backward of each chunk, overlapped with the earlier layers'
   compute; with ZeRO (zero=1, 2) the optimizer reduce-scatters them instead.
   With experts (dt.parallel.expert.style) the ranks of the plane hold
   different experts, so no DDP wraps the chunks: after backward the dense
   gradients are averaged over dp x cp and each expert's summed over its
   replicas (grid.group("edp")), then divided by dp * cp (the style's doc says
   why; under ZeRO each part's reduce-scatter does it, dt.parallel.zero.parts);
   every micro-batch's balance loss is weighted by 1 / this rank's
   sequences (dt.models.moe.set_batch_sequences);
3. a weight two stages share (a tied embedding and head) summed over its stages
   (under ZeRO 2 too: its full gradient is kept for this, then reduce-scattered once);
4. precision.unscale_and_check(): False (an overflow) skips the optimizer step;
5. clipping by the global norm over every axis (dt.train.clip); under ZeRO
   the optimizer first reduce-scatters the gradients and the norm is summed
   from each rank's averaged shard (dt.train.clip.clip_sharded_norm);
6. the optimizer step (ZeRO's all-gather of the parameters inside);
7. the loss averaged over dp x cp on the last stage, broadcast along the pipeline.

Accounting: every byte is charged to the label of the package that moved it
(dt.parallel.pipeline.LABEL, dt.parallel.tensor.LABELS, dt.parallel.context.LABELS,
...); bytes under no package's label are shown as "other", never folded into one
(tests/test_trainer_accounting.py: 0 on every layout family). Times, as
dt train reports them: compute (forward, backward, optimizer), communication
(the layers' collectives, the exposed part of the gradient sync, the tied
sum, the loss) and bubble (waiting on pipeline neighbours).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from dt import transport
from dt.collectives import all_reduce, broadcast
from dt.collectives.ops import ReduceOp
from dt.device import clock
from dt.models.lm import lm_loss
from dt.models.moe import set_batch_sequences, set_loss_scale
from dt.parallel import context, data_parallel, pipeline
from dt.parallel import tensor as tp
from dt.parallel.buckets import all_reduce_buckets
from dt.parallel.context.style import shard_sequence
from dt.parallel.expert import router as expert_router
from dt.parallel.expert.style import EXPERT_GROUP, ExpertParallelMoE, split_parameters
from dt.parallel.grid import GRADIENT_SYNC
from dt.parallel.plan import Parallel
from dt.parallel.zero import ShardedOptimizer, ZeroOptimizer, ZeroParts
from dt.train.clip import clip_global_norm, clip_sharded_norm, counted_parameters, counts
from dt.transport import resolve_group

__all__ = ["LABELS", "TrainStep", "make_optimizer"]

# bytes_sent's kinds inside forward and backward, each the labels its package charges dt.traffic() with.
LABELS = {"pipeline": (pipeline.LABEL,), "tensor": tp.LABELS, "data": (data_parallel.LABEL,),
          "expert": (expert_router.LABEL,), "context": context.LABELS}


def make_optimizer(par: Parallel, optimizer_cls: type, zero: int = 0, **kwargs: Any) -> Any:
    """This rank's optimizer: `optimizer_cls` on its stage's parameters, sharded over dp x cp by ZeRO.

    With experts ZeRO shards each part over the ranks that hold it (dt.parallel.zero.parts):
    the dense parameters over dp x cp, this rank's experts over their replicas (edp).
    """
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"zero {zero}: 0 (DDP), 1 or 2 (ZeRO), 3 (FSDP)")
    if par.data_parallel != ("ddp" if zero == 0 else f"zero{zero}"):
        raise ValueError(f"zero {zero} with a plan whose data_parallel is {par.data_parallel!r}")
    if zero in (0, 3):  # DDP's replicas, or FSDP's shards (its reduce-scatters run in backward)
        return optimizer_cls(par.parameters(), **kwargs)
    plane = par.grid.group(*par.dp_axes, purpose=GRADIENT_SYNC)  # ZeRO 2 scatters on the gradient thread
    # A weight two stages share keeps its full gradient under ZeRO 2 too, for the step's tied sum.
    kept = {"keep_full": par.stage.shared} if zero == 2 else {}
    if not par.with_experts:
        return ZeroOptimizer(par.parameters(), optimizer_cls, stage=zero, group=plane, **kept, **kwargs)
    held = {id(p) for p in par.parameters()}
    dense, experts = ([p for p in part if id(p) in held] for part in split_parameters(par.model))
    edp = par.grid.group(EXPERT_GROUP, purpose=GRADIENT_SYNC)  # every rank makes it (collective)
    parts = [ZeroOptimizer(dense, optimizer_cls, stage=zero, group=plane, **kept, **kwargs)]
    if experts:  # an edp group's ranks hold the same experts: all of them have some, or none
        parts.append(ZeroOptimizer(experts, optimizer_cls, stage=zero, group=edp,
                                   divisor=par.grid.size(*par.dp_axes), **kwargs))
    return ZeroParts(parts)


class TrainStep:
    """step(tokens, targets) -> the global mean loss; the whole step of one rank (see the module doc)."""

    def __init__(self, par: Parallel, optimizer: Any, micro_batches: int = 1, schedule: str = "1f1b",
                 clip: float | None = None, precision: Any = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss):
        grid = par.grid
        self.par, self.grid, self.optimizer = par, grid, optimizer
        self.micro_batches, self.schedule, self.clip = micro_batches, schedule, clip
        self.precision, self.loss_fn = precision, loss_fn
        self.device = par.device
        coords = grid.coords()
        self.first = coords.get("pp", 0) == 0
        self.last = coords.get("pp", 0) == grid.sizes.get("pp", 1) - 1
        if "pp" not in grid.names:
            raise ValueError(f"TrainStep needs a pp axis in the grid (size 1 for none), got {grid}")
        self.pp_group = resolve_group(grid.group("pp"))
        headers = pipeline.header_groups(grid.groups("pp"))
        chunks = par.chunks
        self.pipe = pipeline.Pipeline(chunks[0] if len(chunks) == 1 else chunks, grid.group("pp"),
                                      header_groups=headers)
        self.dp_group = grid.group(*par.dp_axes)
        self.dp = grid.size(*par.dp_axes)
        self.world_group = grid.group(*grid.names)  # every rank: precision's verdict is one for all
        norm_axes = tuple(a for a in ("pp", "tp") if a in grid.names)
        self.norm_group = grid.group(*norm_axes)
        self.params = par.parameters()
        self.counted = counted_parameters(par.stage.chunks, coords.get("tp", 0), par.stage.saves)
        self.times = {"compute": 0.0, "bubble": 0.0, "communication": 0.0}
        self.bytes_sent = {kind: 0 for kind in (*LABELS, "tied embedding", "norm", "other")}
        self.stats: dict[str, Any] = {"peak_stash": 0, "skipped": 0, "grad_norm": None, "moe": {}}
        self._split_experts(par, optimizer)

    def _split_experts(self, par: Parallel, optimizer: Any) -> None:
        """This stage's experts apart from its dense parameters, and the groups they sync over."""
        held = {id(p) for p in self.params}
        dense, experts = split_parameters(par.model)
        self.experts = [p for p in experts if id(p) in held]
        self.dense = [p for p in dense if id(p) in held]
        self.moe = [m for c in par.stage.chunks for m in c.modules() if isinstance(m, ExpertParallelMoE)]
        # The whole model's (every rank alike, so all make the edp group): a stage holding no
        # expert still syncs its dense gradients here, not in DDP.
        self.with_experts = par.with_experts
        self.edp_group = self.grid.group(EXPERT_GROUP) if self.with_experts else None
        self.ep_group = self.grid.group("ep") if self.with_experts else None  # the experts' norm sums here
        if self.with_experts and par.ddp:
            raise ValueError("DDP would average (and first broadcast) the experts, which differ across "
                             "the plane's ranks: a plan with experts syncs in the step (data_parallel "
                             "'ddp' wraps no chunk, dt.parallel.plan)")
        if self.with_experts and isinstance(optimizer, ZeroOptimizer):
            raise ValueError("one ZeroOptimizer shards every gradient over one group, but an expert's "
                             "replicas are only its edp group: make_optimizer(par, ..., zero=1 or 2)")

    def _hooks(self) -> pipeline.MicroBatchHooks:
        ddp = self.par.chunks

        def before_backward(chunk: int, last: bool) -> None:
            if hasattr(ddp[chunk], "sync_next_backward"):
                ddp[chunk].sync_next_backward(last)  # only the chunk's last micro-batch synchronises

        p = self.precision
        return pipeline.MicroBatchHooks(autocast=p.autocast if p is not None else None,
                                        scale=p.scale if p is not None else None,
                                        before_backward=before_backward)

    def _inputs(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> tuple[Any, Any]:
        """This rank's share: whole sequences, or under cp its zig-zag share of each (the plan's
        context styles put the positions and the loss's scale to match)."""
        x = shard_sequence(tokens.to(self.device), self.grid) if tokens is not None and self.first else None
        y = shard_sequence(targets.to(self.device), self.grid) if targets is not None and self.last else None
        return x, y

    def __call__(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        x, y = self._inputs(tokens, targets)
        given = tokens if tokens is not None else targets
        if self.moe and given is not None:  # each micro-batch's balance loss: its share of the batch's
            set_batch_sequences(self.par.model, given.shape[0])
        if self.moe and self.precision is not None:  # its backward scaled as the task loss's is
            set_loss_scale(self.par.model, getattr(self.precision, "loss_scale", 1.0))
        self.optimizer.zero_grad()
        with contextlib.ExitStack() as no_sync, transport.traffic() as pipe_traffic:
            for d in self.par.ddp:  # the forward must not decide: backward does (before_backward)
                no_sync.enter_context(d.no_sync())
            loss = self.pipe.train_step(x, y, self.loss_fn, self.micro_batches, self.schedule,
                                        hooks=self._hooks())
        stats = self.pipe.stats
        self.stats["peak_stash"] = max(self.stats["peak_stash"], stats.peak_stash)
        exposed = sum(d.stats.exposed_s for d in self.par.ddp)  # inside backward: not compute
        t0 = clock(self.device)
        with transport.traffic() as expert_traffic:
            self._sync_experts()
        with transport.traffic() as tied_traffic:
            self._sum_shared()
        loss_value = self._global_loss(loss)
        comm = clock(self.device) - t0
        t_opt = clock(self.device)
        with transport.traffic() as opt_traffic:  # ZeRO's reduce-scatter and all-gather; the norm's sum
            self._update()
        opt_s = clock(self.device) - t_opt
        self._account(stats, pipe_traffic, tied_traffic, opt_traffic, exposed, comm, opt_s)
        self.bytes_sent["data"] += expert_traffic.bytes_sent
        self._count_routing()
        return loss_value

    def _sum_shared(self) -> None:
        """A weight two stages share: its gradient summed over them (under FSDP its shard's: each
        stage cuts it alike, dt.parallel.zero.fsdp's `separate`)."""
        stage = self.par.stage
        if stage.shared_group is None:
            return
        fsdp = self.par.fsdp
        held = [s for f in fsdp for s in f.shards_of(stage.shared)] if fsdp else stage.shared
        grads = [p.grad for p in held if p.grad is not None]
        all_reduce_buckets(grads, stage.shared_group, op=ReduceOp.SUM)

    def _sync_experts(self) -> None:
        """With experts: dense gradients averaged over dp x cp, experts summed over edp / (dp * cp).
        Under ZeRO its reduce-scatters do the same, over the same groups (make_optimizer), and
        under FSDP those of its backward."""
        if not self.with_experts or self.dp == 1 or isinstance(self.optimizer, ShardedOptimizer) or \
                self.par.fsdp:  # FSDP's reduce-scatters in backward did (dt.parallel.zero.fsdp's experts)
            return
        all_reduce_buckets([p.grad for p in self.dense if p.grad is not None], self.dp_group)
        grads = [p.grad for p in self.experts if p.grad is not None]
        all_reduce_buckets(grads, self.edp_group, op=ReduceOp.SUM)
        for g in grads:
            g.div_(self.dp)

    def _count_routing(self) -> None:
        """Routing totals of this stage's MoE layers since construction (the report's moe_stats)."""
        total: dict[str, int] = {}
        for m in self.moe:
            for k, v in m.counted.items():
                total[k] = total.get(k, 0) + v
        self.stats["moe"] = total

    def _counted_pieces(self) -> list[torch.Tensor]:
        """Under ZeRO or FSDP: the pieces of this rank's shard gradients that it adds to the norm."""
        if self.par.fsdp:
            tp_rank = self.grid.coords().get("tp", 0)
            stage = self.par.stage  # a shared weight is counted on its first stage
            others = {id(p) for p in stage.shared if not stage.saves(p)}
            return [g for f in self.par.fsdp for mod, name, g in f.shard_pieces(others)
                    if counts(mod, name, tp_rank)]
        mine = {id(p) for p in self.counted}
        return [g for p, g in self.optimizer.shard_pieces() if id(p) in mine]

    def _update(self) -> None:
        zero = isinstance(self.optimizer, ShardedOptimizer)
        sharded = zero or bool(self.par.fsdp)  # a shard is all
        if zero:
            self.optimizer.reduce_gradients()  # the averaged shard, before it is unscaled or clipped
            grads = self.optimizer.shard_gradients()
        else:  # DDP's averaged replicas, or FSDP's averaged shards
            grads = [p.grad for p in self.params if p.grad is not None]
        if self.precision is not None and not self.precision.unscale_and_check(grads, self.world_group):
            self.stats["skipped"] += 1  # an overflow: every rank skips alike (one verdict)
            return
        if self.clip is not None and sharded:
            self.stats["grad_norm"] = clip_sharded_norm(
                self._counted_pieces(), grads, self.clip, self.dp_group, self.norm_group, self.device)
        elif self.clip is not None:
            self.stats["grad_norm"] = clip_global_norm(
                self.counted, self.params, self.clip, self.norm_group, self.device, split=self.experts,
                split_group=self.ep_group)
        self.optimizer.step()

    def _global_loss(self, loss: float | None) -> float:
        """The global batch's mean loss on every rank: averaged over dp x cp, sent along the pipeline."""
        dtype = self.params[0].dtype if self.params else torch.float32
        loss_t = torch.tensor([loss if loss is not None else 0.0], dtype=dtype, device=self.device)
        if self.last and self.dp > 1:
            all_reduce(loss_t, op=ReduceOp.AVG, group=self.dp_group)
        if self.pp_group.size > 1:
            broadcast(loss_t, src=self.pp_group.global_rank(self.pp_group.size - 1), group=self.pp_group)
        return float(loss_t.item())

    def _account(self, stats: pipeline.PipelineStepStats, pipe: Any, tied: Any, opt: Any,
                 exposed: float, comm: float, opt_s: float) -> None:
        # The layers' blocking collectives, inside forward and backward; `seconds` also holds
        # the DDP thread's overlapped all-reduces (blocking there), which are not the layers'.
        layers_s = pipe.seconds - sum(d.stats.comm_s for d in self.par.ddp)
        self.times["compute"] += stats.compute_s - layers_s - exposed + opt_s - opt.seconds
        self.times["bubble"] += stats.idle_s
        self.times["communication"] += layers_s + exposed + comm + opt.seconds
        labelled = 0
        for kind, labels in LABELS.items():
            sent = sum(pipe.by_collective[label].bytes_sent for label in labels)
            self.bytes_sent[kind] += sent
            labelled += sent
        self.bytes_sent["other"] += pipe.bytes_sent - labelled  # under no package's label: shown
        norm = opt.by_collective["all_reduce"].bytes_sent  # the global norm's one sum
        self.bytes_sent["data"] += opt.bytes_sent - norm  # ZeRO's reduce-scatter and all-gather
        self.bytes_sent["norm"] += norm
        self.bytes_sent["tied embedding"] += tied.bytes_sent
