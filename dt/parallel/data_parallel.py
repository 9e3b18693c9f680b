"""Data parallel: every rank holds the whole model, sees 1/N of the batch, and
averages gradients with its peers before the optimizer step.

    model = DistributedDataParallel(model)      # broadcasts rank 0's weights
    loss_fn(model(x_local), y_local).backward()  # grads are averaged on return
    optimizer.step()

What it costs: one all-reduce of every gradient per step. With the ring that
is 2(N-1)/N * 4 Psi bytes sent per rank for Psi fp32 parameters
(cost.ring_all_reduce), about 2 * 4 Psi whatever N is, in 2(N-1)
sequential steps per bucket.

How it hides that cost (as torch's DDP does):

- Buckets. Gradients are packed into flat buffers, filled in reverse
  registration order, the order backward produces them. One collective per
  bucket, not per tensor, so small tensors do not each pay a latency; the
  first bucket is small (1 MB) so communication starts early in backward.
- Overlap. A hook fires when a parameter's gradient has been accumulated; when
  a bucket's last gradient arrives, its all-reduce is queued *asynchronously*
  on the group's communication thread and backward goes on computing the
  earlier layers' gradients meanwhile. Buckets are launched strictly in bucket
  order, so every rank issues the same collectives in the same order.
- One wait. A callback queued on the autograd engine runs when backward's
  compute is done: it launches any bucket still missing gradients (parameters
  unused in this step are reduced as zeros, on every rank alike, so nothing
  hangs), waits for all of them, and points each `.grad` at its slot of the
  averaged bucket. Only the communication still running then is *exposed*.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from dt import transport
from dt.collectives import all_gather, all_reduce, broadcast
from dt.collectives.ops import ReduceOp
from dt.transport import resolve_group

__all__ = ["Bucket", "DistributedDataParallel", "StepStats", "make_buckets"]

MB = 1024 * 1024


@dataclass
class Bucket:
    """A flat buffer holding the gradients of a run of parameters, back to back."""

    params: list[nn.Parameter]
    offsets: list[int]
    buffer: torch.Tensor
    arrived: set[int] = field(default_factory=set)  # indices of params whose grad is in
    work: Any = None

    def slot(self, i: int) -> torch.Tensor:
        p = self.params[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + p.numel()].view_as(p)

    @property
    def full(self) -> bool:
        return len(self.arrived) == len(self.params)


def make_buckets(params: list[nn.Parameter], first_bytes: int, cap_bytes: int) -> list[list[int]]:
    """Group parameter indices (already in backward order) into buckets.

    A bucket closes once it holds at least its limit (first bucket: first_bytes,
    then cap_bytes), as torch's DDP does, or when the dtype changes (one flat
    buffer has one dtype). A parameter larger than the cap gets a bucket alone.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, p in enumerate(params):
        if current and p.dtype != params[current[0]].dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += p.numel() * p.element_size()
        if size >= (first_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class StepStats:
    """What the last synchronised backward cost on this rank (seconds, bytes)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    collectives: int = 0
    compute_s: float = 0.0  # backward start -> last gradient computed
    comm_s: float = 0.0  # time the collectives ran, summed
    exposed_s: float = 0.0  # time backward waited for communication after its compute
    hidden_s: float = 0.0  # comm_s - exposed_s: communication that overlapped compute


class DistributedDataParallel(nn.Module):
    """Wrap `module` so that backward leaves gradients averaged over `group` in `.grad`."""

    def __init__(self, module: nn.Module, group: Any = None, bucket_cap_mb: float = 25,
                 first_bucket_mb: float = 1, algorithm: str = "auto", overlap: bool = True):
        super().__init__()
        self.module = module
        self.group = resolve_group(group)
        self.algorithm = algorithm
        self.overlap = overlap
        self._check_same_shapes()
        self._broadcast_from_first_rank()

        params = [p for p in module.parameters() if p.requires_grad]
        params.reverse()  # backward produces the last layer's gradients first
        self.buckets: list[Bucket] = []
        for idx in make_buckets(params, int(first_bucket_mb * MB), int(bucket_cap_mb * MB)):
            ps = [params[i] for i in idx]
            offsets = [sum(q.numel() for q in ps[:k]) for k in range(len(ps))]
            buffer = torch.zeros(sum(q.numel() for q in ps), dtype=ps[0].dtype, device=ps[0].device)
            self.buckets.append(Bucket(ps, offsets, buffer))
        self._where = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

        self._sync_next_backward = True  # False inside no_sync()
        self._sync_this_backward = True
        self._in_step = False
        self.stats = StepStats()

    # -- construction: every replica starts from rank 0's weights -----------
    def _check_same_shapes(self) -> None:
        """All-gather every rank's list of (name, shape, dtype); fail on all ranks alike."""
        state = list(self.module.named_parameters()) + list(self.module.named_buffers())
        mine = [f"{n} {tuple(t.shape)} {t.dtype}" for n, t in state]
        sig = torch.tensor(list("\n".join(mine).encode()), dtype=torch.uint8)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.group.size)]
        all_gather(lengths, torch.tensor([sig.numel()]), group=self.group)
        sigs = [torch.empty(int(n), dtype=torch.uint8) for n in lengths]
        all_gather(sigs, sig, group=self.group)
        first = bytes(sigs[0].tolist()).decode().split("\n")
        for r, s in enumerate(sigs[1:], start=1):
            theirs = bytes(s.tolist()).decode().split("\n")
            for a, b in zip(first, theirs):
                if a != b:
                    raise ValueError(f"DistributedDataParallel: parameters differ across ranks: "
                                     f"rank {self.group.ranks[0]} has '{a}', rank "
                                     f"{self.group.ranks[r]} has '{b}'")
            if len(first) != len(theirs):
                raise ValueError(f"DistributedDataParallel: rank {self.group.ranks[0]} has "
                                 f"{len(first)} parameters and buffers, rank "
                                 f"{self.group.ranks[r]} has {len(theirs)}")

    def _broadcast_from_first_rank(self) -> None:
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                broadcast(t.data, self.group.ranks[0], group=self.group)

    # -- forward: remember whether the coming backward synchronises ---------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        self._sync_this_backward = self._sync_next_backward
        if torch.is_grad_enabled() and self._sync_this_backward:
            for t in tree_leaves(out):  # the output's gradient is where our backward starts
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda grad: self._begin_step())
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside this block accumulates local gradients and moves nothing."""
        before, self._sync_next_backward = self._sync_next_backward, False
        try:
            yield
        finally:
            self._sync_next_backward = before

    # -- backward: hooks, buckets, one wait at the end ----------------------
    def _begin_step(self) -> None:
        if self._in_step or not self._sync_this_backward:
            return
        self._in_step = True
        self._t_start = time.perf_counter()
        self._traffic = transport.traffic()
        self._record = self._traffic.__enter__()
        self._next_bucket = 0
        self._comm_s = 0.0
        for b in self.buckets:
            b.arrived.clear()
            b.work = None
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_step)

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self._sync_this_backward:
            return  # no_sync(): the gradient stays in p.grad, accumulating
        self._begin_step()
        b, i = self._where[p]
        slot = b.slot(i)
        if p.grad.data_ptr() != slot.data_ptr():  # not already accumulating in the bucket
            slot.copy_(p.grad)
        b.arrived.add(i)
        if self.overlap:
            self._launch_full_buckets()

    def _launch_full_buckets(self) -> None:
        # Strictly in bucket order, so every rank issues the same sequence.
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].full:
            self._launch(self.buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, b: Bucket) -> None:
        if self.overlap:
            b.work = all_reduce(b.buffer, ReduceOp.AVG, self.group, algorithm=self.algorithm,
                                async_op=True)
        else:
            t0 = time.perf_counter()
            all_reduce(b.buffer, ReduceOp.AVG, self.group, algorithm=self.algorithm)
            self._comm_s += time.perf_counter() - t0

    def _finish_step(self) -> None:
        """Runs once backward's compute is done: launch the rest, wait, publish grads."""
        try:
            self._launch_rest_and_wait()
        finally:  # a failed collective must not leave the next step half-open
            self._traffic.__exit__(None, None, None)
            self._in_step = False

    def _launch_rest_and_wait(self) -> None:
        t_compute = time.perf_counter()
        for b in self.buckets[self._next_bucket:]:
            for i, p in enumerate(b.params):
                if i not in b.arrived:  # no gradient this step: contribute what .grad holds, or 0
                    slot = b.slot(i)
                    if p.grad is None:
                        slot.zero_()
                    elif p.grad.data_ptr() != slot.data_ptr():
                        slot.copy_(p.grad)
            self._launch(b)
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
                self._comm_s += b.work.finished_at - b.work.started_at
        t_end = time.perf_counter()
        for b in self.buckets:
            for i, p in enumerate(b.params):
                p.grad = b.slot(i)  # the averaged gradient, in place in the bucket
        rec = self._record
        exposed = t_end - t_compute
        self.stats = StepStats(rec.bytes_sent, rec.bytes_received, len(self.buckets),
                               t_compute - self._t_start, self._comm_s, exposed,
                               max(0.0, self._comm_s - exposed))

    # -- checks --------------------------------------------------------------
    @torch.no_grad()
    def check_replicas_agree(self) -> None:
        """Raise on every rank, naming the first parameter or buffer that differs from rank 0's."""
        state = list(self.module.named_parameters()) + list(self.module.named_buffers())
        first_bad = len(state)
        for k, (_, t) in enumerate(state):
            ref = t.detach().clone()
            broadcast(ref, self.group.ranks[0], group=self.group)
            if first_bad == len(state) and not torch.equal(ref, t):
                first_bad = k
        verdict = torch.tensor([first_bad], dtype=torch.int64)
        all_reduce(verdict, ReduceOp.MIN, self.group)
        k = int(verdict)
        if k == len(state):
            return
        who = torch.tensor([self.group.rank if first_bad == k else self.group.size], dtype=torch.int64)
        all_reduce(who, ReduceOp.MIN, self.group)
        raise RuntimeError(f"replicas disagree: '{state[k][0]}' on rank "
                           f"{self.group.ranks[int(who)]} differs from rank {self.group.ranks[0]}")
