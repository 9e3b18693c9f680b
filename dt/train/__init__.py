"""`dt train`: train the small GPT on a dp x cp x ep x tp x pp mesh of local processes.

    dt train --dp 2 --tp 2 --pp 2 --steps 100
    dt train --pp 4 --micro-batches 8 --schedule gpipe --checkpoint ckpt      # resumes if it holds one
    dt train --pp 2 --schedule interleaved --virtual 2                       # 2 chunks per stage
    torchrun --nproc-per-node 8 -m dt.train --dp 2 --tp 2 --pp 2 --threads 1 # same code, torchrun
    dt train --dp 2 --cp 2 --ep 2 --tp 2 --experts 4 --top-k 2          # context + expert parallel

Spawns dp*cp*tp*pp processes (dt.launcher.launch), builds the grid
(dt.parallel.grid), the plain model parallelized by its plan (dt.train.build)
and trains on --data or the generated text (dt.models.data). Every data-parallel rank takes its slice of
the same global batch, so the loss curve does not depend on the mesh. Rank 0
shows a progress bar and prints, at the end, the loss, tokens/s and where the
time went:

    compute        forward and backward of this rank's layers (and the optimizer)
    communication  the layers' collectives (tensor, context, expert) + the gradient all-reduce
    bubble         waiting on the pipeline neighbours (idle slots, plus the wire)

--checkpoint DIR saves a sharded checkpoint at the end (and every --save-every
steps) into DIR/step-NNNNNNNN/: each rank writes its own shard, rank 0 a
manifest, and the folder appears complete or not at all; the newest --keep
are kept. A run started on a DIR that holds checkpoints resumes from the
newest good one, on any mesh (dp, tp, pp may change), falling back past a
corrupt one with a warning; the model options left out are read from it
(resume.py). Under `torchrun --max-restarts N` a group restarted after a
worker died resumes the same way. One machine, or a shared filesystem.

- cli.py         the command line: parse_args, main, the report rank 0 prints
- loop.py        one rank's training loop (train_worker)
- build.py       the plain model, its grid and plan, the step and optimizer a run trains with
- step.py        TrainStep: one step apart from the model (pipeline, gradient sync, clipping, accounting)
- clip.py        gradient clipping by the global norm over every axis
- optim.py       Adam, written out
- checkpoint.py  save_checkpoint / load_checkpoint (format: dt.parallel.checkpoint)
- resume.py      the model options a checkpoint was saved with, read before any process starts

The trainer around the step (each a module, two hooks in loop.py):
- options.py     --data, validation, schedule, precision, metrics flags (checked before any process)
- dataset.py     what it trains on: --data's prepared corpus (corpus.py, tokenizer.py) or generated text
- hooks.py       around each step: the learning rate (schedule.py), validation, metrics, progress
- evaluate.py    the validation loss, forward only, on any mesh
- precision.py   --precision: autocast, float32 master weights, float16 loss scaling
- metrics.py     --metrics JSON lines, --plot's loss curve, MFU (dt.cost.flops)
- peak.py        MFU's denominator: one core's matmul rate x the cores the ranks use
- threads.py     the threads a rank computes with, unless --threads says
- diverged.py    a NaN or infinite loss or weights: the run ends, nothing saved from that step
- sample.py      `dt sample`: text from a checkpoint, with the plain model
"""

from dt.train.checkpoint import load_checkpoint, save_checkpoint
from dt.train.cli import main, parse_args, report
from dt.train.loop import make_model, train_worker
from dt.train.optim import Adam
from dt.train.step import TrainStep, make_optimizer

__all__ = ["Adam", "TrainStep", "load_checkpoint", "main", "make_model", "make_optimizer", "parse_args",
           "report", "save_checkpoint", "train_worker"]
