"""dt train's own layers and optimizer, timed on this machine at one rank's shapes.

The step a rank of a tiny model runs is bound by the ops' fixed costs (each
op's dispatch, autograd's nodes, Python between them), not by arithmetic, so
FLOPs at a measured rate miss most of it: a stand-in block with the same
matmuls ran 1.45x faster than the real one (CPU time, side by side), and
Adam over 52 parameter tensors costs about ten ops per tensor, not its bytes.
So the planner times what `dt train` runs:

    stage   one micro-batch forward and backward through the stage's real
            layers (dt.models.gpt's Embedding, Block, Head and the loss),
            each Linear swapped for dt.parallel.tensor's column / row
            parallel layer at this rank's tp shard (built on a one-rank
            group: the same autograd functions and shapes, the collectives,
            priced apart, skipped); gradients set to None between
            repetitions, as dt train's step does
    ddp     what dt's DistributedDataParallel adds to a synchronised backward
            on the rank's thread (a hook per gradient, its bucket copy, the
            launch and the end-of-backward wait), on a one-rank group
    adam    dt.train.optim.Adam's step over this rank's tensors: every dense
            tensor apart without ZeRO, one flat shard of psi / N numbers with
            it (dt.parallel.zero's ZeroOptimizer runs Adam on its flat shard)

Timed with time.thread_time when a rank has one thread (the CPU time the
rank's own thread spends: what other programs on the cores do not add to),
else the wall clock; the median of REPS repetitions after a warm one. On a GPU
(`dt plan --device h200 --timed` on an H200) the same modules run there, under
dt train's autocast, each repetition timed on the wall clock to the end of its
kernels: a small model's step is bound by launching its kernels as much as by
their arithmetic, which a FLOP count cannot see (GPT-2 small's shape on an H200:
a 51-62 ms step, 39 ms of it in kernels, 12 ms of those matmuls). The median, not the least:
`dt plan --check` compares with the median step of a run, and this machine's speed drifts by
10-20% over seconds (a stage's repetitions within one second: least 12.4 ms, median 17.9 ms,
in the training processes themselves), so the least predicted every step 15-30% short.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from dt.models.gpt import Block, Embedding, GPTConfig, Head
from dt.models.lm import NextTokenLoss
from dt.parallel.data_parallel import DistributedDataParallel
from dt.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from dt.plan.cluster import ITEMSIZE
from dt.plan.timed_cp import LocalContextCore
from dt.train.optim import Adam
from dt.transport.group import Group

__all__ = ["BUDGET", "MEMORY_SHARE", "TIMING_BUDGET", "TimingBudget", "adam_seconds", "adam_within_budget",
           "ddp_hook_seconds", "ddp_hooks_within_budget", "samples", "slowest_of", "stage_module",
           "stage_seconds", "stage_timing", "time_stage", "timed", "timed_within_budget", "timing_noise",
           "was_timed"]

REPS = 9
ADAM_TENSORS = 4  # what Adam holds per number: the weight, its gradient, the two moments
MIN_SECONDS = 0.1  # and at least this long: a millisecond's Adam gets a hundred repetitions


def timed(run: Callable[[], object], threads: int, reps: int = REPS, device: str = "cpu") -> float:
    """Seconds of `run`: the median of `reps` (and of MIN_SECONDS at least) after a warm call; CPU
    time of this thread when one thread runs the ops on the CPU (robust to other programs' turns
    on the cores), else wall time (on a GPU `run` ends by waiting for its kernels)."""
    return statistics.median(samples(run, threads, reps, device))


def samples(run: Callable[[], object], threads: int, reps: int = REPS, device: str = "cpu") -> list[float]:
    """The repetitions `timed` takes the median of (the clock and counts as it says)."""
    clock = time.thread_time if threads == 1 and device == "cpu" else time.perf_counter
    run()
    times: list[float] = []
    while len(times) < reps or sum(times) < MIN_SECONDS:
        t0 = clock()
        run()
        times.append(clock() - t0)
    return times


def slowest_of(times: Sequence[float], draws: int) -> float:
    """The expected largest of n = `draws` draws from these timings (their empirical distribution):
    what a step whose n ranks each run this work and then line up waits for.

    Sorted x_1 <= ... <= x_k, the largest of n draws is x_i with probability (i/k)^n - ((i-1)/k)^n.
    """
    ordered, k = sorted(times), len(times)
    return sum(x * (((i + 1) / k) ** draws - (i / k) ** draws) for i, x in enumerate(ordered))


def _one_rank() -> Group:
    """A group of this process alone: the tp layers' shapes as given, their collectives skipped."""
    return Group(pg=None, rank=0, size=1, ranks=(0,))


