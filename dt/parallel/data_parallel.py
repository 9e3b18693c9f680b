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

- Buckets. Gradients are packed into flat buffers (dt.parallel.buckets),
  filled in reverse registration order, the order backward produces them. One collective per
  bucket, not per tensor, so small tensors do not each pay a latency; the
  first bucket is small (1 MB) so communication starts early in backward.
- Overlap. A hook fires when a parameter's gradient has been accumulated; when
  a bucket's last gradient arrives, its all-reduce is queued *asynchronously*
  on dt's bucket thread (one per process, charged to LABEL in dt.traffic())
  and backward goes on computing the
  earlier layers' gradients meanwhile. Buckets are launched strictly in bucket
  order, so every rank issues the same collectives in the same order.
- One wait. A callback queued on the autograd engine runs when backward's
  compute is done: it launches any bucket still missing gradients (parameters
  unused in this step are reduced as zeros, on every rank alike, so nothing
  hangs), waits for all of them, and points each `.grad` at its slot of the
  averaged bucket. Only the communication still running then is *exposed*.

`model.stats` (DDPStepStats) says what the last synchronised backward moved
and how much of its communication was hidden behind compute.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from dt import transport
from dt.collectives import all_gather, all_reduce, broadcast
from dt.collectives.ops import ReduceOp
from dt.collectives.registry import lookup
from dt.device import clock
from dt.parallel.buckets import MB, Bucket, make_buckets
from dt.parallel.checkpoint.state import module_places
from dt.transport import default_device, resolve_group

__all__ = ["LABEL", "Bucket", "DDPStepStats", "DistributedDataParallel", "bucket_sender", "make_buckets"]

LABEL = "data_parallel"  # dt.traffic() charges the gradient buckets' all-reduces to this name

_sender: ThreadPoolExecutor | None = None
_sender_lock = threading.Lock()


def bucket_sender() -> ThreadPoolExecutor:
    """The one thread that runs every overlapped gradient collective in this process, in launch order
    (DDP's all-reduces, ZeRO 2's reduce-scatters).

    A thread of dt's own rather than the collective's async_op: there the
    traffic is charged on the group's communication thread to "all_reduce",
    indistinguishable from a tensor-parallel layer's; here it runs under
    LABEL, so a trainer can say which bytes were the gradient sync.
    """
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dt-ddp")
        return _sender


