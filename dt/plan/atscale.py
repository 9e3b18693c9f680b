"""At scale, on paper: the planner against published large runs (dt.plan.published_tables).

For each published row: the planner's step for the authors' model, layout
and cluster (H hosts of 8 of the row's GPU from dt.cost.devices, bf16, the
catalogue's stated efficiency), as TFLOP/s per GPU counted the way the
source counts it (Megatron-LM 2021: the hardware FLOPs with full recompute,
its 96 B s l h^2 formula's 4 passes; Llama 3: model FLOPs, the MFU count),
beside the published figure; and, where the layouts are few enough to
enumerate (up to MAX_SEARCH GPUs), the planner's first-ranked layout for
the same model, batch and cluster beside the one the authors ran.

The authors' micro-batch is one sequence (Megatron's Table 1 runs; the
planner then holds m = batch / dp per pipeline); Megatron ran full
recompute; both are priced on 1F1B with one chunk per stage (the tables do
not give the interleaving's chunk count), Llama 3's rows without recompute.
Grouped-query attention (Llama 3's 8 key/value heads) is priced as full
attention: a few percent of its FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dt.cost.flops import train_flops_per_token
from dt.plan.cluster import catalogue_cluster
from dt.plan.layouts import Layout
from dt.plan.model import ModelShape
from dt.plan.published_tables import PublishedRun
from dt.plan.search import rank_layouts
from dt.plan.step_model import predict

__all__ = ["MAX_SEARCH", "Compared", "compare", "shape_of"]

MAX_SEARCH = 128  # GPUs up to which the first-ranked layout is searched for


@dataclass(frozen=True)
class Compared:
    run: PublishedRun
    predicted_tflops: float
    error: float  # (predicted - published) / published
    authors: str  # the authors' layout, in dt plan's names
    step: float  # predicted seconds per step of the authors' layout
    first: str | None  # the planner's first-ranked layout (None: not searched)
    first_step: float | None


def shape_of(run: PublishedRun) -> ModelShape:
    return ModelShape(run.n_layer, run.n_head, run.n_embd, run.vocab_size, ffn=run.ffn_hidden or 0,
                      gated=run.gated, tied=not run.gated, name=f"{run.params / 1e9:.1f}B")


def _authors(run: PublishedRun) -> Layout:
    m = run.global_batch // run.dp if run.pp > 1 else 1
    return Layout(dp=run.dp, tp=run.tp, pp=run.pp, cp=run.cp, schedule="1f1b", micro_batches=m,
                  recompute="Megatron" in run.source)


def _tflops(run: PublishedRun, model: ModelShape, step: float) -> float:
    a = model.decoder(run.seq_len)
    recompute = "full" if "Megatron" in run.source else "none"
    flops = train_flops_per_token(a, recompute=recompute) * run.global_batch * run.seq_len
    return flops / step / run.gpus / 1e12


def compare(run: PublishedRun, search: bool = True) -> Compared:
    model = shape_of(run)
    cluster = catalogue_cluster(run.device, run.gpus // 8, 8, "bf16")
    lay = _authors(run)
    p = predict(cluster, model, lay, run.global_batch, run.seq_len)
    tf = _tflops(run, model, p.step)
    first = first_step = None
    if search and run.gpus <= MAX_SEARCH:
        rows, _, _ = rank_layouts(cluster, model, run.global_batch, run.seq_len, (False, True))
        if rows:
            first, first_step = rows[0].layout.name(), rows[0].prediction.step
    return Compared(run, tf, (tf - run.tflops_per_gpu) / run.tflops_per_gpu, lay.name(), p.step, first,
                    first_step)
