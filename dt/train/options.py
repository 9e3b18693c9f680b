"""`dt train`'s trainer options: data, validation, learning-rate schedule, clipping, precision, metrics.

The mesh and model options are cli.py's; these are what makes it a trainer
(nanoGPT's train.py has each of them). Every one is checked before any
process starts: bad input is one line and exit status 2. `settle_trainer_options`
also fills in what depends on other options: --data's folders as their files,
and --eval-every's default, which validates a run on text files EVALS_PER_RUN
times and at its last step (the held-out text is there to be measured).
"""

from __future__ import annotations

import argparse
import os

from dt import args as args_
from dt.device import backend_for
from dt.train.corpus import text_files
from dt.train.precision import PRECISIONS
from dt.train.tokenizer import KINDS
from dt.units import plural

__all__ = ["EVALS_PER_RUN", "add_trainer_options", "data_source", "settle_trainer_options"]

EVALS_PER_RUN = 5  # --data's default validations per run (and the last step): a curve, at little cost


def add_trainer_options(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data (default: generated text, dt.models.data)")
    data.add_argument("--data", nargs="+", metavar="FILE", default=None,
                      help="UTF-8 text files to train on, read in order as one text; a folder stands for "
                           "the text files directly inside it, sorted by name (default: generated text)")
    data.add_argument("--tokenizer", choices=KINDS, default="byte",
                      help="byte: the 256 UTF-8 bytes; bpe: byte-level BPE trained here on --data")
    data.add_argument("--vocab-size", type=args_.at_least(257), default=2048,
                      help="the BPE vocabulary (256 bytes + merges)")
    data.add_argument("--val-fraction", type=args_.positive, default=0.1,
                      help="the last part of the text held out for validation")
    data.add_argument("--data-dir", default=None, metavar="DIR",
                      help="where the token files go (default: $XDG_CACHE_HOME/dt/corpus/<key of the files>)")
    ev = p.add_argument_group("validation")
    ev.add_argument("--eval-every", type=args_.at_least(0), default=None,
                    help=f"validation loss every N steps and at the last (0: never; default: with --data, "
                         f"{EVALS_PER_RUN} times a run, every ceil(steps / {EVALS_PER_RUN}) steps; "
                         f"without, never)")
    ev.add_argument("--eval-batches", type=args_.at_least(1), default=4,
                    help="global batches the validation loss is averaged over")
    lr = p.add_argument_group("learning rate and precision (--clip: the global norm, above)")
    lr.add_argument("--warmup", type=args_.at_least(0), default=0,
                    help="steps of linear warmup to --lr")
    lr.add_argument("--lr-min", type=args_.non_negative, default=None,
                    help="cosine decay from --lr to this at the last step (default: no decay)")
    lr.add_argument("--precision", type=args_.precision, default="float32",
                    help="autocast dtype: bfloat16 (bf16), float16 (fp16, with dynamic loss scaling), or "
                         "float32 (fp32); tf32: float32 with a GPU's TF32 matmuls. Weights and Adam's state "
                         "stay float32")
    out = p.add_argument_group("metrics")
    out.add_argument("--metrics", default=None, metavar="FILE",
                     help="one JSON line per step (appended): loss, val_loss, lr, grad_norm, tokens/s, "
                          "MFU, time split; each run's first line {\"run\": ...} (default: none written)")
    out.add_argument("--peak-flops", type=args_.positive, default=None, metavar="FLOP/S",
                     help="MFU's denominator, per process (default: one core's float32 matmul rate x "
                          "the cores the ranks use, or a GPU's matmul x the GPUs: dt/train/peak.py)")
    out.add_argument("--plot", default=None, metavar="PNG",
                     help="draw the loss curve (train and validation) into PNG at the end (matplotlib; "
                          "default: none drawn)")


def data_source(args: argparse.Namespace) -> str:
    """What the run trains on, in words: the generated text, or how many text files from where."""
    if not args.data:
        return "generated text (dt.models.data)"
    folders = getattr(args, "data_folders", [])
    where = f" (the text files of {', '.join(folders)}, sorted by name)" if folders else ""
    return f"{plural(len(args.data), 'text file')}{where}"


def settle_trainer_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the trainer options, in one line (None if nothing); fills in --data's
    folders as their text files and --eval-every's default."""
    if args.data:
        try:
            files = text_files(args.data)
        except ValueError as e:
            return f"--data {e}"
        args.data_folders = [name for name in args.data if os.path.isdir(name)]
        args.data = [str(p) for p in files]
    if args.eval_every is None:
        args.eval_every = -(-args.steps // EVALS_PER_RUN) if args.data else 0
    if args.precision not in PRECISIONS:
        return (f"--precision {args.precision} is not an autocast precision: --dtype {args.precision} "
                f"trains in it; --precision takes {', '.join(PRECISIONS)}")
    if args.precision == "tf32" and backend_for(args.device) != "nccl":
        return "--precision tf32 is a GPU's float32 matmul mode (TF32 tensor cores): the CPU has none"
    if args.tokenizer == "bpe" and not args.data:
        return "--tokenizer bpe is trained on --data FILE...: give the text files"
    if not args.val_fraction < 1:
        return f"--val-fraction must be below 1, got {args.val_fraction}"
    if args.warmup > args.steps:
        return f"--warmup {args.warmup} is longer than --steps {args.steps}"
    if args.lr_min is not None and args.lr_min > args.lr:
        return f"--lr-min {args.lr_min} is above --lr {args.lr}: the schedule decays"
    if args.precision != "float32" and args.dtype != "float32":
        return f"--precision {args.precision} autocasts float32 weights: it needs --dtype float32"
    for name, path in (("--metrics", args.metrics), ("--plot", args.plot)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            return f"{name} {path}: no folder {folder}"
    if args.plot and not args.plot.lower().endswith(".png"):
        return f"--plot {args.plot}: the curve is saved as a PNG (name it .png)"
    return None
