"""Learning-curve figures: env-step ticks read 150k and 2M, not 150000 and 2000000."""

from __future__ import annotations

import json
import re

import matplotlib
import pytest

from trellis.builders.experiments import curves

# At most 5 characters ("1.25M", "-250k"); matplotlib's own labels ran to 7 ("1250000").
COMPACT = re.compile(r"^(?=.{1,5}$)-?\d+(\.\d+)?[kMB]?$")


@pytest.mark.parametrize("value,label", [
    (0, "0"), (500, "500"), (2_500, "2.5k"), (150_000, "150k"), (999_999, "1M"),
    (1_125_000, "1.125M"), (2_000_000, "2M"), (3_000_000_000, "3B"), (-250_000, "-250k"),
])
def test_format_steps(value, label):
    assert curves.format_steps(value) == label


def _run_dir(path, steps: int = 2_000_000, records: int = 41):
    """A run directory with metrics.jsonl from 0 to `steps` env steps, evaluations included."""
    path.mkdir()
    with open(path / "metrics.jsonl", "w") as f:
        for i in range(records):
            env_steps = steps * i // (records - 1)
            f.write(json.dumps({"env_steps": env_steps, "wall_time_s": 0.5 * i,
                                "return_mean": 10.0 + i, "eval_env_steps": env_steps,
                                "eval_return_mean": 12.0 + i, "eval_return_min": 5.0,
                                "eval_return_max": 20.0 + i}) + "\n")
    return str(path)


@pytest.fixture
def figures(monkeypatch):
    """The figures curves.py draws, kept (and drawn, so their tick labels are set) when it
    closes them."""
    plt = curves._pyplot()
    kept, close = [], plt.close

    def keep(fig):
        fig.canvas.draw()
        kept.append(fig)
        close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return kept


def _labels(ax: matplotlib.axes.Axes) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels() if t.get_text()]


def test_plot_run_labels_env_steps_compactly(tmp_path, figures):
    curves.plot_run(_run_dir(tmp_path / "run"), out=str(tmp_path / "curve.png"))
    (fig,) = figures
    steps, wall_time = fig.axes[:2]
    labels = _labels(steps)
    assert {"0", "500k", "1M", "2M"} <= set(labels), labels
    assert all(COMPACT.match(label) for label in labels), labels
    assert "10.0" in _labels(wall_time)  # Seconds keep matplotlib's labels.


def test_plot_runs_labels_env_steps_compactly(tmp_path, figures):
    runs = [_run_dir(tmp_path / name, steps=150_000) for name in ("a", "b")]
    curves.plot_runs(runs, str(tmp_path / "curves.png"))
    (fig,) = figures
    for ax in fig.axes[:2]:  # Training and evaluation return, both against env steps.
        labels = _labels(ax)
        assert {"0", "100k"} <= set(labels) and "100000" not in labels, labels
        assert all(COMPACT.match(label) for label in labels), labels