def _sharded_block(cfg: GPTConfig, tp: int, cp: int = 1, cp_kind: str = "ring") -> Block:
    """dt.models.gpt's Block with its four Linears at one rank's tp shard (Megatron's split) and,
    under cp, its attention core one cp rank's (dt.plan.timed_cp: dt's block attention)."""
    width, alone = cfg.n_embd, _one_rank()
    block = Block(cfg, 1)
    if cp > 1:
        block.attn.attend = LocalContextCore(cp_kind, cfg.block_size, cp)
    block.attn.query_key_value = ColumnParallelLinear(width, 3 * width // tp, group=alone)
    block.attn.dense = RowParallelLinear(width // tp, width, group=alone)
    block.mlp.dense_h_to_4h = ColumnParallelLinear(width, 4 * width // tp, group=alone)
    block.mlp.dense_4h_to_h = RowParallelLinear(4 * width // tp, width, group=alone)
    return block


class _Stage(nn.Module):
    """One pipeline stage of the GPT at one rank's shapes: [embedding], blocks, [head and loss]."""

    def __init__(self, cfg: GPTConfig, tp: int, blocks: int, head: bool, embed: bool, cp: int = 1,
                 cp_kind: str = "ring"):
        super().__init__()
        self.embed = Embedding(cfg, 0) if embed else None
        self.blocks = nn.ModuleList(_sharded_block(cfg, tp, cp, cp_kind) for _ in range(blocks))
        table = self.embed.wte.weight if self.embed is not None else None
        self.head = Head(cfg, cfg.n_layer + 1, table) if head and table is not None else None
        if head and self.head is None:  # a last stage without the table: the head's own copy
            self.head = Head(GPTConfig(**{**cfg.as_dict(), "tied": False}), cfg.n_layer + 1, None)
        self.loss = NextTokenLoss()

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden)
        return self.loss(self.head(hidden), ids) if self.head is not None else hidden


def stage_module(n_embd: int, n_head: int, vocab: int, tokens: int, tp: int, blocks: int, head: bool,
                 embed: bool, dtype: str = "float32", cp: int = 1, cp_kind: str = "ring") -> nn.Module:
    """A stage of dt's GPT at one rank's shapes, as dt train holds it: forward(hidden, ids) -> the
    stage's output (the loss on the last stage); `tokens` is the rank's share of a sequence (seq / cp)."""
    # n_head whole: the head width is C / n_head; the shard's qkv carries n_head / tp of them
    cfg = GPTConfig(vocab_size=max(1, vocab // tp), block_size=tokens * cp,
                    n_layer=max(1, blocks), n_head=n_head, n_embd=n_embd, dtype=dtype)
    return _Stage(cfg, tp, blocks, head, embed, cp, cp_kind).to(getattr(torch, dtype))


def _stage_run(n_embd: int, n_head: int, vocab: int, sequences: int, tokens: int, tp: int, blocks: int,
               head: bool, embed: bool, dtype: str, cp: int, cp_kind: str, ddp: bool, device: str = "cpu",
               autocast: str = "") -> Callable[[], None]:
    """One micro-batch's forward and backward through a fresh stage (with `ddp`: wrapped in dt's
    DistributedDataParallel on a one-rank group: its hooks, bucket copies and launches), on
    `device`, under dt train's autocast of that dtype where one is named."""
    stage = stage_module(n_embd, n_head, vocab, tokens=tokens, tp=tp, blocks=blocks, head=head, embed=embed,
                         dtype=dtype, cp=cp, cp_kind=cp_kind)
    stage = stage.to(device)
    if ddp:
        stage = DistributedDataParallel(stage, group=_one_rank())
    draws = torch.Generator().manual_seed(0)  # drawn on the host (one seed on any device), then moved
    shape = (sequences, tokens)
    ids = torch.randint(0, max(1, vocab // tp), shape, generator=draws).to(device)  # host: drawn, moved
    inputs = torch.randn(*shape, n_embd, generator=draws, dtype=getattr(torch, dtype))  # host: drawn, moved
    inputs = inputs.to(device).requires_grad_(not embed)
    grad = torch.randn(*shape, n_embd, generator=draws, dtype=inputs.dtype).to(device)  # host: drawn, moved
    gpu = device != "cpu"

    def cast() -> contextlib.AbstractContextManager:
        return torch.autocast(device, getattr(torch, autocast)) if autocast else contextlib.nullcontext()

    def run() -> None:
        for param in stage.parameters():
            param.grad = None  # dt train's step: fresh gradients every step
        with cast():
            out = stage(inputs, ids)
        out.backward(None if out.dim() == 0 else grad.to(out.dtype))
        if gpu:
            torch.cuda.synchronize(device)  # the step's kernels done, not queued

    return run


def time_stage(n_embd: int, n_head: int, vocab: int, sequences: int, tokens: int, tp: int, blocks: int,
               head: bool, embed: bool, threads: int, dtype: str, cp: int = 1,
               cp_kind: str = "ring", device: str = "cpu", autocast: str = "") -> tuple[float, ...]:
    """One micro-batch's forward and backward through a stage's real layers, one rank (tokens: its
    share of each sequence, seq / cp): every repetition's seconds, timed now (`dt plan --check`
    times it again inside the run's own processes); the arguments are dt.plan.compute.TimedShape's."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run = _stage_run(n_embd, n_head, vocab, sequences=sequences, tokens=tokens, tp=tp, blocks=blocks,
                         head=head, embed=embed, dtype=dtype, cp=cp, cp_kind=cp_kind, ddp=False,
                         device=device, autocast=autocast)
        return tuple(samples(run, threads, device=device))
    finally:
        torch.set_num_threads(old)


stage_timing = functools.cache(time_stage)  # the planner's: each shape timed once a process

TIMING_BUDGET = 60.0  # seconds a process spends timing here; past it, the rest is priced without timing
MEMORY_SHARE = 0.25  # a stage is timed only while its weights, gradients and activations fit this share

UNTIMED = {  # what is priced without timing past the budget, by kind
    "stage": "stage shapes priced at the timed stages' FLOP rate",
    "adam": "Adam steps priced by their bytes at the memcpy rate",
    "ddp": "DDP hook costs left out",
}


class TimingBudget:
    """What the planner has spent timing on this machine in this process: every measurement (a stage,
    DDP's hooks, Adam) is made once, while the time spent stays under TIMING_BUDGET and its bytes fit
    MEMORY_SHARE of the available memory; what is past either is priced without timing, counted here.

    `dt plan --preset gpt2` here would otherwise time a 50,257-word head at every micro-batch size,
    minutes each, holding gigabytes."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.rates: list[float] = []  # FLOP/s of the stages timed
        self.timed: set[tuple] = set()
        self.untimed: dict[str, set[tuple]] = {kind: set() for kind in UNTIMED}

    def rate(self) -> float | None:
        """The median FLOP/s of the stages timed so far (None before any)."""
        return statistics.median(self.rates) if self.rates else None

    def allows(self, key: tuple, nbytes: float) -> bool:
        """Whether `key` is timed: it was (the cache answers), or the budget lasts and its bytes fit."""
        from dt.args import available_memory

        if key in self.timed:
            return True
        memory = available_memory() or 0
        return self.spent < TIMING_BUDGET and not (memory and nbytes > MEMORY_SHARE * memory)

    def measure(self, key: tuple, nbytes: float, kind: str, seconds_of: Callable[[], float]) -> float | None:
        """seconds_of() where the budget allows `key` (its time charged to the budget), else None."""
        if not self.allows(key, nbytes):
            self.untimed[kind].add(key)
            return None
        known = key in self.timed
        t0 = time.perf_counter()
        seconds = seconds_of()
        if not known:
            self.timed.add(key)
            self.spent += time.perf_counter() - t0
        return seconds

    def note(self) -> str | None:
        """One line saying what was priced without timing (None when everything was timed)."""
        counts = [f"{len(keys)} {UNTIMED[kind]}" for kind, keys in self.untimed.items() if keys]
        if not counts:
            return None
        return (f"timing budget: {self.spent:.0f} s spent timing here (at most {TIMING_BUDGET:g} s, stages "
                f"of at most {MEMORY_SHARE:.0%} of memory: dt.plan.timed); " + ", ".join(counts))


BUDGET = TimingBudget()


def timed_within_budget(shape: tuple, flops: float, nbytes: float) -> float | None:
    """The stage's median seconds (stage_timing) where the budget allows it; None where it is not
    timed (the caller prices its FLOPs at BUDGET.rate())."""
    known = shape in BUDGET.timed
    seconds = BUDGET.measure(shape, nbytes, "stage", lambda: statistics.median(stage_timing(*shape)))
    if seconds is not None and not known and seconds > 0 and flops > 0:
        BUDGET.rates.append(flops / seconds)
    return seconds


def was_timed(shape: tuple) -> bool:
    """Whether this stage's shape was timed (not priced by rate past the budget)."""
    return shape in BUDGET.timed


def timing_noise() -> float:
    """How far apart two steps priced here must be to be told apart: the median, over the stages
    timed in this process, of their repetitions' interquartile range over their median (0 before
    any is timed). A stage's median moves about that much from one timing to the next."""
    spreads = []
    for key in BUDGET.timed:
        if key[0] in ("ddp", "adam"):  # DDP's hooks and Adam's steps: not a stage's repetitions
            continue
        times = stage_timing(*key)
        if len(times) >= 4 and statistics.median(times) > 0:
            lower, _, upper = statistics.quantiles(times, n=4)
            spreads.append((upper - lower) / statistics.median(times))
    return statistics.median(spreads) if spreads else 0.0


def stage_seconds(*shape: object, **options: object) -> float:
    """Seconds of one micro-batch's forward and backward through a stage (stage_timing's median)."""
    return statistics.median(stage_timing(*shape, **options))  # type: ignore[arg-type]


@functools.cache
def ddp_hook_seconds(n_embd: int, n_head: int, vocab: int, sequences: int, tokens: int, tp: int, blocks: int,
                     head: bool, embed: bool, threads: int, dtype: str, cp: int = 1,
                     cp_kind: str = "ring", device: str = "cpu", autocast: str = "") -> float:
    """Seconds DDP adds to a synchronised backward on the rank's own thread (a hook per gradient,
    its copy into the bucket, the launch, the end-of-backward wait and publish), the collective
    itself skipped: the same stage timed with and without it, one run of each in turn (drift
    hits both alike), the difference of their medians. The arguments are time_stage's."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs = [_stage_run(n_embd, n_head, vocab, sequences=sequences, tokens=tokens, tp=tp, blocks=blocks,
                           head=head, embed=embed, dtype=dtype, cp=cp, cp_kind=cp_kind, ddp=ddp,
                           device=device, autocast=autocast) for ddp in (False, True)]
        clock = time.thread_time if threads == 1 and device == "cpu" else time.perf_counter
        times: tuple[list[float], list[float]] = ([], [])
        for run in runs:
            run()  # warm
        for _ in range(REPS):
            for run, out in zip(runs, times):
                t0 = clock()
                run()
                out.append(clock() - t0)
        plain, hooked = times
        return max(0.0, statistics.median(hooked) - statistics.median(plain))
    finally:
        torch.set_num_threads(old)


@functools.cache
def adam_seconds(sizes: tuple[int, ...], threads: int, dtype: str, device: str = "cpu") -> float:
    """Seconds of dt.train.optim.Adam's step over tensors of these numbers (the moments made)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kind = getattr(torch, dtype)
        params = [nn.Parameter(torch.zeros(numel, dtype=kind, device=device)) for numel in sizes]
        for param in params:
            param.grad = torch.full_like(param, 1e-3)  # any gradient: Adam's step costs the same
        adam = Adam(params, lr=1e-3)

        def step() -> None:
            adam.step()
            if device != "cpu":
                torch.cuda.synchronize(device)

        return timed(step, threads, device=device)
    finally:
        torch.set_num_threads(old)


def ddp_hooks_within_budget(shape: tuple, nbytes: float) -> float | None:
    """ddp_hook_seconds(*shape) where the budget allows it, else None (the hooks left out)."""
    return BUDGET.measure(("ddp", *shape), nbytes, "ddp", lambda: ddp_hook_seconds(*shape))


def adam_within_budget(sizes: tuple[int, ...], threads: int, dtype: str) -> float | None:
    """adam_seconds on this machine where the budget allows it, else None (priced by its bytes)."""
    nbytes = ADAM_TENSORS * sum(sizes) * ITEMSIZE[dtype]
    return BUDGET.measure(("adam", sizes, threads, dtype), nbytes, "adam",
                          lambda: adam_seconds(sizes, threads, dtype))