@dataclass
class DDPStepStats:
    """What the last synchronised backward cost on this rank (seconds, bytes)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    collectives: int = 0
    compute_s: float = 0.0  # backward start -> last gradient computed
    comm_s: float = 0.0  # time the collectives ran, summed
    exposed_s: float = 0.0  # time backward waited for communication after its compute
    hidden_s: float = 0.0  # comm_s - exposed_s: communication that overlapped compute


class _Step:
    """One synchronised backward: its buckets' progress, and its accounting, opened and closed here.

    Backward has no frame of its own to put `with dt.traffic():` around: it
    begins in the first gradient hook and ends in the callback the autograd
    engine runs after the last one. So a step is an object. Creating it opens
    the traffic record and starts the clock; `close` closes the record and
    turns what it counted into the step's DDPStepStats. DDP creates one in the
    first hook and closes it, failure or not, in its end-of-backward callback;
    a backward that raised before that callback ran is abandoned by the next forward.
    """

    def __init__(self, n_buckets: int, device: torch.device):
        self.device = device
        self.t_start = clock(device)
        self._counting = transport.traffic()
        self._record = self._counting.__enter__()
        self.arrived: list[set[int]] = [set() for _ in range(n_buckets)]  # grads in, per bucket
        self.works: list[Future | None] = [None] * n_buckets  # each launched bucket's all-reduce
        self.launched = 0  # buckets launched so far, strictly in order
        self.comm_s = 0.0  # collectives' running time, summed

    def close(self, t_compute: float, t_end: float) -> DDPStepStats:
        """Stop counting; the step's bytes and times (compute ended at t_compute, waits at t_end)."""
        self._counting.__exit__(None, None, None)
        rec, exposed = self._record, t_end - t_compute
        return DDPStepStats(rec.bytes_sent, rec.bytes_received, len(self.works),
                            t_compute - self.t_start, self.comm_s, exposed,
                            max(0.0, self.comm_s - exposed))

    def abandon(self) -> None:
        """Throw away a step whose backward raised: let its launched all-reduces land, stop counting.

        They write into the buckets the next step fills, so they are waited for;
        their errors are dropped with the step (the group's next collective reports
        a broken peer again).
        """
        for work in self.works:
            if work is not None:
                with contextlib.suppress(Exception):
                    work.result()
        self._counting.__exit__(None, None, None)


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
        # Buckets in the group's shared memory where it has one: all-reduced in place.
        self.buckets = [Bucket.over([params[i] for i in idx], shared=self.group) for idx in
                        make_buckets(params, int(first_bucket_mb * MB), int(bucket_cap_mb * MB))]
        self._where = {p: (k, i) for k, b in enumerate(self.buckets) for i, p in enumerate(b.tensors)}
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

        self._sync_next_backward = True  # False inside no_sync()
        self._sync_this_backward = True
        self._step: _Step | None = None  # the synchronised backward in flight
        self.stats = DDPStepStats()

    # -- construction: every replica starts from rank 0's weights -----------
    def _check_same_shapes(self) -> None:
        """All-gather every rank's list of (name, shape, dtype); fail on all ranks alike."""
        state = list(self.module.named_parameters()) + list(self.module.named_buffers())
        mine = [f"{n} {tuple(t.shape)} {t.dtype}" for n, t in state]
        device = default_device(self.group)  # NCCL moves only GPU tensors
        sig = torch.tensor(list("\n".join(mine).encode()), dtype=torch.uint8, device=device)
        lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.group.size)]
        all_gather(lengths, torch.tensor([sig.numel()], device=device), group=self.group)
        sigs = [torch.empty(int(n), dtype=torch.uint8, device=device) for n in lengths]
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
        if self._step is not None:  # the last backward raised before its end-of-backward callback
            self._step.abandon()
            self._step = None
        out = self.module(*args, **kwargs)
        self._sync_this_backward = self._sync_next_backward
        if torch.is_grad_enabled() and self._sync_this_backward:
            for t in tree_leaves(out):  # the output's gradient is where our backward starts
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._output_grad_ready)
        return out

    def sync_next_backward(self, sync: bool) -> None:
        """Whether the coming backward synchronises, decided at backward time, not forward's.

        A pipeline runs several micro-batches' forwards before their backwards
        (1F1B, GPipe): only a chunk's last backward of the step synchronises, and
        the schedule knows which that is only when it gets there (dt.train.step).
        """
        self._sync_this_backward = sync

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside this block accumulates local gradients and moves nothing."""
        before, self._sync_next_backward = self._sync_next_backward, False
        try:
            yield
        finally:
            self._sync_next_backward = before

    # -- backward: hooks, buckets, one wait at the end ----------------------
    def _begin_step(self) -> _Step:
        """The step in flight; the first hook of a synchronised backward opens it."""
        if self._step is None:
            self._step = _Step(len(self.buckets), default_device(self.group))
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_step)
        return self._step

    def _output_grad_ready(self, grad: torch.Tensor) -> None:
        self._begin_step()  # backward has started: the clock starts before the first bucket fills

    def _grad_ready(self, p: nn.Parameter) -> None:
        if not self._sync_this_backward:
            return  # no_sync(): the gradient stays in p.grad, accumulating
        step = self._begin_step()
        k, i = self._where[p]
        slot = self.buckets[k].slot(i)
        if p.grad.data_ptr() != slot.data_ptr():  # not already accumulating in the bucket
            slot.copy_(p.grad)
        step.arrived[k].add(i)
        if self.overlap:
            self._launch_full_buckets(step)

    def _launch_full_buckets(self, step: _Step) -> None:
        # Strictly in bucket order, so every rank issues the same sequence.
        while (step.launched < len(self.buckets)
               and len(step.arrived[step.launched]) == len(self.buckets[step.launched].tensors)):
            self._launch(step, step.launched)
            step.launched += 1

    def _launch(self, step: _Step, k: int) -> None:
        buffer = self.buckets[k].buffer
        if self.overlap:
            if self.algorithm != "auto":
                lookup("all_reduce", self.algorithm)  # an unknown name fails here, in the hook, as inline
            step.works[k] = bucket_sender().submit(self._all_reduce, buffer, step.device)
        else:
            step.comm_s += self._all_reduce(buffer, step.device)

    def _all_reduce(self, buffer: torch.Tensor, device: torch.device) -> float:
        """Average one bucket over the group, charged to LABEL; its seconds."""
        t0 = clock(device)
        with transport.charged_to(LABEL, self.algorithm):
            all_reduce(buffer, ReduceOp.AVG, self.group, algorithm=self.algorithm)
        return clock(device) - t0

    def _finish_step(self) -> None:
        """Runs once backward's compute is done: launch the rest, wait, publish the averages."""
        step, self._step = self._step, None  # the next backward opens a fresh step
        t_compute = clock(step.device)
        try:
            self._launch_rest(step)
            for work in step.works:
                if work is not None:
                    step.comm_s += work.result()
        finally:  # a failed collective must not leave the step's accounting open
            stats = step.close(t_compute, clock(step.device))
        for b in self.buckets:
            for i, p in enumerate(b.tensors):
                p.grad = b.slot(i)  # the averaged gradient, in place in the bucket
        self.stats = stats

    def _launch_rest(self, step: _Step) -> None:
        """Launch the buckets still missing gradients, in order, on every rank alike."""
        for k in range(step.launched, len(self.buckets)):
            b = self.buckets[k]
            for i, p in enumerate(b.tensors):
                if i not in step.arrived[k]:  # no gradient this step: contribute .grad, or 0
                    slot = b.slot(i)
                    if p.grad is None:
                        slot.zero_()
                    elif p.grad.data_ptr() != slot.data_ptr():
                        slot.copy_(p.grad)
            self._launch(step, k)
        step.launched = len(self.buckets)

    # -- sharded checkpoints (dt.parallel.checkpoint) ------------------------
    def checkpoint_layout(self) -> dict[str, Any]:
        return {"zero": 0, "dp": self.group.size}

    def checkpoint_places(self) -> list[tuple[torch.Tensor, list[Any]]]:
        """Every tensor of the module, whole on every replica: each writes 1/N of it."""
        return module_places(self.module, self.group)

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
        device = default_device(self.group)
        verdict = torch.tensor([first_bad], dtype=torch.int64, device=device)
        all_reduce(verdict, ReduceOp.MIN, self.group)
        k = int(verdict)
        if k == len(state):
            return
        who = torch.tensor([self.group.rank if first_bad == k else self.group.size], dtype=torch.int64,
                           device=device)
        all_reduce(who, ReduceOp.MIN, self.group)
        raise RuntimeError(f"replicas disagree: '{state[k][0]}' on rank "
                           f"{self.group.ranks[int(who)]} differs from rank {self.group.ranks[0]}")
