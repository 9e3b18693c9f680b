"""What the ranks run on: this machine as `dt tune` measured it, or H hosts of a catalogue device.

A Cluster prices the three things a step does: arithmetic (FLOP/s per rank,
sustained: the peak times a stated efficiency, or measured), collectives
(alpha, beta, gamma inside a host and between hosts: dt.cost.levels.Levels)
and memory (bytes per rank; bandwidth for the optimizer's elementwise pass).

The catalogue's figures are the vendors' datasheets (dense, no sparsity):
A100 SXM 80 GB 312 TFLOP/s bf16, HBM2e 2.0 TB/s, NVLink 3 300 GB/s each way;
H100 SXM 80 GB 989 TFLOP/s bf16, HBM3 3.35 TB/s, NVLink 4 450 GB/s each way;
H200 141 GB HBM3e 4.8 TB/s, H100's compute and NVLink. Between hosts one
NIC per GPU (rail-optimised): HDR 200 Gb/s (25 GB/s) with A100, NDR
400 Gb/s (50 GB/s) with H100/H200. Latencies: ~5 us per NVLink step (the
nccl-tests small-message floor), ~10 us per InfiniBand step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from dt.cost.levels import Levels
from dt.cost.machine import Machine, machine

__all__ = ["CATALOGUE", "Cluster", "Device", "catalogue_cluster", "local_cluster"]

GB = 1e9


@dataclass(frozen=True)
class Device:
    name: str
    flops: dict[str, float]  # peak dense FLOP/s per precision
    memory: int  # bytes
    mem_bw: float  # bytes/s
    link: float  # bytes/s each way inside a host (NVLink)
    nic: float  # bytes/s each way between hosts, one NIC per GPU
    link_alpha: float = 5e-6
    nic_alpha: float = 10e-6


CATALOGUE = {
    "a100": Device("A100 SXM 80GB", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12, "tf32": 156e12},
                   80 * 2**30, 2.0e12, 300 * GB, 25 * GB),
    "h100": Device("H100 SXM 80GB", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "tf32": 494e12},
                   80 * 2**30, 3.35e12, 450 * GB, 50 * GB),
    "h200": Device("H200 SXM 141GB", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "tf32": 494e12},
                   141 * 10**9, 4.8e12, 450 * GB, 50 * GB),
}

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "float32": 4, "float64": 8}


@dataclass(frozen=True)
class Cluster:
    name: str
    hosts: int
    per_host: int
    flops: float  # sustained FLOP/s per rank (0: measured per layer shape, dt.plan.compute)
    levels: Levels
    memory: int  # bytes per rank (on CPU: the machine's, shared by every rank)
    mem_bw: float  # bytes/s of one rank's elementwise passes (the optimizer)
    precision: str = "fp32"
    efficiency: float = 1.0  # the stated fraction of peak flops sustains
    peak: float = 0.0  # peak FLOP/s per rank, for MFU
    source: str = ""
    shared_memory: bool = False  # CPU: every rank's bytes come out of one machine's memory

    @property
    def world(self) -> int:
        return self.hosts * self.per_host

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.precision]

    def host_of(self, rank: int) -> int:
        return rank // self.per_host


def catalogue_cluster(device: str, hosts: int, per_host: int, precision: str = "bf16",
                      efficiency: float = 0.5) -> Cluster:
    """H hosts of G catalogue GPUs: NVLink inside, one NIC per GPU between."""
    d = CATALOGUE[device]
    peak = d.flops[precision]
    intra = Machine(d.link_alpha, 1 / d.link, 1 / d.mem_bw, source=d.name + " NVLink")
    inter = Machine(d.nic_alpha, 1 / d.nic, 1 / d.mem_bw, source=d.name + " NIC")
    return Cluster(f"{hosts} x {per_host} {d.name}", hosts, per_host, peak * efficiency,
                   Levels(intra, inter), d.memory, d.mem_bw, precision, efficiency, peak,
                   f"catalogue ({d.name}), sustained {efficiency:.0%} of {peak / 1e12:.0f} TFLOP/s "
                   f"{precision} peak (stated, not measured)")


def local_cluster(world: int, precision: str = "float32", hosts: int = 1) -> Cluster:
    """This machine: `dt tune`'s figures for the shared-memory wire (the defaults when untuned).

    Compute is measured per layer shape (flops 0: dt.plan.compute times the
    layers); the optimizer's pass runs at the memcpy rate `dt tune` saved.
    """
    from dt.args import available_memory

    intra = machine("shm", world)
    inter = machine("gloo", world) if hosts > 1 else intra
    mem = intra.mem or 0.21e-9
    per_host = world // hosts
    total = available_memory() or 0
    return Cluster(f"this machine ({os.cpu_count()} cores, {world} ranks)", hosts, per_host, 0.0,
                   Levels(intra, inter), total, 1 / mem, precision, 1.0, 0.0,
                   f"measured here: collectives {intra.source}; compute timed per layer shape",
                   shared_memory=True)


def with_efficiency(c: Cluster, efficiency: float) -> Cluster:
    return replace(c, flops=c.peak * efficiency, efficiency=efficiency)
