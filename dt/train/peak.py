"""MFU's denominator: the peak FLOP/s of the cores (or devices) a `dt train` job computes on.

On a CPU:

    peak = per-core rate x cores used
    per-core rate  the float32 matmul rate of ONE thread: the fastest of REPEATS single
                   512^2 products timed here at start (each a few milliseconds: other
                   processes and noise only ever slow a product down, so the fastest
                   repeat is the core's own rate), or `dt tune`'s fastest one-thread
                   figure when it is higher (dt.cost.compute_rate.tuned_core_rate)
    cores used     threads per rank x ranks on a host, at most the host's cores, x hosts
                   (dt.cost.compute_rate.cores_used)

so two ranks of one thread each on a 2-core machine divide by two cores' rate,
and one rank of one thread by one core's. On a GPU: one device's matmul rate
in the run's dtype (the fastest of REPEATS 4096^2 products) x the devices. With
--peak-flops (a datasheet's figure): that x the processes.

An MFU above 100% is then impossible unless the peak was underestimated (the
machine busier while the peak was timed than while the run was): format_mfu
says so in place of the number.
"""

from __future__ import annotations

import os

import torch

from dt.cost.compute_rate import cores_used, tuned_core_rate
from dt.device import clock
from dt.units import plural

__all__ = ["REPEATS", "format_mfu", "job_peak_flops", "measure_core_rate"]

REPEATS = 20  # short products timed; the fastest is the rate
OVER_PEAK = ">100% (the peak was underestimated: run dt tune on a quiet machine)"


def _fastest_rate(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    """FLOP/s of the fastest of `repeats` n x n products, after one warm-up."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)  # warm: kernels chosen, memory touched
    best = float("inf")
    for _ in range(repeats):
        t0 = clock(device)
        torch.mm(a, b)
        best = min(best, clock(device) - t0)
    return 2 * n ** 3 / best


def measure_core_rate(n: int = 512, repeats: int = REPEATS) -> float:
    """One core's float32 matmul rate (FLOP/s): the fastest of `repeats` n x n products on one thread."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _fastest_rate(torch.device("cpu"), torch.float32, n, repeats)
    finally:
        torch.set_num_threads(saved)


def job_peak_flops(per_device: float | None, world: int, device: str, dtype: torch.dtype,
                   threads: int, ranks_per_host: int, cores: int | None = None) -> tuple[float, str]:
    """MFU's denominator for a run of `world` processes, `ranks_per_host` to a host, each on
    `threads` threads; and a line saying where it came from (the module doc says how)."""
    if per_device is not None:
        return per_device * world, f"--peak-flops {per_device:.3g} x {plural(world, 'process')}"
    if device == "cuda":
        rate = _fastest_rate(torch.device("cuda"), dtype, 4096, 5)
        return rate * world, (f"the fastest of 5 {dtype} 4096^2 matmuls, {rate / 1e12:.1f} TFLOP/s "
                              f"x {plural(world, 'device')}")
    cores = cores or os.cpu_count() or 1
    hosts = max(1, world // max(1, ranks_per_host))
    used = cores_used(threads, ranks_per_host, cores, hosts)
    measured, tuned = measure_core_rate(), tuned_core_rate(cores=cores)
    core = max(measured, tuned or 0.0)
    where = "dt tune's one-thread figure" if tuned and tuned >= measured else \
        f"the fastest of {REPEATS} float32 512^2 matmuls on one thread"
    per_host = f"{threads} thread(s) x {ranks_per_host} rank(s), at most {cores} cores" + (
        f", x {hosts} hosts" if hosts > 1 else "")
    return core * used, f"{core / 1e9:.1f} GFLOP/s per core ({where}) x {used} core(s) ({per_host})"


def format_mfu(fraction: float) -> str:
    """An MFU as printed: a percentage, or what a figure above 100% means (never as if true)."""
    return f"{100 * fraction:.2f}%" if fraction <= 1 else OVER_PEAK
