"""Pipeline parallelism: layers split into stages, micro-batches flowing through.

    from dt.parallel import pipeline
    stage = pipeline.stage_module(model, group)           # this rank's layers
    pipe = pipeline.Pipeline(stage, group)
    loss = pipe.train_step(x, y, loss_fn, micro_batches=8, schedule_name="1f1b")

Stage s (of p) runs layers [a_s, b_s) of the model. A batch is cut into m
micro-batches; stage s receives micro-batch i's activation from stage s-1,
runs its layers, sends the output to stage s+1; backward runs the other way
with the gradient of that activation. Per micro-batch and stage boundary one
activation of b*(...)*bytes goes forward and one gradient of the same size
comes back: 2 messages (plus a 64-byte header each, since shapes and dtypes
are sent, not agreed in advance) and no collective at all.

The price is the bubble. Stage s idles until the first micro-batch reaches it
and again while the last one drains, p-1 slots out of m+p-1 in all:

    bubble = (p - 1) / (m + p - 1)        (v virtual stages: (p-1) / (v*m + p-1))

GPipe runs every forward, then every backward, so each stage stashes the
activations of all m micro-batches. 1F1B (PipeDream-Flush) runs
min(p - s - 1, m) warm-up forwards, then alternates one forward with one
backward and drains the rest: the same bubble, but at most p micro-batches
stashed on any stage. Interleaving (Megatron's interleaved 1F1B) gives each
rank v chunks of 1/v the layers (chunks s, s+p, ...): the fill and drain slots
shrink to 1/v, for v times more messages, and the first stage stashes
p v + p - 1 chunks' activations, p + (p-1)/v micro-batches of its layers.

Why no schedule can deadlock here: on gloo every send is an isend that nobody
waits on until the end of the step, so sends never block; only receives
block, and a receive waits on a forward of the stage before or a backward of
the stage after, which those stages reach without waiting on this one (the
wait-for graph of each schedule is acyclic: timeline.play walks every
stage's order to its end). Messages between two ranks arrive in the order
sent, and the receiver takes them in that order (tests/test_pipeline_interleaved.py
checks both for every schedule). On NCCL sends do block (every operation
between two ranks runs in order on one stream): there p2p.py posts in
lockstep (lockstep.py) and puts the shape headers on groups of their own.

- schedules.py  the arithmetic of who does what when: partition, schedule, bubble_fraction
- runtime.py    Pipeline (one stage running its schedule) and stage_module
- p2p.py        the point-to-point of activations and gradients, with a shape header
- cut.py        a model's layer list cut into this rank's chunks; weights two stages share
- stash.py      peak_stash: how many micro-batches' activations a stage holds, from the schedule
- timeline.py   play: the schedule played out with durations (each action's start and end)
- lockstep.py   the schedule on a common clock: which batch each message goes in on NCCL
"""

from dt.parallel.pipeline.cut import StageCut, cut
from dt.parallel.pipeline.p2p import header_groups
from dt.parallel.pipeline.runtime import LABEL, MicroBatchHooks, Pipeline, PipelineStepStats, stage_module
from dt.parallel.pipeline.schedules import (
    bubble_fraction,
    neighbour,
    partition,
    schedule,
    stage_layers,
)
from dt.parallel.pipeline.stash import peak_stash, peak_stash_bytes, stash_profile

__all__ = ["LABEL", "MicroBatchHooks", "Pipeline", "PipelineStepStats", "StageCut", "bubble_fraction", "cut",
           "header_groups", "neighbour", "partition", "peak_stash", "peak_stash_bytes", "schedule",
           "stage_layers", "stage_module", "stash_profile"]
