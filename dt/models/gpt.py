"""A small GPT written once, run on any dp x cp x ep x tp x pp mesh.

    m = dt.mesh(dp=2, tp=2, pp=2)
    gpt = ParallelGPT(GPTConfig(vocab_size=40), m, micro_batches=4)
    loss = gpt.train_step(tokens, targets)     # tokens: this dp rank's slice
    optimizer.step()

    m = dt.mesh(dp=2, cp=2, ep=2, pp=2)        # long sequences, experts
    gpt = ParallelGPT(GPTConfig(vocab_size=40, n_experts=4, top_k=2), m, cp_attention="ulysses")

The model is a list of layers, [Embedding, Block x n_layer, Head], so the
pipeline can cut it anywhere (dt.parallel.pipeline.partition). Every matrix is a
dt.parallel.tensor layer on the mesh's tensor-parallel group: at tp=1 they
are plain layers (no communication), at tp>1 each block costs one all-reduce
forward and one backward in attention and again in the MLP, Megatron-style.

Seeds: layer i, part j is built right after torch.manual_seed(seed, i, j),
and the tensor-parallel layers hold the slices of the full layer built after
the same seed, so every mesh holds the same model as a single process: a run
on 2 x 2 x 2 follows the 1 x 1 x 1 loss trajectory to rounding.

Per step, on top of the pipeline's activations (dt.parallel.pipeline) and the
tensor-parallel all-reduces (dt.parallel.tensor), data parallelism all-reduces
every gradient of this rank's stage shard over the dp group, in buckets
(dt.parallel.buckets): 2(dp-1)/dp of the shard's gradient bytes sent per rank
with the ring. A tied head on another pipeline
stage than the embedding adds one all-reduce of the embedding gradient (the
vocab shard) over the 2-rank group {first stage, last stage}.

Context parallel (cp > 1): each rank of the cp group holds its zig-zag share
of every sequence (dt.layout.SequenceLayout over block_size) from the
embedding (position ids included) to the loss; only attention crosses ranks
(dt.parallel.context: ring attention or Ulysses). The per-token loss is summed
and scaled so that averaging over the cp ranks gives the whole sequences' mean.

Mixture of experts (n_experts > 0): every block's MLP is a dt.parallel.expert
MoE over the mesh's ep group (replicated over tp: its tokens are), whose
balance loss, weighted aux_loss_coef / (sequences on this rank), is attached
to its output (dt.parallel.expert.attach_loss), so its gradient flows on the
stage that owns it. Capacity and the balance loss are per sequence, so drops
and the loss do not depend on the mesh either.

Gradients: dense parameters are averaged over the dp x cp plane
(mesh.dp_cp_group); experts are summed over the ranks holding the same
experts (mesh.edp_group) and divided by dp * cp (see dt.parallel.mesh).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dt import transport
from dt.collectives import all_reduce, broadcast
from dt.collectives.ops import ReduceOp
from dt.device import clock
from dt.layout import SequenceLayout, split_sizes
from dt.models.nanogpt import seed_layer
from dt.parallel import pipeline
from dt.parallel import tensor as tp
from dt.parallel.buckets import all_reduce_buckets
from dt.parallel.checkpoint import Place, tensor_parallel_places
from dt.parallel.context import ContextParallelSelfAttention
from dt.parallel.expert import MoE, attach_loss
from dt.parallel.mesh import Mesh
from dt.transport import default_device, resolve_group

__all__ = ["GPTConfig", "ParallelGPT", "Placement", "gpt_layers"]


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    tied: bool = True
    seed: int = 0
    dtype: str = "float32"
    n_experts: int = 0  # > 0: every block's MLP is a mixture of this many experts
    top_k: int = 1
    capacity_factor: float | None = None  # None: no token is ever dropped
    aux_loss_coef: float = 0.01  # weight of the load-balancing loss

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Placement:
    """Where this rank's layers run: its tensor-parallel group, its share of each
    sequence (cp) and its expert-parallel group."""

    tp_group: Any = None
    cp_group: Any = None  # None: whole sequences here
    layout: SequenceLayout | None = None  # this rank's tokens, when cp > 1
    cp_attention: str = "ring"
    ep_group: Any = None  # None: every expert here

    @classmethod
    def of(cls, mesh: Mesh, cfg: GPTConfig, cp_attention: str = "ring") -> Placement:
        layout = SequenceLayout(cfg.block_size, mesh.cp, zigzag=True) if mesh.cp > 1 else None
        return cls(mesh.tp_group, mesh.cp_group if mesh.cp > 1 else None, layout, cp_attention,
                   mesh.ep_group)


def _seed(cfg: GPTConfig, layer: int, part: int) -> None:
    seed_layer(cfg, layer, part)  # the plain GPT's rule: both build the same weights


class Embedding(nn.Module):
    """Token (vocab-parallel) plus position embedding: [b, s] ids -> [b, s, h].

    Under context parallelism the ids are this rank's tokens, at the layout's positions.
    """

    def __init__(self, cfg: GPTConfig, place: Placement, layer: int):
        super().__init__()
        self.wte = _word_embedding(cfg, place.tp_group, layer)
        _seed(cfg, layer, 1)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        with torch.no_grad():
            self.wpe.weight.mul_(0.02)
        cp_rank = resolve_group(place.cp_group).rank if place.layout is not None else 0
        self.positions = place.layout.positions(cp_rank) if place.layout is not None else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.tensor(self.positions, device=ids.device) if self.positions is not None else \
            torch.arange(ids.shape[1], device=ids.device)
        return self.wte(ids) + self.wpe(pos)


def _word_embedding(cfg: GPTConfig, tp_group: Any, layer: int) -> tp.VocabParallelEmbedding:
    _seed(cfg, layer, 0)
    wte = tp.VocabParallelEmbedding(cfg.vocab_size, cfg.n_embd, tp_group)
    with torch.no_grad():
        wte.weight.mul_(0.02)  # GPT-2's scale; nn.Embedding's N(0, 1) makes huge tied logits
    return wte


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); the MLP may be an MoE."""

    def __init__(self, cfg: GPTConfig, place: Placement, layer: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.place = place
        _seed(cfg, layer, 0)
        if place.cp_group is not None:
            self.attn = ContextParallelSelfAttention(cfg.n_embd, cfg.n_head, place.tp_group, place.cp_group,
                                                     place.layout, place.cp_attention)
        else:
            self.attn = tp.ParallelSelfAttention(cfg.n_embd, cfg.n_head, place.tp_group, causal=True)
        _seed(cfg, layer, 1)
        if cfg.n_experts:
            self.mlp = MoE(cfg.n_embd, 4 * cfg.n_embd, cfg.n_experts, cfg.top_k, cfg.capacity_factor,
                           place.ep_group)
        else:
            self.mlp = tp.ParallelMLP(cfg.n_embd, 4 * cfg.n_embd, place.tp_group)
        self.aux_weight = 0.0  # the balance loss's weight; ParallelGPT sets it every step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        if not isinstance(self.mlp, MoE):
            return x + self.mlp(self.ln_2(x))
        y = self.mlp(self.ln_2(x), self.place.cp_group, self.place.layout)
        return x + attach_loss(y, self.mlp.routing.aux_per_sequence.sum() * self.aux_weight)


class Head(nn.Module):
    """Final layer norm and the vocab-parallel output projection: [b, s, h] -> [b, s, V/tp]."""

    def __init__(self, cfg: GPTConfig, tp_group: Any, layer: int, wte: nn.Parameter | None):
        super().__init__()
        self.group = resolve_group(tp_group)
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.weight: nn.Parameter | None = None
        self.lm_head: tp.ColumnParallelLinear | None = None
        if cfg.tied:
            # The embedding's own weight when on this stage; else a copy built
            # from the embedding's seed, its gradient summed with the original's.
            self.weight = wte if wte is not None else _word_embedding(cfg, tp_group, 0).weight
            self.sizes = split_sizes(cfg.vocab_size, self.group.size)
            self.shard_dims = {"weight": 0}  # the embedding's vocabulary rows (checkpoints)
        else:
            _seed(cfg, layer, 0)
            self.lm_head = tp.ColumnParallelLinear(cfg.n_embd, cfg.vocab_size, bias=False,
                                                   group=tp_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_f(x)
        if self.lm_head is not None:
            return self.lm_head(x)  # column parallel: each rank its slice of the vocabulary
        x = tp.copy_to_region(x, self.group)  # f: the input gradient is all-reduced
        return F.linear(x, self.weight)  # the embedding's vocab rows are the same slice


def gpt_layers(cfg: GPTConfig, place: Placement, layers: Sequence[int] | None = None) -> list[nn.Module]:
    """Layers `layers` (default all) of the n_layer + 2 that make the model."""
    n = cfg.n_layer + 2
    layers = range(n) if layers is None else layers
    dtype = getattr(torch, cfg.dtype)
    out: dict[int, nn.Module] = {}
    for i in layers:
        if i == 0:
            out[i] = Embedding(cfg, place, i)
        elif i == n - 1:
            wte = out[0].wte.weight if 0 in out else None
            out[i] = Head(cfg, place.tp_group, i, wte)
        else:
            out[i] = Block(cfg, place, i)
    return [out[i].to(dtype) for i in layers]


def _grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


class ParallelGPT(nn.Module):
    """This rank's stage of the GPT on `mesh`, and one training step across the mesh."""

    def __init__(self, cfg: GPTConfig, mesh: Mesh, micro_batches: int = 1,
                 schedule: str = "1f1b", stage_sizes: list[int] | None = None, virtual: int = 1,
                 cp_attention: str = "ring"):
        super().__init__()
        self.cfg, self.mesh = cfg, mesh
        self.micro_batches, self.schedule = micro_batches, schedule
        self.place = Placement.of(mesh, cfg, cp_attention)
        # This rank's chunks: parts c*pp + pp_rank of the model cut into pp*virtual.
        ranges = pipeline.stage_layers(cfg.n_layer + 2, mesh.pp, mesh.pp_rank, stage_sizes, virtual)
        self.layer_ranges = ranges
        layers = iter(gpt_layers(cfg, self.place, [i for r in ranges for i in r]))
        chunks = [nn.Sequential(*[next(layers) for _ in r]) for r in ranges]
        self.tp_group = resolve_group(mesh.tp_group)
        self.device = default_device(self.tp_group)  # the rank's GPU under NCCL, else the CPU
        self.stage = (chunks[0] if virtual == 1 else nn.ModuleList(chunks)).to(self.device)
        self.pipe = pipeline.Pipeline(self.stage, mesh.pp_group, header_groups=mesh.pp_headers)
        # A tied word embedding split over two stages: the copies on the first and
        # last stage are one parameter, so their gradients are summed.
        self.tied_split = cfg.tied and mesh.pp > 1 and (mesh.is_first_stage or mesh.is_last_stage)
        self.dp_sync = True  # all-reduce the gradients over dp x cp (experts: edp) in train_step
        self.moe_blocks = [b for b in self.stage.modules() if isinstance(b, Block) and isinstance(b.mlp, MoE)]
        # An expert's name in the unsharded model: its global index (checkpoints span meshes).
        self.expert_names = {id(p): (f"mlp.experts.{i}.", f"mlp.experts.{b.mlp.first + i}.")
                             for b in self.moe_blocks for i, e in enumerate(b.mlp.experts)
                             for p in e.parameters()}
        self.expert_params = [p for p in self.stage.parameters() if id(p) in self.expert_names]
        self.dense_params = [p for p in self.stage.parameters() if id(p) not in self.expert_names]
        self.times = {"compute": 0.0, "bubble": 0.0, "communication": 0.0}
        # Bytes this rank sent over all steps, by kind of parallelism.
        self.bytes_sent = {"tensor": 0, "context": 0, "expert": 0, "pipeline": 0, "data": 0,
                           "tied embedding": 0}

    def loss_fn(self, local_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        ce = tp.vocab_parallel_cross_entropy(local_logits, targets, self.tp_group,
                                             vocab_size=self.cfg.vocab_size)
        if self.mesh.cp == 1:
            return ce.mean()
        # sum / (b * S / cp): the cp ranks' values average to the mean over whole
        # sequences, however unevenly the tokens split (a plain mean would not).
        return ce.sum() * self.mesh.cp / (ce.shape[0] * self.cfg.block_size)

    def moe_stats(self) -> dict[str, int]:
        """Routing totals of this rank's MoE layers since construction."""
        total: dict[str, int] = {}
        for b in self.moe_blocks:
            for k, v in b.mlp.counted.items():
                total[k] = total.get(k, 0) + v
        return total

    def tied_weight(self) -> nn.Parameter | None:
        if not self.tied_split:
            return None
        chunks = self.pipe.chunks
        return chunks[0][0].wte.weight if self.mesh.is_first_stage else chunks[-1][-1].weight

    def checkpoint_layout(self) -> dict[str, Any]:
        m = self.mesh
        extra = {k: v for k, v in (("cp", m.cp), ("ep", m.ep)) if v > 1}  # a 3-D mesh says what it did
        return {"dp": m.dp, **extra, "tp": m.tp, "pp": m.pp, "virtual": len(self.layer_ranges), "zero": 0}

    def checkpoint_places(self) -> list[tuple[torch.Tensor, list[tuple[Place, int]]]]:
        """Where this rank's tensors sit in the unsharded model (dt.parallel.checkpoint).

        Layer i's tensors are named layers.{i}.<name in the layer>, whatever the mesh: a
        tensor-parallel layer holds its slice, data-parallel replicas split the writing. The
        tied head's copy of the word embedding on the last stage is the embedding itself:
        loaded from layers.0.wte.weight, never saved twice. Dense tensors are replicated
        over the dp x cp plane; an expert is named by its global index and replicated over
        the ranks holding the same experts (edp).
        """
        m, seen, out = self.mesh, set(), []
        plane = m.dp_rank * m.cp + m.cp_rank  # this rank in the dp x cp plane
        chunks = list(self.stage) if isinstance(self.stage, nn.ModuleList) else [self.stage]
        head = f"layers.{self.cfg.n_layer + 1}.weight"
        for layers, chunk in zip(self.layer_ranges, chunks):
            for i, layer in zip(layers, chunk):
                for t, pieces in tensor_parallel_places(layer, f"layers.{i}", plane, m.dp * m.cp, seen):
                    if pieces[0][0].name == head:
                        pieces = [(replace(p, name="layers.0.wte.weight", saved=False), at)
                                  for p, at in pieces]
                    if id(t) in self.expert_names:
                        local, whole = self.expert_names[id(t)]
                        pieces = [(replace(p, name=p.name.replace(local, whole, 1), replica=plane // m.ep,
                                           replicas=m.dp * m.cp // m.ep), at) for p, at in pieces]
                    out.append((t, pieces))
        return out

    def train_step(self, tokens: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        """Forward and backward of this dp rank's batch, gradients synchronised.

        Returns the global batch's mean loss on every rank (the last stage
        averages it over dp and broadcasts it along the pipeline).
        """
        m = self.mesh
        tokens = tokens.to(self.device) if tokens is not None else None
        targets = targets.to(self.device) if targets is not None else None
        given = tokens if tokens is not None else targets
        if m.cp > 1:  # this rank's share of every sequence
            if given is None or given.shape[1] != self.cfg.block_size:
                shape = None if given is None else tuple(given.shape)
                raise ValueError(f"rank {m.rank}: context parallelism splits sequences of block_size "
                                 f"{self.cfg.block_size} tokens; got a batch of shape {shape}")
            pos = torch.tensor(self.place.layout.positions(m.cp_rank), device=self.device)
            tokens = tokens[:, pos] if tokens is not None else None
            targets = targets[:, pos] if targets is not None else None
        for b in self.moe_blocks:  # aux_loss_coef x the mean over this rank's sequences
            b.aux_weight = self.cfg.aux_loss_coef / given.shape[0] if given is not None else 0.0
        with transport.traffic() as pipe_traffic:  # collectives inside the layers, pipeline p2p
            loss = self.pipe.train_step(tokens if m.is_first_stage else None,
                                        targets if m.is_last_stage else None, self.loss_fn,
                                        self.micro_batches, self.schedule)
        stats = self.pipe.stats
        t0 = clock(self.device)
        with transport.traffic() as dp_traffic:
            if self.dp_sync:  # off under ZeRO: its optimizer reduce-scatters the gradients instead
                all_reduce_buckets(_grads(self.dense_params), m.dp_cp_group)
                experts = _grads(self.expert_params)
                all_reduce_buckets(experts, m.edp_group, op=ReduceOp.SUM)
                for g in experts if m.dp * m.cp > 1 else ():
                    g.div_(m.dp * m.cp)
        with transport.traffic() as tied_traffic:
            if self.tied_split:
                all_reduce_buckets(_grads([self.tied_weight()]), m.embed_group, op=ReduceOp.SUM)
        dtype = getattr(torch, self.cfg.dtype)
        loss_t = torch.tensor([loss if loss is not None else 0.0], dtype=dtype, device=self.device)
        if m.is_last_stage and m.dp * m.cp > 1:
            all_reduce(loss_t, op=ReduceOp.AVG, group=m.dp_cp_group)
        if m.pp > 1:
            broadcast(loss_t, src=m.pp_ranks[-1], group=m.pp_group)
        comm = clock(self.device) - t0
        # The tensor-parallel all-reduces run inside the stage's forward and
        # backward: their blocking time is moved from compute to communication.
        tp_s = pipe_traffic.seconds
        self.times["compute"] += stats.compute_s - tp_s
        self.times["bubble"] += stats.idle_s
        self.times["communication"] += comm + tp_s
        kinds = {"pipeline": ("pipeline",), "context": ("ring_attention", "ulysses"), "expert": ("moe",)}
        for kind, names in kinds.items():
            self.bytes_sent[kind] += sum(pipe_traffic.by_collective[n].bytes_sent for n in names)
        self.bytes_sent["tensor"] += pipe_traffic.bytes_sent - sum(
            pipe_traffic.by_collective[n].bytes_sent for names in kinds.values() for n in names)
        self.bytes_sent["data"] += dp_traffic.bytes_sent
        self.bytes_sent["tied embedding"] += tied_traffic.bytes_sent
        return float(loss_t.item())
