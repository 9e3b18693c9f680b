"""Devices: which device a rank works on, and how to time work that runs there.

One device per rank, and every internal buffer of a group on that group's
device: CPU tensors over gloo, CUDA tensors over NCCL (which rejects CPU
tensors). Under NCCL each rank owns one GPU (its LOCAL_RANK); two ranks on
one GPU are refused, as NCCL itself refuses a communicator with a GPU twice.

Timing: on a GPU, `time.perf_counter()` around a kernel launch or an NCCL
call measures the enqueue, not the work. `Stopwatch` records CUDA events on
the current stream instead and reads them only when asked, so timing does
not serialise the stream; on the CPU it is perf_counter.
"""

from __future__ import annotations

import os
import time

import torch

__all__ = ["DEVICES", "Stopwatch", "backend_for", "clock", "gpu_free", "local_device", "synchronize"]

DEVICES = ("auto", "cpu", "cuda")  # what every command's --device accepts


def backend_for(device: str) -> str:
    """The torch.distributed backend for a device kind: "auto" is nccl when CUDA is there, else gloo."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return "nccl"
    if device == "cpu":
        return "gloo"
    raise ValueError(f"unknown device {device!r}: choose cpu, cuda or auto")


def gpu_free(device: str) -> int | None:
    """A GPU's free bytes when `device` runs on GPUs (each rank holds its own), else None: the
    CPU's ranks share this machine's memory (dt.args.available_memory)."""
    if backend_for(device) != "nccl":
        return None
    return int(torch.cuda.mem_get_info(0)[0])


def local_device(backend: str, local_rank: int | None = None, local_world: int | None = None
                 ) -> torch.device:
    """This rank's device: the CPU under gloo; under NCCL GPU number LOCAL_RANK, one per rank.

    Raises, naming the counts, when there are fewer GPUs than ranks on this host.
    """
    if backend != "nccl":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("backend nccl needs CUDA, and torch sees no GPU on this host")
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    local_world = (int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if local_world is None
                   else local_world)
    have = torch.cuda.device_count()
    if local_world > have or local_rank >= have:
        raise RuntimeError(f"{local_world} ranks on this host but only {have} GPU(s): NCCL needs one "
                           f"GPU per rank (rank with LOCAL_RANK {local_rank} has none of its own)")
    return torch.device("cuda", local_rank)


def clock(device: torch.device | None = None) -> float:
    """perf_counter once the work queued on this thread's stream is done (a plain read on the CPU).

    For step-level timings (a step's start and end, a backward's end): on a GPU
    it waits for the current stream only, so communication running on other
    streams keeps overlapping and is not charged to compute.
    """
    if device is not None and device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return time.perf_counter()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Elapsed time of work on a device: CUDA events on a GPU, perf_counter on the CPU.

        sw = Stopwatch(device); sw.start(); ...; sw.stop(); sw.seconds()

    On a GPU, start/stop record events on the current stream and `seconds()`
    waits for the stop event: the interval the device spent, not the enqueue.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._t0 = self._t1 = 0.0
        self._events: tuple | None = None

    def start(self) -> Stopwatch:
        if self._cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            self._events = (begin, end)
        else:
            self._t0 = time.perf_counter()
        return self

    def stop(self) -> Stopwatch:
        if self._cuda:
            assert self._events is not None, "stop() before start()"
            self._events[1].record()
        else:
            self._t1 = time.perf_counter()
        return self

    def seconds(self) -> float:
        if self._cuda:
            assert self._events is not None, "seconds() before start()"
            self._events[1].synchronize()
            return self._events[0].elapsed_time(self._events[1]) / 1e3
        return self._t1 - self._t0
