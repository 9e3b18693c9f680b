"""A catalogue of the machines you do not have: each figure with where it comes from.

    h100 = device("h100")
    h100.peak_flops["bf16"]          # 989.4e12 dense FLOP/s (NVIDIA's datasheet, without sparsity)
    h100.sustained_flops("bf16")     # peak x matmul_efficiency: what the planner prices a GEMM at
    h100.sources["peak_flops"]       # the datasheet's name and URL

Every figure is dense (NVIDIA's datasheets print the 2:4-sparse figure first, twice the dense
one; these are the dense ones). Bandwidths are bytes per second one way: NVLink's "900 GB/s"
is both directions together, 450 GB/s each way. NICs are one per GPU (rail-optimized, as
DGX/HGX hosts are built): HDR InfiniBand 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s.
Latencies are NCCL's own model (src/graph/tuning.cc, hwLat, ring / Simple protocol): 3.4 us
per NVLink hop, 14 us per network hop, plus its baseLat of 8.4 us per collective.

The sustained GEMM efficiency (matmul_efficiency: the fraction of peak a GEMM whose waves are
full sustains in a real step) is the one figure fitted, per device: no datasheet prints it, and
one H200's bf16 GEMMs measured 52-81% of the dense peak alone (`dt tune --device cuda`:
benchmarks/gpu_h200_20261204_first-run.md), more than a whole node under training load holds.
`dt plan --published --fit` picks, for each device, the value under which the published runs on
it (dt.plan.published) are predicted best, and reports each source's error with the value fitted
on the other sources (dt.plan.fit). The H200 is the H100's chip with more memory: it takes the
H100's. tf32 and fp32 are not fitted (no published run trained in them): 0.7 and 0.9, assumed.
Change a figure in one place: Device.matmul_efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DEVICES", "Device", "device"]

_A100_SHEET = ("NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column), "
               "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
               "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_H100_SHEET = ("NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column, dense = half the sparse figure), "
               "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_H200_SHEET = ("NVIDIA H200 Tensor Core GPU datasheet / product page (H200 SXM column), "
               "https://www.nvidia.com/en-us/data-center/h200/")
_NCCL_LATENCY = ("NCCL src/graph/tuning.cc: hwLat ring/Simple NVLink 3.4 us, NET 14 us "
                 "(https://github.com/NVIDIA/nccl)")
_HDR = "NVIDIA ConnectX-6 HDR InfiniBand: 200 Gb/s per port, https://www.nvidia.com/en-us/networking/infiniband-adapters/"
_NDR = "NVIDIA ConnectX-7 NDR InfiniBand: 400 Gb/s per port, https://www.nvidia.com/en-us/networking/infiniband-adapters/"
_EFFICIENCY = ("fitted to the published runs (dt plan --published --fit; dt.plan.fit): bf16 and fp16 on the "
               "A100 0.71, on the H100 (and H200, its chip) 0.57; tf32 0.7 and fp32 0.9 assumed")

_FLASH = ("FlashAttention-2 (Dao 2023, arXiv 2307.08691): forward 50-73% and backward up to 63% of the "
          "A100's "
          "peak; on the H100 it reaches 35% (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608), "
          "FlashAttention-3 up to 75% forward (740 TFLOP/s bf16); the backward about 0.8x the forward rate; "
          "the 2022 Triton FlashAttention (the kernel MPT's attn_impl='triton' runs) assumed at two thirds "
          "of FlashAttention-2's rate, the ratio of the two in the FlashAttention-2 paper's A100 benchmarks")
_STREAM = ("assumed: a streaming kernel (copy, add, norm) sustains about 85% of the datasheet's HBM "
           "bandwidth "
           "(the figure CUDA's bandwidthTest and STREAM-like kernels reach on A100 and H100)")
_WAVES = ("the SM count from NVIDIA's architecture whitepapers (A100: 108 SMs; H100 SXM: 132); the "
          "output tile cuBLAS's large bf16 kernels use (128 x 128 on Ampere, 128 x 256 on Hopper)")
_LINKS = ("assumed: NCCL's all-reduce bus bandwidth reaches about 80% of NVLink's one-way figure "
          "(nccl-tests on "
          "DGX A100: about 230 of 300 GB/s) and 90% of a NIC's line rate")
_GAP = "assumed: 3 us between two kernels of a step (launch and tail), the order CUDA's launch latency has"

TERA, GIGA = 1e12, 1e9


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a planner's caches key on it
class Device:
    """One accelerator and the links a host of them has; every figure dense, bytes per second one way."""

    name: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s: fp32, tf32, bf16, fp16
    hbm_bytes: float
    hbm_bandwidth: float
    nvlink_bandwidth: float  # one way, per GPU
    nvlink_latency: float  # seconds per hop
    nic_bandwidth: float  # one way, one NIC per GPU
    nic_latency: float
    gpus_per_host: int = 8
    matmul_efficiency: dict[str, float] = field(default_factory=lambda: {
        "fp32": 0.9, "tf32": 0.7, "bf16": 0.7, "fp16": 0.7})  # each device's own below (_FITTED)
    sources: dict[str, str] = field(default_factory=dict)
    sms: int = 108  # streaming multiprocessors: a GEMM's tiles run in waves of this many
    gemm_tile: tuple[int, int] = (128, 128)  # output rows x columns one SM computes at a time
    hbm_efficiency: float = 0.85  # the fraction of hbm_bandwidth a streaming kernel sustains
    attention_efficiency: dict[str, tuple[float, float]] = field(default_factory=dict)  # kernel: fwd, bwd
    kernel_overhead: float = 3e-6  # seconds between two kernels on the device (launch and tail)
    link_efficiency: tuple[float, float] = (0.8, 0.9)  # NVLink, NIC: busbw NCCL sustains over the wire's

    def sustained_flops(self, dtype: str) -> float:
        """What a large GEMM of `dtype` sustains: peak x the stated efficiency."""
        if dtype not in self.peak_flops:
            raise ValueError(f"{self.name} has no figure for dtype {dtype!r}: one of "
                             f"{', '.join(self.peak_flops)}")
        return self.peak_flops[dtype] * self.matmul_efficiency[dtype]


def _sources(sheet: str, nic: str) -> dict[str, str]:
    return {"peak_flops": sheet, "hbm": sheet, "nvlink_bandwidth": sheet, "nvlink_latency": _NCCL_LATENCY,
            "nic_bandwidth": nic, "nic_latency": _NCCL_LATENCY, "matmul_efficiency": _EFFICIENCY,
            "attention_efficiency": _FLASH, "hbm_efficiency": _STREAM, "sms": _WAVES, "gemm_tile": _WAVES,
            "link_efficiency": _LINKS, "kernel_overhead": _GAP}


def _fitted(chip: str) -> dict[str, float]:
    """A chip's GEMM efficiencies: bf16 and fp16 fitted (dt.plan.fit), tf32 and fp32 assumed."""
    half = {"ampere": 0.71, "hopper": 0.57}[chip]
    return {"fp32": 0.9, "tf32": 0.7, "bf16": half, "fp16": half}



