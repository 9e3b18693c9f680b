"""`dt plan --published`: the planner beside every published run it can price (dt.plan.published).

For each row: the authors' model, layout and cluster priced as the row's stack runs them (the
source's `pricing`: dt.cost.stack), the step converted to the source's own unit (TFLOP/s per GPU
counted as the source counts them, MFU against the device's peak, seconds per iteration, tokens
per second per GPU), the peak memory per GPU where the source printed one, and the authors'
layout's rank among every layout dt enumerates for that model, batch and cluster.

A layout field the source does not print (a micro-batch size, the interleaved schedule's chunks,
recompute, sequence parallel, the ZeRO stage) is taken from the source's `pricing.assume` where it
says, else the planner takes the fastest choice that fits in memory: the authors tuned what they
did not print. A row is not priced (and says why) where its GPU is not in the catalogue, it ran
float8 matmuls, or its layout is not printed.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from dt import record
from dt.cost.flops import train_flops_per_token
from dt.cost.stack import Stack
from dt.plan.cluster import Cluster, catalogue_cluster
from dt.plan.layouts import Layout, micro_batch_counts, train_args
from dt.plan.memory import counted, peak_bytes
from dt.plan.model import ModelShape, llama_shape
from dt.plan.published import PublishedRow, describe, load
from dt.plan.search import HEADROOM, rank_layouts
from dt.plan.step_model import predict
from dt.train.layouts import layout_error

__all__ = ["Compared", "Unpriced", "compare", "main", "measured_sweeps", "priced_rows", "summary"]

GB = 1e9
RANKED_UP_TO = 512  # GPUs up to which the authors' layout is ranked among every layout
GPUS_PER_HOST = 8  # where a source does not print its hosts: the DGX and HGX nodes every source ran
SAME_STEP = 1e-9  # steps this close (relative) are one: a layout counts as faster only beyond it


@dataclass(frozen=True)
class Compared:
    """One published row beside the planner's figure for it."""

    row: PublishedRow
    layout: str  # the authors' layout in dt plan's names (unprinted fields as priced)
    step: float  # predicted seconds per step
    predicted: float  # in the row's metric
    predicted_memory_gb: float | None
    authors_rank: int | None  # 1: first; None: not ranked (the cluster's grid is too large)
    first_layout: str | None
    first_step: float | None = None  # the first-ranked layout's predicted step

    @property
    def behind_first(self) -> float | None:
        """How much slower the authors' layout is predicted than the first-ranked (0: it is first)."""
        return None if self.first_step is None else self.step / self.first_step - 1

    @property
    def error(self) -> float:
        """predicted / published - 1, in the row's unit (seconds: positive is slower)."""
        return self.predicted / self.row.published - 1

    @property
    def speed_error(self) -> float:
        """The predicted speed over the published one, less 1 (positive: predicted faster)."""
        ratio = self.predicted / self.row.published
        return 1 / ratio - 1 if self.row.metric == "s_per_iter" else ratio - 1

    @property
    def memory_error(self) -> float | None:
        if self.row.published_memory_gb is None or self.predicted_memory_gb is None:
            return None
        return self.predicted_memory_gb / self.row.published_memory_gb - 1


class Unpriced(NamedTuple):
    """A published row the planner cannot price, and why."""

    row: PublishedRow
    why: str


def _why_not(row: PublishedRow) -> str | None:
    """Why the row cannot be priced, or None."""
    printed = row.layout
    if row.cluster.device is None:
        return f"its GPU ({row.cluster.gpu}) is not in dt's catalogue"
    if row.precision and "float8" in row.precision:
        return "it ran float8 matmuls; dt prices bf16"
    if None in (printed.dp, printed.global_batch) or (None in (printed.tp, printed.pp)
                                                       and not printed.model_parallel):
        return "its layout is not printed"
    return None


