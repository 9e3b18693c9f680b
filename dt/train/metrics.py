"""`dt train --metrics FILE`: one JSON line per step; `--plot PNG`: the loss curve drawn from them.

    {"step": 12, "loss": 2.31, "lr": 0.0029, "grad_norm": 0.84, "tokens_per_s": 5120.0,
     "mfu": 0.0123, "time": {"compute": 0.041, "communication": 0.012, "bubble": 0.0}}
    {"step": 20, ..., "val_loss": 2.40}          # on the steps validation ran (--eval-every)

`step` counts steps done (1 after the first); `time` is the step's seconds by
part (dt.train.loop's split), `tokens_per_s` the global batch's tokens over the
step's wall time. Each run first writes one line that marks where it starts:

    {"run": {"started": "<UTC, ISO 8601>", "world": 4, "from_step": 0, "dp": 2, ...}}

its options (every one, as the run settled them), when it started (UTC), its
processes and the step it starts after (a resumed run's: its checkpoint's).
A resumed run appends to the file: the steps continue after its own marker.
Only rank 0 writes. Lines are flushed as they are written, so `tail -f` follows a run.

MFU = model FLOPs per token (dt.cost.flops.train_flops_per_token: forward and
backward, no recompute) x tokens/s / peak FLOP/s of the cores or devices the job computes
on (dt/train/peak.py defines it: one core's matmul rate x the cores the ranks use). The
record holds the ratio as computed; what is printed never shows one above 1 as if true
(peak.format_mfu).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from dt.cost.flops import train_flops_per_token

__all__ = ["MetricsLog", "curve_records", "mfu", "model_flops_per_token", "plot_loss", "read_metrics",
           "run_marker"]


def model_flops_per_token(cfg: Any) -> float | None:
    """Forward + backward FLOPs per token of the model `cfg` describes (dt.cost.flops: the one formula)."""
    try:
        return train_flops_per_token(cfg)
    except (AttributeError, TypeError):  # a config the formula cannot read: no MFU, rather than a wrong one
        return None


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float) -> float:
    """The fraction of the peak the model's own arithmetic used."""
    return flops_per_token * tokens_per_s / peak_flops if peak_flops > 0 else math.nan


class MetricsLog:
    """Appends one JSON object per record to `path` (None: keeps them in memory only).

    `run`: the run's marker, written first ({"run": run}); `records` holds the steps' only.
    """

    def __init__(self, path: str | Path | None, run: dict[str, Any] | None = None):
        self.records: list[dict[str, Any]] = []
        self.file: IO[str] | None = open(path, "a") if path else None
        if run is not None:
            self._line({"run": run})

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self._line(record)

    def _line(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record, default=str) + "\n")  # a path, a dtype: as text
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def run_marker(args: Any, world: int, from_step: int) -> dict[str, Any]:  # noqa: ANN401 - a Namespace
    """What a metrics file says before a run's steps: its options, start (UTC), world, first step."""
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "world": world,
            "from_step": from_step, **{k: v for k, v in sorted(vars(args).items())}}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The step records of a metrics file, every run's (the runs' markers left out); ValueError
    naming the line that is neither."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{n}: not a JSON line") from None
            if isinstance(rec, dict) and set(rec) == {"run"}:
                continue
            if not isinstance(rec, dict) or "step" not in rec or "loss" not in rec:
                raise ValueError(f"{path}:{n}: not a dt train metrics record (no step and loss)")
            out.append(rec)
    return out


def curve_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, the last written (a run resumed from a checkpoint redoes the steps
    after it: their second records are the ones the checkpoints continue from), in step order."""
    return sorted({r["step"]: r for r in records}.values(), key=lambda r: r["step"])


def plot_loss(records: Sequence[dict[str, Any]], png: str | Path, title: str = "dt train") -> None:
    """Training loss per step and validation loss where measured, saved as a PNG (headless)."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib); --metrics does not") from None
    matplotlib.use("Agg")  # no display: a file, never a window
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    try:
        ax.plot([r["step"] for r in records], [r["loss"] for r in records], lw=1, label="train")
        val = [r for r in records if r.get("val_loss") is not None]
        if val:
            ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label="validation")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title(title, fontsize=9, wrap=True)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png)
    finally:
        plt.close(fig)