_AMPERE_ATTENTION = {"flash2": (0.6, 0.5), "triton": (0.4, 0.3)}
_HOPPER_ATTENTION = {"flash2": (0.35, 0.3), "flash3": (0.6, 0.48), "cudnn": (0.6, 0.48),
                     "triton": (0.25, 0.2)}


_HOPPER_FLOPS = {"fp32": 66.9 * TERA, "tf32": 494.7 * TERA, "bf16": 989.4 * TERA, "fp16": 989.4 * TERA}

DEVICES: dict[str, Device] = {
    "a100": Device("A100 SXM 80GB", {"fp32": 19.5 * TERA, "tf32": 156 * TERA, "bf16": 312 * TERA,
                                     "fp16": 312 * TERA},
                   hbm_bytes=80 * GIGA, hbm_bandwidth=2039 * GIGA, nvlink_bandwidth=300 * GIGA,
                   nvlink_latency=3.4e-6, nic_bandwidth=25 * GIGA, nic_latency=14e-6,
                   sources=_sources(_A100_SHEET, _HDR), attention_efficiency=_AMPERE_ATTENTION,
                   matmul_efficiency=_fitted("ampere")),
    "h100": Device("H100 SXM 80GB", dict(_HOPPER_FLOPS), hbm_bytes=80 * GIGA, hbm_bandwidth=3350 * GIGA,
                   nvlink_bandwidth=450 * GIGA, nvlink_latency=3.4e-6, nic_bandwidth=50 * GIGA,
                   nic_latency=14e-6, sources=_sources(_H100_SHEET, _NDR), sms=132, gemm_tile=(128, 256),
                   attention_efficiency=_HOPPER_ATTENTION, matmul_efficiency=_fitted("hopper")),
    "h200": Device("H200 SXM 141GB", dict(_HOPPER_FLOPS), hbm_bytes=141 * GIGA, hbm_bandwidth=4800 * GIGA,
                   nvlink_bandwidth=450 * GIGA, nvlink_latency=3.4e-6, nic_bandwidth=50 * GIGA,
                   nic_latency=14e-6, sources=_sources(_H200_SHEET, _NDR), sms=132, gemm_tile=(128, 256),
                   attention_efficiency=_HOPPER_ATTENTION, matmul_efficiency=_fitted("hopper")),
}


def device(name: str) -> Device:
    """A catalogue device by name (a100, h100, h200); one clear line otherwise."""
    key = name.lower().replace("-", "").replace(" ", "")
    if key not in DEVICES:
        raise ValueError(f"no device {name!r} in the catalogue: one of {', '.join(DEVICES)}")
    return DEVICES[key]
