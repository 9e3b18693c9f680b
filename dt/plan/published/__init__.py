"""Published runs of large transformer training, each row as its source printed it.

One JSON file per source sits beside this module: who printed it (`citation`, `url`, `table`), how
the rows were checked against the source itself (`verified`), the source's conventions (`notes`:
which FLOPs it counts, which peak its MFU divides by, what its memory figure is), the values shared
by every row (`defaults`) and the rows. A row keeps the source's own columns and values under
`printed` and adds the same run in one vocabulary: the model's shape, the cluster, the layout, the
metric in the source's own unit and the memory where the source printed one. A field the source
does not state is null, with what the source implies in the row's `notes`.

`load()` returns the rows as frozen records; `SOURCES` names the files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dt.plan.memory import MEMORY_SCOPES

__all__ = ["FFN_ACTIVATIONS", "MEMORY_SCOPES", "METRICS", "RECOMPUTE", "ROW_KEYS", "SECONDARY_METRICS",
           "SOURCES", "RunCluster", "RunLayout", "RunModel", "PublishedRow", "Source", "describe", "load",
           "source_file"]

_HERE = Path(__file__).resolve().parent

# What a row's `published` value measures, in the source's own unit.
METRICS = {
    "tflops_per_gpu": "achieved TFLOP/s per GPU, counted as the source's notes say",
    "mfu_percent": "model FLOPs utilization, percent of the peak the source's notes name",
    "s_per_iter": "seconds per training iteration (one optimizer step over the global batch)",
    "tokens_per_s_per_gpu": "training tokens per second per GPU",
}
# Further figures a source prints beside the main one (a row's `also`).
SECONDARY_METRICS = frozenset(METRICS) | {
    "percent_of_peak", "hfu_percent", "model_tflops_per_gpu", "tokens_per_s", "days_for_300B_tokens"}
RECOMPUTE = ("none", "selective", "full")
FFN_ACTIVATIONS = ("gelu", "swiglu")

_SOURCE_KEYS = ("source", "citation", "url", "table", "verified", "notes", "defaults", "pricing", "rows")
_SHAPE = ("model", "params_b", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "ffn_activation",
          "vocab_size", "seq_len", "tied_embeddings", "shape_source")
_CLUSTER = ("gpu", "device", "gpu_memory_gb", "gpus", "gpus_per_host", "interconnect", "host_network_gbit")
_LAYOUT = ("dp", "tp", "pp", "model_parallel", "cp", "ep", "zero_stage", "fsdp", "micro_batch",
           "global_batch", "grad_accum", "virtual_stages", "recompute", "sequence_parallel")
_RESULT = ("precision", "metric", "published", "also", "published_memory_gb", "memory_kind", "memory_scope",
           "sweep", "authors_choice", "notes", "printed")
ROW_KEYS = _SHAPE + _CLUSTER + _LAYOUT + _RESULT


@dataclass(frozen=True)
class RunModel:
    """The transformer as trained: from the source or the model's own published config (`source`)."""

    name: str
    params_b: float | None  # billions of parameters, as printed
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None  # None: not stated
    ffn_hidden: int | None
    ffn_activation: str | None  # "gelu" or "swiglu"
    vocab_size: int | None
    seq_len: int
    tied_embeddings: bool | None
    source: str


@dataclass(frozen=True)
class RunCluster:
    """The machines the run used; `device` is dt's catalogue name when the GPU is in it, else None."""

    gpu: str
    device: str | None
    gpu_memory_gb: float | None
    gpus: int
    gpus_per_host: int | None
    interconnect: str | None
    host_network_gbit: float | None  # each host's NICs together, one way; None: one catalogue NIC per GPU


@dataclass(frozen=True)
class RunLayout:
    """How the run was split; None where the source does not say."""

    dp: int | None
    tp: int | None
    pp: int | None
    model_parallel: int | None  # tp x pp where the source prints the product and not the split
    cp: int | None
    ep: int | None
    zero_stage: int | None  # 0 replicated, 1 optimizer, 2 + gradients, 3 + parameters (FSDP full shard)
    fsdp: str | None  # the sharding as the source names it, when it is FSDP
    micro_batch: int | None  # sequences per micro-batch
    global_batch: int | None  # sequences per optimizer step
    grad_accum: int | None  # micro-batches per step on one data-parallel rank
    virtual_stages: int | None  # model chunks per pipeline rank (interleaved schedule)
    recompute: str | None  # "none", "selective" or "full"
    sequence_parallel: bool | None


