"""Every plot's titles fit inside its figure: a long one wraps onto more lines, none is cut off."""

from __future__ import annotations

from typing import Any

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

LONG = "dt train: " + " ".join(f"--option-{i} value-{i}" for i in range(12))  # ~250 characters


@pytest.fixture
def saved(monkeypatch) -> list[list[tuple[str, bool]]]:
    """Each figure saved: (title, whether it lies inside the figure) for every title it has."""
    out: list[list[tuple[str, bool]]] = []
    real = Figure.savefig

    def savefig(fig: Figure, *args: Any, **kwargs: Any) -> None:
        fig.canvas.draw()
        renderer, box = fig.canvas.get_renderer(), fig.bbox
        texts = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle else [])  # noqa: SLF001
        out.append([(t.get_text(), (lambda b: b.x0 >= box.x0 - 1 and b.x1 <= box.x1 + 1
                                    and b.y1 <= box.y1 + 1)(t.get_window_extent(renderer)))
                    for t in texts if t.get_text()])
        real(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return out


def test_the_loss_curves_long_title_wraps_inside_the_figure(saved, tmp_path):
    from dt.train.metrics import plot_loss

    plot_loss([{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5, "val_loss": 2.7}], tmp_path / "c.png",
              title=LONG)
    assert len(saved) == 1 and [inside for _, inside in saved[0]] == [True], saved


def test_dt_plans_and_benchs_titles_fit(saved, tmp_path, capsys):
    from dt.bench.collectives_table import plot
    from dt.plan.cli import main as plan_main

    assert plan_main(["--preset", "gpt2", "--per-host", "8", "--device", "h100", "--global-batch", "64",
                      "--seq", "1024", "--scatter", str(tmp_path / "s.png")]) == 0
    first = next(line.split()[1] for line in capsys.readouterr().out.splitlines()
                 if line.split()[:1] == ["1"])
    assert plan_main(["--preset", "gpt2", "--per-host", "8", "--device", "h100", "--global-batch", "64",
                      "--seq", "1024", "--explain", first, "--out", str(tmp_path / "e.png")]) == 0
    row = {"size": 1024, "count": 256, "type": "float", "redop": "sum", "root": -1, "algorithm": "ring",
           "in": {"busbw": 1.0}}
    machine = {"world": 2, "transports": ["shm", "torch"], "cores": 2}
    plot({"collective": "all_reduce " + LONG, "machine": machine, "results": [row]}, str(tmp_path / "b.png"))
    assert len(saved) == 3 and all(inside for fig in saved for _, inside in fig), saved
