"""A kernel's seconds on a catalogue GPU: GEMMs by shape, attention at its kernel's rate, the rest
at memory bandwidth, each kernel plus the device's gap between kernels.

    GEMM       2 m n k FLOPs at peak x matmul_efficiency x its last wave's fill: the output's
               ceil(m / tile_m) x ceil(n / tile_n) tiles run in waves of one per SM, and a last
               wave that fills few SMs costs a whole wave (tensor parallel's narrow GEMMs pay it);
               never faster than its operands' bytes at HBM bandwidth; plus its output's bytes at
               HBM bandwidth (each tile writes its result after its products: a fixed cost per
               tile that a short k, a small model's, does not amortize)
    attention  the kernel's FLOPs at peak x the kernel's forward or backward efficiency
               (dt.cost.devices.attention_efficiency), its query tiles in waves the same way
    memory     bytes read and written at hbm_bandwidth x hbm_efficiency

Every figure is the device's (dt.cost.devices), each with its source there: nothing here is
fitted to a run.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from dt.cost.devices import Device
from dt.cost.kernels import Kernel

__all__ = ["kernel_seconds", "kernels_seconds", "wave_fill"]


def wave_fill(tiles: int, sms: int) -> float:
    """The fraction of the SMs' time a grid of `tiles` equal tiles keeps busy: tiles / (waves x sms)."""
    if tiles <= 0:
        return 1.0
    waves = -(-tiles // sms)
    return tiles / (waves * sms)


@functools.lru_cache(maxsize=1 << 16)
def _gemm_seconds(rate: float, bandwidth: float, sms: int, tile: tuple[int, int], rows: int, cols: int,
                  inner: int, batch: int, itemsize: int) -> float:
    """A (rows x inner) by (inner x cols) GEMM, `batch` of them (Kernel's m, k, n); rate: the FLOP/s of
    a GEMM whose waves are full; bandwidth: what its operands stream at."""
    tile_rows, tile_cols = tile
    tiles = batch * -(-rows // tile_rows) * -(-cols // tile_cols)
    arithmetic = 2.0 * rows * cols * inner * batch / (rate * wave_fill(tiles, sms))
    traffic = batch * (rows * inner + inner * cols + rows * cols) * itemsize / bandwidth
    epilogue = batch * rows * cols * itemsize / bandwidth  # each tile's output written after its products
    return max(arithmetic, traffic) + epilogue


def kernel_seconds(kernel: Kernel, device: Device, precision: str, attention: str,
                   itemsize: int = 2) -> float:
    """Seconds of one kernel on `device` (`attention`: the fused kernel's name in the device's table)."""
    if kernel.kind == "gemm":
        rate = device.peak_flops[precision] * device.matmul_efficiency[precision]
        bandwidth = device.hbm_bandwidth * device.hbm_efficiency
        work = _gemm_seconds(rate, bandwidth, device.sms, device.gemm_tile, rows=kernel.m, cols=kernel.n,
                             inner=kernel.k, batch=kernel.batch, itemsize=itemsize)
    elif kernel.kind == "attention":
        fwd, bwd = device.attention_efficiency[attention]
        efficiency = bwd if kernel.backward else fwd
        fill = wave_fill(kernel.tiles, device.sms)
        work = kernel.flops / (device.peak_flops[precision] * efficiency * fill)
    else:
        work = kernel.nbytes / (device.hbm_bandwidth * device.hbm_efficiency)
    return work + device.kernel_overhead


def kernels_seconds(kernels: Iterable[Kernel], device: Device, precision: str, attention: str,
                    itemsize: int = 2) -> float:
    return sum(kernel_seconds(kernel, device, precision, attention, itemsize) for kernel in kernels)
