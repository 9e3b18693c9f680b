"""Memory per rank of a `dt train` layout: what is held, and the peak of a step (not the sum).

    mem = rank_memory(arch, micro_batch=2, micro_batches=4, itemsize=4, tp=2, pp=2, dp=2, stage=0)
    mem.peak, mem.held, mem.as_dict()

Held between steps (the baseline): this rank's parameters (dt.cost.flops.layer_params over
the layers of its stage, tp/ep shards), the optimizer state and ZeRO's shards of both by
dt.parallel.zero.memory.zero_memory_formula (the one home of 16 Psi, 8 Psi + 8 Psi/N, ...;
gradients held only under stage >= 2 ZeRO between steps, else made fresh every step: dt's
trainer sets them to None), and the ring's cached scratch (dt.cost.memory: the largest
bucket's reduce-scatter, kept between calls; ZeRO 1-2's: its reduce-scatters').

A step's peak, from the schedule's own order (dt.parallel.pipeline.stash): a forward adds
one micro-batch's activations of the chunk (dt.cost.activations, plus the chunk's output the
runtime stashes until its backward when another stage receives it), a backward frees them
and, once any backward has run, every gradient of the stage exists (all of them: the first
micro-batch's backward reaches every layer; in full, under ZeRO too, whose shards are cut
after backward: a conservative count under stage 2-3, where the held shard adds to it).
On top of whatever the stash holds, the layer in flight holds one MLP-wide tensor and one
of the hidden width (s b (f / tp + h) numbers: GELU's output or its gradient, and the
activation or gradient coming in). So the peak is the most, over the schedule's actions, of
    stash bytes after an action + (grads if a backward ran before it) + the layer in flight,
and the optimizer step (grads + OPTIMIZER_TEMPORARIES x the largest parameter: dt's Adam
builds m_hat, v_hat and their quotient per parameter) if that is higher; plus the DDP
bucket being reduced after backward (one flat buffer of at most the bucket cap) when
dp x cp > 1. Checked against dt.device_memory.LiveBytes on dt's model: within 10% at the
layouts of tests/test_memory_tracker.py (predicted / measured 0.915 to 1.049: the
transients of a backward are modelled by one rule, not op by op).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dt.cost.activations import stage_activation_bytes
from dt.cost.flops import Decoder, expert_params, layer_params
from dt.cost.memory import ring_reduce_scatter_scratch, scratch_held
from dt.layout import split_sizes
from dt.parallel.pipeline.schedules import schedule, stage_layers
from dt.parallel.zero.memory import comm_scratch_formula, zero_memory_parts

__all__ = ["BUCKET_CAP_BYTES", "OPTIMIZER_TEMPORARIES", "RankMemory", "rank_memory"]

BUCKET_CAP_BYTES = 25 << 20  # dt.parallel.buckets.all_reduce_buckets' default cap
OPTIMIZER_TEMPORARIES = 4  # dt's Adam per parameter: m_hat, v_hat, sqrt(v_hat) + eps, the step


@dataclass(frozen=True)
class RankMemory:
    """Bytes on one rank: what it holds between steps, and what a step adds at its peak."""

    params: float
    optimizer: float
    held_grads: float  # between steps (ZeRO 2, 3: the shard; else 0)
    scratch: float  # the collectives' cached buffers
    step_grads: float  # the gradient bytes the optimizer keeps (the stage's, or ZeRO 2-3's shard)
    activations: float  # the most the pipeline stash holds at once
    step_peak: float  # what a step adds at its peak, above the held bytes

    @property
    def held(self) -> float:
        return self.params + self.optimizer + self.held_grads + self.scratch

    @property
    def peak(self) -> float:
        return self.held + self.step_peak

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "held": self.held, "peak": self.peak}


def _stage_params(a: Decoder, chunks: list[range], tp: int, ep: int) -> float:
    layers = {i for r in chunks for i in r}
    total = sum(layer_params(a, i, tp, ep) for i in layers)
    if a.tied and a.n_layer + 1 in layers and 0 not in layers:
        total += a.vocab_size * a.n_embd / tp  # the head's copy of the word table
    return total


def _largest_tensor(a: Decoder, chunks: list[range], tp: int) -> float:
    """Elements of the stage's largest parameter tensor (the optimizer's temporaries are per tensor)."""
    layers = {i for r in chunks for i in r}
    h = a.n_embd
    sizes = [0.0]
    if 0 in layers or a.n_layer + 1 in layers:
        sizes.append(a.vocab_size * h / tp)  # the word table, or the head's matrix (vocab-parallel)
    if layers - {0, a.n_layer + 1}:
        mlp = h * a.ffn_hidden / (1 if a.n_experts else tp)
        sizes += [mlp, h * (a.n_head + 2 * a.n_kv_head) * a.head_dim / tp]
    return max(sizes)


def _zero_scratch(zero: int, parts: list[tuple[float, int]], itemsize: int) -> float:
    """The ring scratch ZeRO 1-2's reduce-scatters keep between steps (comm_scratch_formula, as
    ZeroOptimizer.formula states it): ZeRO 1 one flat gradient per part, ZeRO 2 its buckets (of at
    most the cap). Its flat shares of each part taken even."""
    if zero not in (1, 2):
        return 0.0
    pieces = []
    for psi, n in parts:
        whole = int(psi) if zero == 1 else int(min(psi, BUCKET_CAP_BYTES / itemsize))
        if n > 1 and whole:
            pieces.append(split_sizes(whole, n))
    return comm_scratch_formula(pieces, itemsize, 0)


def rank_memory(a: Decoder, micro_batch: int, micro_batches: int, itemsize: int, tp: int = 1,
                pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1, stage: int = 0,
                schedule_name: str = "1f1b", virtual: int = 1, zero: int = 0, recompute: str = "none",
                optimizer_bytes: int = 8, stage_sizes: list[int] | None = None) -> RankMemory:
    """Memory of pipeline stage `stage` on one rank of a dp x cp x ep x tp x pp layout of dt's GPT,
    `micro_batch` sequences per micro-batch; optimizer_bytes per parameter (dt's Adam: 8, two
    moments in the parameters' float32; mixed precision with a master copy: 12)."""
    chunks = stage_layers(a.n_layer + 2, pp, stage, stage_sizes, virtual)
    psi = _stage_params(a, chunks, tp, ep)
    n = dp * cp
    # ZeRO shards the dense part over the plane, the experts over their replicas (dt.parallel.zero.parts)
    layers = {i for r in chunks for i in r}
    experts = sum(expert_params(a, i, ep) for i in layers)
    # ZeRO 2 keeps the full gradient of a word table two stages share (dt.parallel.zero.optimizer)
    tied = a.tied and pp > 1 and (0 in layers) != (a.n_layer + 1 in layers)
    kept = a.vocab_size * a.n_embd / tp if tied and zero == 2 else 0.0
    z = zero_memory_parts([(psi - experts, n), (experts, n // ep)], zero, k=optimizer_bytes,
                          param_bytes=itemsize, grad_bytes=itemsize, kept=kept)
    step_grads = z["grads"]
    held_grads = step_grads - kept * itemsize if zero >= 2 else 0.0  # the kept one is freed by the step
    made = psi * itemsize  # backward makes every gradient of the stage in full before any sharding
    last = a.n_layer + 1
    per_chunk = [stage_activation_bytes(a, r, micro_batch, itemsize, tp, cp, recompute=recompute)
                 + (0 if last in r else itemsize * micro_batch * a.seq_len / cp * a.n_embd)  # stashed output
                 for r in chunks]
    tokens = micro_batch * a.seq_len / cp
    in_flight = itemsize * tokens * (a.ffn_hidden / (1 if a.n_experts else tp) + a.n_embd)
    held, backward_ran, worst, stash = 0.0, False, 0.0, 0.0
    for kind, c, _ in schedule(schedule_name, pp, stage, micro_batches, virtual):
        held += per_chunk[c] if kind == "F" else -per_chunk[c]
        stash = max(stash, held)
        worst = max(worst, held + in_flight + (made if backward_ran else 0.0))
        backward_ran = backward_ran or kind == "B"
    largest = _largest_tensor(a, chunks, tp) * itemsize
    optimizer_step = made + OPTIMIZER_TEMPORARIES * largest
    bucket = min(BUCKET_CAP_BYTES, made) if n > 1 and zero == 0 else 0.0
    scratch = scratch_held([ring_reduce_scatter_scratch([int(bucket / itemsize / n)] * n, itemsize, 0)]) \
        if bucket else _zero_scratch(zero, [(psi - experts, n), (experts, n // ep)], itemsize)
    step_peak = max(worst, optimizer_step, made + bucket)
    return RankMemory(params=z["params"], optimizer=z["optimizer"], held_grads=held_grads, scratch=scratch,
                      step_grads=step_grads, activations=stash, step_peak=step_peak)
