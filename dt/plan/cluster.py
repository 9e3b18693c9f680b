"""What the ranks run on: this machine as `dt tune` measured it, or H hosts of a catalogue device.

A Cluster prices the three things a step does: arithmetic (FLOP/s per rank,
sustained: the peak times a stated efficiency, or measured), collectives
(alpha, beta, gamma inside a host and between hosts: dt.cost.levels.Levels)
and memory (bytes per rank; bandwidth for the optimizer's elementwise pass).

The catalogue's figures are dt.cost.devices' (datasheets, each cited there);
its stated matmul efficiency is the default sustained fraction of peak.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

from dt.cost.devices import Device
from dt.cost.devices import device as catalogue_device
from dt.cost.levels import Levels
from dt.cost.machine import DEFAULT_SHM_MACHINE, Machine, machine
from dt.cost.stack import Stack, stack
from dt.units import plural

__all__ = ["TRAIN_PRECISION", "Cluster", "catalogue_cluster", "local_cluster"]


ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "float32": 4, "float64": 8}
# A catalogue precision as dt train runs it on a GPU (--precision: the autocast dtype; the
# weights and Adam's state stay float32)
TRAIN_PRECISION = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}


@dataclass(frozen=True, eq=False)  # hashed by identity: every price is cached per cluster, cheaply
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
    # where dt train's own layers are timed for the stage's compute (dt.plan.timed): "cpu" this
    # machine, "cuda" this host's GPU (a catalogue device with --timed), "" nowhere (kernels priced)
    timed: str = ""
    device: Device | None = None  # a catalogue GPU (dt.cost.devices)
    stack_name: str = "dt"  # the software that runs the step (dt.cost.stack): its kernels, bytes, overlaps

    @property
    def gpu(self) -> Device | None:
        """The catalogue device, where the step is priced kernel by kernel (not timed on this host)."""
        return self.device if not self.timed else None

    @property
    def stack(self) -> Stack:
        """The stack, as it trains at this cluster's precision."""
        return _stack_at(self.stack_name, self.itemsize, self.precision)

    @property
    def param_itemsize(self) -> int:
        """Bytes per weight as the optimizer keeps it (what FSDP gathers): the stack's on a GPU."""
        return self.stack.weight_bytes if self.device else self.itemsize

    @property
    def grad_itemsize(self) -> int:
        """Bytes per gradient element the data-parallel reduction moves: the stack's on a GPU; this
        machine's (and dt train's under autocast) are the weights' own float32."""
        return self.stack.reduce_bytes if self.device else self.itemsize

    @property
    def world(self) -> int:
        return self.hosts * self.per_host

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.precision]

    def host_of(self, rank: int) -> int:
        return rank // self.per_host


@functools.cache
def _stack_at(name: str, itemsize: int, precision: str) -> Stack:
    return stack(name).at(itemsize, precision)


def catalogue_cluster(name: str, hosts: int, per_host: int, precision: str = "bf16",
                      efficiency: float | None = None, timed_gpu: str = "",
                      stack_name: str = "dt", host_network_gbit: float | None = None) -> Cluster:
    """H hosts of G catalogue GPUs (dt.cost.devices): NVLink inside, one NIC per GPU between.

    efficiency: the sustained fraction of peak (default: the catalogue's stated one).
    host_network_gbit: each host's network, all its NICs together, Gbit/s one way, for
    hosts built with fewer or slower NICs than one of the catalogue's per GPU (4 x 100 Gbit/s
    for 8 GPUs, say); each rank gets its share, G ranks sending at once, as data-parallel
    groups with a rank on every host do (default: the catalogue's NIC per GPU).
    timed_gpu: this host's GPU's name, where dt train's layers and Adam are to be timed on it
    (`dt plan --timed`) instead of priced kernel by kernel; the links stay the catalogue's.
    stack_name: the software running the step (dt.cost.stack), dt's own by default."""
    device = catalogue_device(name)
    peak = device.peak_flops[precision]
    if efficiency is not None:  # the user's figure for a large GEMM's fraction of peak
        device = replace(device, matmul_efficiency={**device.matmul_efficiency, precision: efficiency})
    sustained = device.matmul_efficiency[precision]
    nvlink, nic = device.link_efficiency
    intra = Machine(device.nvlink_latency, 1 / (device.nvlink_bandwidth * nvlink), 1 / device.hbm_bandwidth,
                    source=device.name + " NVLink")
    per_rank = device.nic_bandwidth if not host_network_gbit else host_network_gbit * 1e9 / 8 / per_host
    inter = Machine(device.nic_latency, 1 / (per_rank * nic), 1 / device.hbm_bandwidth,
                    source=device.name + (f" hosts' {host_network_gbit:g} Gbit/s network" if host_network_gbit
                                          else " NIC"))
    compute = (f"dt train's layers and Adam timed on this host's {timed_gpu} ({precision} autocast)"
               if timed_gpu else f"each kernel priced: GEMMs at {sustained:.0%} of {peak / 1e12:.0f} TFLOP/s "
               f"{precision} less their waves' fill, attention at its kernel's rate, the rest at "
               f"{device.hbm_efficiency:.0%} of HBM bandwidth (dt.plan.pricing); stack {stack_name}")
    return Cluster(name=f"{hosts} x {per_host} {device.name}", hosts=hosts, per_host=per_host,
                   flops=peak * sustained, levels=Levels(intra, inter), memory=int(device.hbm_bytes),
                   mem_bw=device.hbm_bandwidth * device.hbm_efficiency, precision=precision,
                   efficiency=sustained, peak=peak,
                   source=f"catalogue ({device.name}, dt.cost.devices), {compute}",
                   timed="cuda" if timed_gpu else "", device=device, stack_name=stack_name)


def local_cluster(world: int, precision: str = "float32", hosts: int = 1) -> Cluster:
    """This machine: `dt tune`'s figures for the shared-memory wire (the defaults when untuned);
    with hosts > 1 a simulated cluster (`dt cluster`) of hosts x world / hosts ranks, priced with
    the figures dt's own `auto` agrees on there (dt.collectives.agreed.figures_on: those `dt tune`
    measured under `dt cluster` on that topology; never a loopback figure across hosts).

    Compute is measured per layer shape (flops 0: dt.plan.compute times the
    layers); the optimizer's pass runs at the memcpy rate `dt tune` saved.
    """
    from dt.args import available_memory

    intra = machine("shm", world)
    per_host = world // hosts
    levels, source = Levels(intra, intra), f"collectives {intra.source}"
    if hosts > 1:
        from dt.collectives.agreed import figures_on, levels_of

        figures = figures_on("gloo", world, f"{hosts}x{per_host}", per_host, True)
        note = f"; {figures['note']}" if figures["note"] else ""
        levels, source = levels_of(figures), f"collectives {figures['source']}{note}"
    memcpy = intra.mem or DEFAULT_SHM_MACHINE.mem  # seconds per byte
    where = f"{hosts} simulated hosts x {plural(per_host, 'rank')}" if hosts > 1 else plural(world, "rank")
    return Cluster(name=f"this machine ({plural(os.cpu_count() or 1, 'core')}, {where})", hosts=hosts,
                   per_host=per_host, flops=0.0, levels=levels, memory=available_memory() or 0,
                   mem_bw=1 / memcpy, precision=precision, efficiency=1.0, peak=0.0,
                   source=f"measured here: {source}; compute timed per layer shape", shared_memory=True,
                   timed="cpu")
