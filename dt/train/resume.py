"""Resuming without retyping the model: a checkpoint's model configuration fills in the model options.

    dt train --n-layer 6 --n-embd 128 --steps 100 --checkpoint ckpt
    dt train --steps 200 --checkpoint ckpt        # the same model: its shape read from ckpt

Every `dt train` checkpoint records the plain model's configuration in its
manifest (dt.train.checkpoint.save_checkpoint). When --checkpoint DIR holds
one, each model option left out takes the checkpoint's value, and one typed
with another value is refused in one line naming it: those weights load into
no other shape. What is not the model's (the mesh, the batch, the schedule,
--steps) stays this run's to choose. The newest checkpoint whose manifest
reads is the one asked; loading it later checks every file, as before.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dt.parallel.checkpoint import CheckpointError
from dt.parallel.checkpoint.files import read_manifest, step_dirs

__all__ = ["MODEL_OPTIONS", "ModelOption", "adopt_checkpoint_model", "saved_model", "typed_options"]


@dataclass(frozen=True)
class ModelOption:
    """One model option of dt train and the field of the model's config it sets."""

    flag: str
    dest: str  # its attribute on the parsed options
    field: str  # its field in the checkpoint's config
    to_option: Callable[[Any], Any] = lambda saved: saved  # the config's value as the option's
    experts_only: bool = False  # meaningful only in a mixture of experts


MODEL_OPTIONS = (
    ModelOption("--block-size", "block_size", "block_size"),
    ModelOption("--n-layer", "n_layer", "n_layer"),
    ModelOption("--n-head", "n_head", "n_head"),
    ModelOption("--n-embd", "n_embd", "n_embd"),
    ModelOption("--n-kv-head", "n_kv_head", "n_kv_head"),
    ModelOption("--untied", "untied", "tied", lambda tied: not tied),
    ModelOption("--seed", "seed", "seed"),
    ModelOption("--dtype", "dtype", "dtype"),
    ModelOption("--experts", "experts", "n_experts"),
    ModelOption("--top-k", "top_k", "top_k", experts_only=True),
    ModelOption("--capacity-factor", "capacity_factor", "capacity_factor", experts_only=True),
    ModelOption("--aux-loss-coef", "aux_loss_coef", "aux_loss_coef", experts_only=True),
)


def saved_model(directory: str) -> tuple[str, dict[str, Any]] | None:
    """(step directory, model config) of the newest `dt train` checkpoint in `directory` whose
    manifest reads; None when it holds none."""
    for _, path in step_dirs(directory):
        try:
            meta = read_manifest(path)["meta"]
        except CheckpointError:
            continue  # a damaged newest: loading falls back the same way, with its warning
        if meta.get("trainer") == "dt train" and isinstance(meta.get("model"), dict):
            return path, meta["model"]
    return None


def typed_options(parser: argparse.ArgumentParser, argv: Sequence[str], dests: Sequence[str]) -> set[str]:
    """The dests among `dests` that `argv` gives a value (typed, even if equal to the default).

    Parses argv again with every default a marker no typed value can be, then puts the
    defaults back. (Not argparse.SUPPRESS: a string default is run through the option's type.)
    """
    untyped = object()
    defaults = {d: parser.get_default(d) for d in dests}
    parser.set_defaults(**dict.fromkeys(dests, untyped))
    try:
        parsed = vars(parser.parse_args(list(argv)))
    finally:
        parser.set_defaults(**defaults)
    return {d for d in dests if parsed.get(d, untyped) is not untyped}


def adopt_checkpoint_model(parser: argparse.ArgumentParser, args: argparse.Namespace,
                           argv: Sequence[str]) -> str | None:
    """Fill the model options `argv` leaves out from --checkpoint's newest checkpoint.

    Returns what was taken, in words (None with nothing to resume from); a typed option
    that disagrees with the checkpoint is parser.error, one line naming it.
    """
    found = saved_model(args.checkpoint) if getattr(args, "checkpoint", None) else None
    if found is None:
        return None
    path, saved = found
    kind = "llama" if "n_kv_head" in saved else "gpt"  # as dt sample tells them apart
    moe = bool(saved.get("n_experts"))
    options = [o for o in MODEL_OPTIONS if o.field in saved and (moe or not o.experts_only)]
    typed = typed_options(parser, argv, ["model", *(o.dest for o in options)])
    if "model" in typed and args.model != kind:
        parser.error(f"--model {args.model}: the checkpoint in {path} holds a {kind} model; "
                     f"leave --model out to resume it")
    args.model = kind
    taken = []
    for o in options:
        value = o.to_option(saved[o.field])
        if o.dest in typed and getattr(args, o.dest) != value:
            shown = "given" if isinstance(value, bool) else f"{getattr(args, o.dest)}"
            parser.error(f"{o.flag} {shown}: the checkpoint in {path} was saved with "
                         f"{_as_typed(o, value)}; leave {o.flag} out to resume it")
        setattr(args, o.dest, value)
        if o.dest not in typed:
            taken.append(_as_typed(o, value))
    return f"the model options of {path}" + (f": {' '.join(taken)}" if taken else ", as typed")


def _as_typed(o: ModelOption, value: Any) -> str:  # noqa: ANN401 - any option's value
    """How the option would be typed to give `value` ('--n-layer 6', '--untied', 'no --untied')."""
    if isinstance(value, bool) or value is None:
        return o.flag if value else f"no {o.flag}"
    return f"{o.flag} {value}"