def _model(row: PublishedRow, assume: dict) -> ModelShape:
    printed = row.model
    vocab = printed.vocab_size or assume.get("vocab_size")
    if printed.ffn_activation == "swiglu":
        shape = llama_shape(printed.layers, printed.heads, printed.hidden, vocab, printed.kv_heads or 0,
                            tied=bool(printed.tied_embeddings))
        return replace(shape, ffn=printed.ffn_hidden or shape.ffn, name=printed.name)
    return ModelShape(printed.layers, printed.heads, printed.hidden, vocab, ffn=printed.ffn_hidden or 0,
                      tied=printed.tied_embeddings is not False, name=printed.name)


def _cluster(row: PublishedRow, stack: str, efficiency: float | None = None) -> Cluster:
    per_host = min(row.cluster.gpus_per_host or GPUS_PER_HOST, row.cluster.gpus)
    precision = "fp16" if row.precision == "fp16" else "bf16"  # the rest ran bf16 (or as "mixed": 16-bit)
    return catalogue_cluster(row.cluster.device, row.cluster.gpus // per_host, per_host, precision,
                             efficiency, stack_name=stack, host_network_gbit=row.cluster.host_network_gbit)


def _choices(row: PublishedRow, assume: dict, pp: int, per_rank: int, stack: Stack) -> Iterator[dict]:
    """Every filling of the layout's unprinted fields (the source's assumption where it states one)."""
    printed = row.layout

    def given(name: str, value: object, options: Iterable) -> list:
        if value is not None:
            return [value]
        return [assume[name]] if name in assume else list(options)

    micro = ([-(-per_rank // printed.micro_batch)] if printed.micro_batch else
             [printed.grad_accum] if printed.grad_accum else micro_batch_counts(pp, per_rank))
    interleaved = pp > 1 and "interleaved" in stack.schedules
    chunks = given("virtual_stages", printed.virtual_stages, (1, 2, 3, 4) if interleaved else (1,))
    for micro_batches, virtual, recompute, sequence_parallel, zero in itertools.product(
            micro, chunks, given("recompute", printed.recompute, stack.recomputes),
            given("sequence_parallel", printed.sequence_parallel,
                  (False, True) if stack.sequence_parallel else (False,)),
            given("zero_stage", printed.zero_stage, stack.zero_stages)):
        yield {"micro_batches": micro_batches, "virtual": virtual, "recompute": recompute,
               "sequence_parallel": sequence_parallel, "zero": zero}


class _Filling(NamedTuple):
    """One filling of the authors' layout's unprinted fields, priced."""

    too_big: bool  # over the device's memory less the headroom
    step: float
    peak: int
    layout: Layout


def _splits(row: PublishedRow, cluster: Cluster) -> list[tuple[int, int]]:
    """(tp, pp) as printed, or every split of a printed model-parallel size tp x pp with tensor
    parallel inside one host (as every source here runs it)."""
    printed = row.layout
    if printed.tp is not None and printed.pp is not None:
        return [(printed.tp, printed.pp)]
    size = printed.model_parallel or 1
    return [(tp, size // tp) for tp in range(1, min(size, cluster.per_host) + 1)
            if size % tp == 0 and size // tp <= row.model.layers]


def authors_layout(row: PublishedRow, model: ModelShape, cluster: Cluster,
                   assume: dict) -> tuple[Layout, float, int]:
    """The authors' layout with its unprinted fields filled (the fastest filling that fits, else the
    fastest), its predicted step and its peak bytes per GPU."""
    printed, batch, seq = row.layout, row.layout.global_batch, row.model.seq_len
    priced = []
    for (tp, pp), choice in ((split, choice) for split in _splits(row, cluster)
                             for choice in _choices(row, assume, split[1], batch // printed.dp,
                                                    cluster.stack)):
        virtual = choice["virtual"]
        candidate = Layout(dp=printed.dp, tp=tp, pp=pp, cp=printed.cp or 1,
                           zero=choice["zero"], schedule="interleaved" if virtual > 1 else "1f1b",
                           virtual=virtual, micro_batches=choice["micro_batches"],
                           recompute=choice["recompute"],
                           sequence_parallel=choice["sequence_parallel"] and tp > 1)
        if layout_error(train_args(candidate, model, batch, seq)) is not None:
            continue
        peak = max(stage["peak"] for stage in peak_bytes(cluster, model, candidate, batch, seq))
        step = predict(cluster, model, candidate, batch, seq).step
        priced.append(_Filling(peak > cluster.memory * (1 - HEADROOM), step, peak, candidate))
    if not priced:
        raise ValueError(f"{row.source} {row.model.name}: dt train runs no filling of the authors' layout")
    chosen = min(priced, key=lambda filling: (filling.too_big, filling.step, filling.peak))
    return chosen.layout, chosen.step, chosen.peak


def _metric(row: PublishedRow, model: ModelShape, layout: Layout, step: float, cluster: Cluster,
            flops: str) -> float:
    """The predicted step in the row's own unit."""
    batch, seq, gpus = row.layout.global_batch, row.model.seq_len, row.cluster.gpus
    recompute = layout.recompute if flops == "hardware" else "none"
    work = train_flops_per_token(model.decoder(seq), recompute=recompute) * batch * seq
    if row.metric == "s_per_iter":
        return step
    if row.metric == "tokens_per_s_per_gpu":
        return batch * seq / step / gpus
    if row.metric == "tflops_per_gpu":
        return work / step / gpus / 1e12
    return 100 * work / step / gpus / cluster.peak  # mfu_percent


def compare(row: PublishedRow, rank: bool = True, efficiency: float | None = None) -> Compared:
    """The planner's figures for one published row (ValueError where it cannot be priced);
    `efficiency`: a large GEMM's fraction of peak instead of the catalogue's (the fit's)."""
    why = _why_not(row)
    if why is not None:
        raise ValueError(why)
    pricing = describe(row.source).pricing
    assume = dict(pricing.get("assume", {}))
    model = _model(row, assume)
    cluster = _cluster(row, pricing["stack"], efficiency)
    layout, step, _ = authors_layout(row, model, cluster, assume)
    memory = None
    if row.published_memory_gb is not None:
        stages = peak_bytes(cluster, model, layout, row.layout.global_batch, row.model.seq_len)
        memory = max(counted(stage, row.memory_scope) for stage in stages) / GB
    authors_rank = first = first_step = None
    if rank and row.cluster.gpus <= RANKED_UP_TO:
        recomputes = (assume["recompute"],) if "recompute" in assume else cluster.stack.recomputes
        ranking = rank_layouts(cluster, model, row.layout.global_batch, row.model.seq_len, recomputes,
                               until=step)
        faster = [ranked for ranked in ranking.rows if ranked.prediction.step < step * (1 - SAME_STEP)]
        authors_rank = len(faster) + 1
        first = ranking.rows[0].layout.name() if ranking.rows else layout.name()
        first_step = min([step] + [ranked.prediction.step for ranked in ranking.rows])
    predicted = _metric(row, model, layout, step, cluster, pricing["flops"])
    return Compared(row, layout=layout.name(), step=step, predicted=predicted, predicted_memory_gb=memory,
                    authors_rank=authors_rank, first_layout=first, first_step=first_step)


def _speed(row: PublishedRow) -> float:
    """The row's published figure, larger for faster (seconds per iteration negated)."""
    return -row.published if row.metric == "s_per_iter" else row.published


def sweep_winners(rows: list[PublishedRow]) -> set[int]:
    """Indices of each sweep's fastest published row (and of each row its source calls the authors'
    pick outside any sweep): the layouts whose rank among every layout the suite checks."""
    best: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.sweep is None:
            if row.authors_choice:
                best[f"row {i}"] = i
            continue
        fastest = best.get(row.sweep)
        if fastest is None or _speed(row) > _speed(rows[fastest]):
            best[row.sweep] = i
    return set(best.values())


def priced_rows(sources: Iterable[str] | None = None, rank: bool = True,
                efficiency: dict[str, float] | None = None) -> tuple[list[Compared], list[Unpriced]]:
    """(the rows priced, those that cannot be and why); `rank`: each sweep's fastest row is
    ranked (sweep_winners); `efficiency`: per device, the fit's."""
    done, skipped = [], []
    rows = load(sources)
    winners = sweep_winners(rows) if rank else set()
    for i, row in enumerate(rows):
        try:
            done.append(compare(row, i in winners, (efficiency or {}).get(row.cluster.device or "")))
        except ValueError as exc:
            skipped.append(Unpriced(row, str(exc)))
    return done, skipped


def _stats(errors: list[float]) -> dict[str, float]:
    magnitudes = [abs(error) for error in errors]
    if not magnitudes:
        return {"rows": 0}
    return {"rows": len(magnitudes), "median": statistics.median(magnitudes), "worst": max(magnitudes)}


def summary(rows: list[Compared]) -> dict[str, dict]:
    """Median and worst |predicted / published - 1| per source and overall, memory likewise."""
    out: dict[str, dict] = {}
    for source in sorted({compared.row.source for compared in rows}) + ["all"]:
        mine = [compared for compared in rows if source in ("all", compared.row.source)]
        memory = [compared.memory_error for compared in mine if compared.memory_error is not None]
        out[source] = {"step": _stats([compared.error for compared in mine]), "memory": _stats(memory)}
    return out


def _as_json(compared: Compared) -> dict:
    row = compared.row
    return {"source": row.source, "model": row.model.name, "layout": compared.layout,
            "gpus": row.cluster.gpus, "metric": row.metric, "published": row.published,
            "predicted": compared.predicted, "step_s": compared.step,
            "published_memory_gb": row.published_memory_gb, "memory_scope": row.memory_scope,
            "predicted_memory_gb": compared.predicted_memory_gb, "authors_rank": compared.authors_rank,
            "first_layout": compared.first_layout, "behind_first": compared.behind_first, "sweep": row.sweep}


WITHIN = 0.05  # a sweep's fastest published layout is "placed" when ranked first or this close to the first


def sweeps(rows: list[Compared]) -> dict[str, float | int]:
    """How the ranked sweep winners placed: how many, how many first, how many within WITHIN."""
    ranked = [compared for compared in rows if compared.authors_rank is not None]
    return {"ranked": len(ranked), "first": sum(compared.authors_rank == 1 for compared in ranked),
            "within": sum((compared.behind_first or 0.0) <= WITHIN for compared in ranked)}


def _predicted_rate(compared: Compared) -> float:
    """The predicted figure as a rate, larger for faster (seconds per iteration inverted)."""
    return 1 / compared.predicted if compared.row.metric == "s_per_iter" else compared.predicted


def measured_sweeps(rows: list[Compared]) -> dict[str, int]:
    """The ranking against what was measured: in every sweep with two or more priced rows, is the
    layout the authors measured fastest the one the planner predicts fastest among the sweep's own
    layouts (`first`), or within WITHIN of it (`within`)? Unlike `sweeps`, nothing here depends on
    layouts nobody ran."""
    of_sweep: dict[str, list[Compared]] = {}
    for compared in rows:
        if compared.row.sweep is not None:
            of_sweep.setdefault(compared.row.sweep, []).append(compared)
    counted = first = within = 0
    for members in (members for members in of_sweep.values() if len(members) > 1):
        measured = max(members, key=lambda compared: _speed(compared.row))
        predicted = max(members, key=_predicted_rate)
        behind = _predicted_rate(predicted) / _predicted_rate(measured) - 1
        counted += 1
        first += predicted is measured or behind == 0
        within += behind <= WITHIN
    return {"sweeps": counted, "first": first, "within": within}


def main(sources: list[str], as_json: bool = False, rank: bool = False, fitted: dict | None = None) -> int:
    """Print the suite (`fitted`: dt.plan.fit.report's, carried in the JSON; the caller prints its table)."""
    rows, skipped = priced_rows(sources or None, rank)
    stats = summary(rows)
    record.headline(_headline(stats, rows, rows if rank else None))
    if as_json:
        print(json.dumps({"rows": [_as_json(compared) for compared in rows], "summary": stats,
                          "sweeps": sweeps(rows) if rank else None, "measured_sweeps": measured_sweeps(rows),
                          "fit": fitted,
                          "not_priced": [{"source": unpriced.row.source, "model": unpriced.row.model.name,
                                          "why": unpriced.why} for unpriced in skipped]}, indent=1))
        return 0
    print(_table(rows))
    print()
    print(_summary_table(stats))
    measured = measured_sweeps(rows)
    print(f"\nmeasured sweeps: in {measured['sweeps']} sweeps of two or more priced layouts, the one "
          f"measured fastest is predicted fastest of them in {measured['first']}, first or within "
          f"{WITHIN:.0%} in {measured['within']}")
    if rank:
        placed = sweeps(rows)
        print(f"sweeps: {placed['ranked']} fastest published layouts ranked among every layout of their "
              f"model and cluster: {placed['first']} first, {placed['within']} first or within {WITHIN:.0%} "
              "of the first")
        print()
        print(_ranked_table(rows))
    if skipped:
        reasons: dict[str, int] = {}
        for unpriced in skipped:
            reasons[unpriced.why] = reasons.get(unpriced.why, 0) + 1
        print("not priced: " + "; ".join(f"{n} rows: {why}" for why, n in reasons.items()))
    return 0


def _headline(stats: dict[str, dict], rows: list[Compared], ranked: list[Compared] | None) -> str:
    """The suite in one line (its record's headline)."""
    step, memory = stats["all"]["step"], stats["all"]["memory"]
    said = (f"{step['rows']} published rows: median |error| {100 * step['median']:.1f}%, worst "
            f"{100 * step['worst']:.0f}%; memory ({memory.get('rows', 0)} rows) median "
            f"{100 * memory.get('median', 0):.1f}%")
    measured = measured_sweeps(rows)
    said += (f"; measured sweeps: {measured['within']} of {measured['sweeps']} fastest first or within "
             f"{WITHIN:.0%}")
    if ranked is not None:
        placed = sweeps(ranked)
        said += f"; {placed['within']} of {placed['ranked']} sweep winners first or within {WITHIN:.0%}"
    return said


def _table(rows: list[Compared]) -> str:
    out = [f"{'source':<20} {'model':<22} {'gpus':>5} {'layout':<40} {'metric':<21} {'published':>10} "
           f"{'predicted':>10} {'error':>7} {'mem GB':>7} {'pred GB':>7} {'rank':>5}"]
    for compared in rows:
        row = compared.row
        mem = f"{row.published_memory_gb:7.1f}" if row.published_memory_gb else "      -"
        pmem = f"{compared.predicted_memory_gb:7.1f}" if compared.predicted_memory_gb else "      -"
        rank = str(compared.authors_rank) if compared.authors_rank else "-"
        out.append(f"{row.source:<20} {row.model.name[:22]:<22} {row.cluster.gpus:>5} "
                   f"{compared.layout[:40]:<40} {row.metric:<21} {row.published:10.2f} "
                   f"{compared.predicted:10.2f} {100 * compared.error:+6.1f}% {mem} {pmem} {rank:>5}")
    return "\n".join(out)


def _ranked_table(rows: list[Compared]) -> str:
    """Each ranked sweep winner: the authors' layout, its rank, and the layout ranked first."""
    out = [f"{'source':<20} {'model':<22} {'gpus':>5} {'authors layout':<40} {'rank':>5} {'behind':>7}  "
           "first-ranked layout"]
    for compared in rows:
        if compared.authors_rank is None:
            continue
        row, behind = compared.row, 100 * (compared.behind_first or 0.0)
        out.append(f"{row.source:<20} {row.model.name[:22]:<22} {row.cluster.gpus:>5} "
                   f"{compared.layout[:40]:<40} {compared.authors_rank:>5} {behind:6.1f}%  "
                   f"{compared.first_layout}")
    return "\n".join(out)


def _summary_table(stats: dict[str, dict]) -> str:
    out = [f"{'source':<28} {'rows':>5} {'median':>8} {'worst':>8}   "
           f"{'memory rows':>11} {'median':>8} {'worst':>8}"]
    for source, of_source in stats.items():
        steps, memory = of_source["step"], of_source["memory"]
        step = (f"{steps['rows']:>5} {100 * steps['median']:7.1f}% {100 * steps['worst']:7.1f}%"
                if steps["rows"] else "    0")
        mem = (f"{memory['rows']:>11} {100 * memory['median']:7.1f}% {100 * memory['worst']:7.1f}%"
               if memory["rows"] else f"{0:>11}")
        out.append(f"{source:<28} {step}   {mem}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
