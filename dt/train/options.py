"""`dt train`'s trainer options: data, validation, learning-rate schedule, clipping, precision, metrics.

The mesh and model options are cli.py's; these are what makes it a trainer
(nanoGPT's train.py has each of them). Every one is checked before any
process starts: bad input is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import os

from dt import args as args_
from dt.train.precision import PRECISIONS
from dt.train.tokenizer import KINDS

__all__ = ["add_trainer_options", "trainer_options_problem"]


def add_trainer_options(p: argparse.ArgumentParser) -> None:
    data = p.add_argument_group("data (default: generated text, dt.models.data)")
    data.add_argument("--data", nargs="+", metavar="FILE", default=None,
                      help="UTF-8 text files to train on, read in order as one text")
    data.add_argument("--tokenizer", choices=KINDS, default="byte",
                      help="byte: the 256 UTF-8 bytes; bpe: byte-level BPE trained here on --data")
    data.add_argument("--vocab-size", type=args_.at_least(257), default=2048,
                      help="the BPE vocabulary (256 bytes + merges)")
    data.add_argument("--val-fraction", type=args_.positive, default=0.1,
                      help="the last part of the text held out for validation")
    data.add_argument("--data-dir", default=None, metavar="DIR",
                      help="where the token files go (default: $XDG_CACHE_HOME/dt/corpus/<key of the files>)")
    ev = p.add_argument_group("validation")
    ev.add_argument("--eval-every", type=args_.at_least(0), default=0,
                    help="validation loss every N steps and at the last (0: never)")
    ev.add_argument("--eval-batches", type=args_.at_least(1), default=4,
                    help="global batches the validation loss is averaged over")
    lr = p.add_argument_group("learning rate and precision (--clip: the global norm, above)")
    lr.add_argument("--warmup", type=args_.at_least(0), default=0,
                    help="steps of linear warmup to --lr")
    lr.add_argument("--lr-min", type=args_.non_negative, default=None,
                    help="cosine decay from --lr to this at the last step (default: no decay)")
    lr.add_argument("--precision", choices=PRECISIONS, default="float32",
                    help="autocast dtype; weights and Adam's state stay float32 "
                         "(float16: dynamic loss scaling)")
    out = p.add_argument_group("metrics")
    out.add_argument("--metrics", default=None, metavar="FILE",
                     help="one JSON line per step (appended): loss, val_loss, lr, grad_norm, tokens/s, "
                          "MFU, time split")
    out.add_argument("--peak-flops", type=args_.positive, default=None, metavar="FLOP/S",
                     help="MFU's denominator, per process (default: one core's float32 matmul rate x "
                          "the cores the ranks use, or a GPU's matmul x the GPUs: dt/train/peak.py)")
    out.add_argument("--plot", default=None, metavar="PNG",
                     help="draw the loss curve (train and validation) into PNG at the end (matplotlib)")


def trainer_options_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the trainer options, in one line; None if nothing."""
    for name in args.data or ():
        if not os.path.isfile(name):
            return f"--data {name}: no such file"
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