@dataclass(frozen=True)
class PublishedRow:
    """One printed row: the run in one vocabulary, the source's figure and the source's own columns."""

    source: str
    model: RunModel
    cluster: RunCluster
    layout: RunLayout
    precision: str | None
    metric: str  # a key of METRICS
    published: float  # in `metric`'s unit, as printed
    also: Mapping[str, float]  # further printed figures, keyed by SECONDARY_METRICS
    published_memory_gb: float | None  # per GPU, 10^9 bytes; what it measures is `memory_kind`
    memory_kind: str | None  # the source's words
    memory_scope: str | None  # what the figure counts: a key of MEMORY_SCOPES
    sweep: str | None  # rows of one model on one cluster with different layouts share it
    authors_choice: bool  # the source presents this layout as the one it picked (or the best it found)
    notes: str
    printed: Mapping[str, Any]


@dataclass(frozen=True)
class Source:
    """Where a file's rows come from and what its numbers mean."""

    id: str
    citation: str
    url: str
    table: str
    verified: str
    notes: str
    pricing: Mapping[str, Any]  # how dt plan prices its rows: the stack, the FLOPs its figures count, and
    # what it takes for a field the source leaves unprinted ("assume"), with why


SOURCES: tuple[str, ...] = tuple(sorted(p.stem for p in _HERE.glob("*.json")))


def source_file(source: str) -> Path:
    """The JSON file of one source; one clear line when there is no such source."""
    if source not in SOURCES:
        raise ValueError(f"no published source {source!r}: one of {', '.join(SOURCES)}")
    return _HERE / f"{source}.json"


def _read(source: str) -> dict[str, Any]:
    path = source_file(source)
    doc = json.loads(path.read_text())
    missing = [k for k in _SOURCE_KEYS if k not in doc]
    if missing or doc["source"] != source:
        raise ValueError(f"{path.name}: missing {missing} or source id {doc.get('source')!r} "
                         f"differs from the file name")
    return doc


def describe(source: str) -> Source:
    """The citation, verification and conventions of one source."""
    doc = _read(source)
    return Source(doc["source"], doc["citation"], doc["url"], doc["table"], doc["verified"], doc["notes"],
                  MappingProxyType(doc["pricing"]))


def _row(source: str, index: int, fields: dict[str, Any]) -> PublishedRow:
    where = f"{source}.json row {index}"
    unknown = sorted(set(fields) - set(ROW_KEYS))
    missing = [k for k in ROW_KEYS if k not in fields]
    if unknown or missing:
        raise ValueError(f"{where}: unknown keys {unknown}, missing keys {missing}")
    if fields["metric"] not in METRICS:
        raise ValueError(f"{where}: metric {fields['metric']!r} is not one of {', '.join(METRICS)}")
    if fields["published_memory_gb"] is not None and fields["memory_scope"] not in MEMORY_SCOPES:
        raise ValueError(f"{where}: a printed memory needs memory_scope, one of {', '.join(MEMORY_SCOPES)}; "
                         f"got {fields['memory_scope']!r}")
    if fields["recompute"] not in (*RECOMPUTE, None):
        raise ValueError(f"{where}: recompute {fields['recompute']!r} is not one of {RECOMPUTE} or null")
    return PublishedRow(
        source=source,
        model=RunModel(*(fields[k] for k in _SHAPE)),
        cluster=RunCluster(*(fields[k] for k in _CLUSTER)),
        layout=RunLayout(*(fields[k] for k in _LAYOUT)),
        precision=fields["precision"],
        metric=fields["metric"],
        published=float(fields["published"]),
        also=MappingProxyType(dict(fields["also"])),
        published_memory_gb=fields["published_memory_gb"],
        memory_kind=fields["memory_kind"],
        memory_scope=fields["memory_scope"],
        sweep=fields["sweep"],
        authors_choice=bool(fields["authors_choice"]),
        notes=fields["notes"],
        printed=MappingProxyType(dict(fields["printed"])),
    )


def load(sources: Iterable[str] | None = None) -> list[PublishedRow]:
    """Every row of the named sources (all of them when None), in file order."""
    rows: list[PublishedRow] = []
    for source in SOURCES if sources is None else list(sources):
        doc = _read(source)
        rows += [_row(source, i, {**doc["defaults"], **row}) for i, row in enumerate(doc["rows"])]
    return rows
