"""Published tables of large training runs: what the planner's at-scale figures are checked against.

Data only, each row as its source printed it (the field comments say which column), with
the citation beside it. The planner predicts each row's per-GPU throughput for the same model,
layout and cluster and prints it beside the published figure, and ranks layouts for the same
model and cluster beside the one the authors ran.

Sources:
- MEGATRON_2021: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC21, arXiv:2104.04473, Table 1 (weak scaling, GPT models
  1.7B-1T, sequence 2048, vocabulary 51,200, A100 80GB on Selene: DGX A100 hosts of 8 GPUs,
  NVLink inside, 8 HDR InfiniBand NICs per host; mixed precision, interleaved 1F1B schedule;
  throughput end to end, data loading and optimizer included; no activation recompute figure
  is in the table: the paper's runs use full recompute, Section 5 / eq. (3)).
- LLAMA3_2024: Grattafiori et al., "The Llama 3 Herd of Models", arXiv:2407.21783, Section
  3.3.2, Table 4 (Llama 3 405B pre-training on H100 80GB, Meta's Grand Teton hosts of 8 GPUs,
  NVLink inside, 400 Gb/s RoCE between; bf16; TFLOP/s per GPU and bf16 MFU as printed).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LLAMA3_2024", "LLAMA3_405B", "MEGATRON_2021", "PublishedRun", "TABLES"]


@dataclass(frozen=True)
class PublishedRun:
    """One row of a published table: the model, the layout, the cluster and what it sustained."""

    source: str  # citation: paper, table
    params: float  # as printed (billions x 1e9)
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int
    tp: int
    pp: int
    dp: int
    cp: int
    gpus: int
    global_batch: int  # sequences per step
    device: str  # dt.cost.devices name
    tflops_per_gpu: float  # achieved, as printed
    peak_fraction: float | None = None  # as printed (Megatron: % of peak; Llama 3: bf16 MFU)
    ffn_hidden: int | None = None  # None: 4 * n_embd (GPT)
    n_kv_head: int | None = None  # None: n_head
    gated: bool = False  # SwiGLU


_MEGATRON = "Narayanan et al. 2021 (Megatron-LM, SC21, arXiv:2104.04473), Table 1"


def _megatron(params: float, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
              batch: int, tflops: float, percent: float) -> PublishedRun:
    return PublishedRun(_MEGATRON, params * 1e9, layers, hidden, heads, 51200, 2048, tp, pp,
                        gpus // (tp * pp), 1, gpus, batch, "a100", tflops, percent / 100)


# (billions of parameters, attention heads, hidden, layers, tensor-parallel, pipeline-parallel,
#  GPUs, batch size, achieved TFLOP/s per GPU, % of theoretical peak)
MEGATRON_2021 = [
    _megatron(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44),
    _megatron(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44),
    _megatron(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46),
    _megatron(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43),
    _megatron(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44),
    _megatron(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45),
    _megatron(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47),
    _megatron(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50),
    _megatron(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52),
    _megatron(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52),
]

_LLAMA3 = "Grattafiori et al. 2024 (The Llama 3 Herd of Models, arXiv:2407.21783), Section 3.3.2, Table 4"
# Llama 3 405B (Table 3 of the same paper): 126 layers, model dimension 16,384, FFN 53,248,
# 128 attention heads, 8 key/value heads, vocabulary 128,256.
LLAMA3_405B = {"params": 405e9, "n_layer": 126, "n_embd": 16384, "n_head": 128, "n_kv_head": 8,
               "ffn_hidden": 53248, "vocab_size": 128256, "gated": True}


def _llama3(gpus: int, tp: int, cp: int, pp: int, dp: int, seq: int, batch_per_dp: int, tflops: float,
            mfu: float) -> PublishedRun:
    a = LLAMA3_405B
    return PublishedRun(_LLAMA3, a["params"], a["n_layer"], a["n_embd"], a["n_head"], a["vocab_size"], seq,
                        tp, pp, dp, cp, gpus, batch_per_dp * dp, "h100", tflops, mfu / 100,
                        ffn_hidden=a["ffn_hidden"], n_kv_head=a["n_kv_head"], gated=True)


# (GPUs, TP, CP, PP, DP, sequence length, batch size per DP group, TFLOP/s per GPU, bf16 MFU %)
LLAMA3_2024 = [
    _llama3(8192, 8, 1, 16, 64, 8192, 32, 430, 43),
    _llama3(16384, 8, 1, 16, 128, 8192, 16, 400, 41),
    _llama3(16384, 8, 16, 16, 8, 131072, 16, 380, 38),
]

TABLES = {"megatron-2021": MEGATRON_2021, "llama3-2024": LLAMA3_2024}
