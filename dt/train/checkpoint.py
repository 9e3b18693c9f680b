"""Checkpoints of `dt train`: sharded, atomic, checked, kept, and resharded on load.

    dt train --dp 2 --tp 2 --pp 2 --steps 100 --checkpoint ckpt --save-every 10 --keep 3
    dt train --dp 1 --tp 2 --pp 4 --steps 200 --checkpoint ckpt     # resumes at 100, resharded

--checkpoint DIR is a directory of step-NNNNNNNN/ folders (the format is
dt.parallel.checkpoint's): every rank writes its own shard of the model and
of Adam's state, rank 0 the manifest, and the folder appears complete or not
at all. A run started on a directory that holds checkpoints resumes from
the newest good one, on whatever mesh it is given: the tensors are named as
in the unsharded model, so dp, tp and pp may all differ from the saving run.
The model configuration may not (another model is refused in one line).

Before the first step, rank 0 checks that DIR can be written and takes its
lock (a second job on the same DIR is refused, not raced); a corrupt newest
checkpoint is skipped with a one-line warning for the one before it.
"""

from __future__ import annotations

from typing import Any

from dt.parallel.checkpoint import Checkpoint, CheckpointError, Loaded, load, lock_directory, save

__all__ = ["load_checkpoint", "lock_directory", "save_checkpoint"]


def save_checkpoint(path: str, model: Any, optimizer: Any, step: int, cfg: Any, keep: int = 3,
                    extra: dict[str, Any] | None = None) -> str:
    """Collective: save this rank's shards as PATH/step-NNNNNNNN; keep the newest `keep`.

    `model` says where its tensors sit (checkpoint_places: dt.parallel.plan.Parallel);
    `cfg` is the plain model's config, recorded so that another model is refused on load.
    `extra` joins the manifest's meta (dt train's tokenizer, which dt sample reads).
    """
    return save(path, step, model, optimizer, keep=keep,
                meta={"trainer": "dt train", "model": cfg.as_dict(), **(extra or {})})


def _same_model(cfg: Any) -> Any:
    def check(ckpt: Checkpoint) -> None:
        where = f"checkpoint {ckpt.path}"
        if ckpt.meta.get("trainer") != "dt train":
            raise CheckpointError(f"{where}: not saved by dt train (trainer {ckpt.meta.get('trainer')!r})")
        theirs, mine = ckpt.meta.get("model", {}), cfg.as_dict()
        diff = [f"{k} {theirs.get(k)!r} there, {v!r} here" for k, v in mine.items() if theirs.get(k) != v]
        if diff:
            raise CheckpointError(f"{where}: saved for another model ({', '.join(diff)})")
    return check


def load_checkpoint(path: str, model: Any, optimizer: Any, cfg: Any) -> Loaded | None:
    """Collective: load the newest good checkpoint under PATH, resharded to this mesh.

    None when PATH holds none yet. The learning rate stays this run's (--lr).
    """
    return load(path, model, optimizer, hyperparameters=False, check=_same_model(cfg))
