"""Learning curves from run directories: one run, or runs grouped by settings over seeds.

One run gives its return against env steps and against wall time. Several runs are grouped
by their settings (all but the seed); each group is drawn as the interquartile mean (IQM)
across its seeds with its 95% bootstrap confidence interval shaded (`aggregate`, rliable's
reporting), training return on the left and the greedy evaluation return on the right.
`launch/plot.py` is the command line; `run_experiment` draws each run's curve.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trellis.builders.experiments.aggregate import bootstrap_ci, interquartile_mean
from trellis.builders.experiments.rundir import (
    AGENT_CONFIG,
    COMMAND_LINE,
    CONFIG,
    CURVE,
    EXPERIMENT,
    SUMMARY,
    read_json,
    read_metrics,
    write_json,
)

if TYPE_CHECKING:  # Annotations only: matplotlib is imported when a curve is drawn.
    from matplotlib.axes import Axes

# Settings that do not make runs different experiments.
_NOT_SETTINGS = {"seed", "quiet", "platform", "ray_address", "log_every_s", "checkpoint_every_s",
                 "keep_checkpoints"}


def _pyplot() -> types.ModuleType:
    # Imported here, not at the top: the launcher imports this module before it launches a
    # run's nodes, and matplotlib cost ~0.07 s of its ~0.7 s to the launch on 2 cores.
    import matplotlib

    matplotlib.use("Agg")  # Files only; no display needed (CI, servers).
    import matplotlib.pyplot as plt  # After choosing the backend, which must come first.

    return plt


def format_steps(value: float, pos: Any = None) -> str:
    """A compact tick label for a count of steps: 950, 2.5k, 150k, 1.125M, 2M, 3B.

    Matplotlib writes counts below a million in full, and the ticks of an env-steps axis
    ("100000", "125000", ...) run into each other. `pos` is the tick's index
    (matplotlib.ticker.FuncFormatter's signature), unused.
    """
    value = float(f"{value:.4g}")  # 4 significant digits first: 999,999 is 1M, not 1000k.
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _steps_axis(ax: Axes) -> None:
    """Labels the x axis of `ax` (env steps) with `format_steps`."""
    from matplotlib.ticker import FuncFormatter  # After _pyplot(), as its caller's axes are.

    ax.xaxis.set_major_formatter(FuncFormatter(format_steps))


def _series(records: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    points = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _member_returns(records: list[dict[str, Any]], x: str) -> tuple[list[float], np.ndarray] | None:
    """(x values, returns [R, M]) of a population's members (`member/<i>/return_mean`), over
    the records where every member has one; None for a run of one agent."""
    names = sorted({k for r in records for k in r if k.startswith("member/")
                    and k.endswith("/return_mean")}, key=lambda k: int(k.split("/")[1]))
    rows = [r for r in records if r.get(x) is not None and all(n in r for n in names)]
    if not names or not rows:
        return None
    return [r[x] for r in rows], np.array([[r[n] for n in names] for r in rows])


def _agent_rewards(records: list[dict[str, Any]]) -> list[str]:
    """The per-agent reward metrics of a multi-agent run (`learner/agent/<id>/reward_mean`,
    agents/common/multi_agent.agent_metrics), sorted; [] for a single-agent run."""
    return sorted({k for r in records for k in r
                   if k.startswith("learner/agent/") and k.endswith("/reward_mean")})


def finish_run_dir(run_dir: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Writes a finished run's summary.json and its learning curve; returns `summary`."""
    write_json(os.path.join(run_dir, SUMMARY), summary)
    try:
        plot_run(run_dir)
    except FileNotFoundError:  # Stopped before the first metrics record: nothing to draw.
        pass
    return summary


def plot_run(run_dir: str, out: str | None = None) -> str:
    """Draws a run's learning curve (return vs env steps and vs wall time); for a population
    (anakin's --num_seeds), the members' interquartile mean with its 95% bootstrap confidence
    interval.

    Args:
      run_dir: a run directory with metrics.jsonl.
      out: the PNG to write (default: RUN_DIR/learning_curve.png).

    Returns:
      The PNG's path.

    Raises:
      FileNotFoundError: the run has no metrics yet.
    """
    records = read_metrics(run_dir)
    if not records:
        raise FileNotFoundError(f"no metrics in {os.path.join(run_dir, 'metrics.jsonl')}")
    plt = _pyplot()
    agents = _agent_rewards(records)
    fig, axes = plt.subplots(1, 3 if agents else 2, figsize=(15 if agents else 10, 3.8))
    axes[1].sharey(axes[0])
    for ax, x, label in ((axes[0], "env_steps", "env steps"),
                         (axes[1], "wall_time_s", "wall time (s)")):
        members = _member_returns(records, x)
        if members:  # An anakin population: its members are seeds.
            xs, returns = members
            low, high = bootstrap_ci(returns.T)
            line, = ax.plot(xs, interquartile_mean(returns.T), label=(
                f"training, IQM of {returns.shape[1]} members (each: last {_window(run_dir)} "
                "episodes; 95% CI shaded)"))
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2)
        else:
            xs, ys = _series(records, x, "return_mean")
            ax.plot(xs, ys, label=f"training (mean of last {_window(run_dir)} episodes)")
        evals = [r for r in records if r.get("eval_return_mean") is not None]
        if evals:
            # Evaluations are placed where their params were taken (eval_env_steps); on the
            # time axis, at the record that reported them.
            ex = [r["eval_env_steps"] if x == "env_steps" else r[x] for r in evals]
            line, = ax.plot(ex, [r["eval_return_mean"] for r in evals], "o-", ms=3,
                            label="evaluation (greedy: mean, min-max)")
            ax.fill_between(ex, [r["eval_return_min"] for r in evals],
                            [r["eval_return_max"] for r in evals], color=line.get_color(),
                            alpha=0.2)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    _steps_axis(axes[0])
    axes[0].set_ylabel("episode return")
    axes[0].legend(loc="best", fontsize="small")
    if agents:  # A multi-agent run: each agent's mean reward per step it acted.
        for name in agents:
            xs, ys = _series(records, "env_steps", name)
            axes[2].plot(xs, ys, label=name.split("/")[-2])
        axes[2].set_xlabel("env steps")
        axes[2].set_ylabel("reward per step")
        axes[2].grid(alpha=0.3)
        axes[2].legend(loc="best", fontsize="small")
        _steps_axis(axes[2])
    fig.suptitle(_title(run_dir))
    fig.tight_layout()
    out = out or os.path.join(run_dir, CURVE)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _config(run_dir: str) -> dict[str, Any]:
    try:
        return read_json(os.path.join(run_dir, CONFIG))
    except (OSError, json.JSONDecodeError):
        return {}


def _title(run_dir: str) -> str:
    options = _config(run_dir).get(COMMAND_LINE) or {}
    name = f"{options.get('agent', '?')} on {options.get('env', '?')}"
    return f"{name}  ({os.path.basename(os.path.normpath(run_dir))})"


def _window(run_dir: str) -> Any:
    """The run's return_window: the episodes each training return is the mean of."""
    return (_config(run_dir).get(EXPERIMENT) or {}).get("return_window", "?")


def _settings(run_dir: str) -> dict[str, Any]:
    """Every setting of the run (config.json's sections, flat), less _NOT_SETTINGS."""
    config = _config(run_dir)
    flat = {k: v for section in (COMMAND_LINE, EXPERIMENT, AGENT_CONFIG)
            for k, v in (config.get(section) or {}).items()}
    return {k: v for k, v in flat.items() if k not in _NOT_SETTINGS}


def seeds_aggregate(curves: list[tuple[list[float], list[float]]], num: int = 200
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The seeds' curves on a common grid of `num` points where every seed has data: (grid,
    interquartile mean, and the ends of its 95% bootstrap confidence interval)."""
    end = min(xs[-1] for xs, _ in curves)
    start = max(xs[0] for xs, _ in curves)
    grid = np.linspace(start, end, num) if end > start else np.array([start])
    ys = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])  # [seeds, num]
    low, high = bootstrap_ci(ys)
    return grid, interquartile_mean(ys), low, high


def plot_runs(run_dirs: Sequence[str], out: str) -> str:
    """Overlays runs: one line per group of seeds (their interquartile mean) with its 95%
    bootstrap confidence interval shaded.

    Raises:
      FileNotFoundError: a run directory has no metrics.
    """
    groups: dict[str, list[str]] = {}
    settings = {d: _settings(d) for d in run_dirs}
    for d in run_dirs:
        if not read_metrics(d):
            raise FileNotFoundError(f"no metrics in {os.path.join(d, 'metrics.jsonl')}")
        groups.setdefault(json.dumps(settings[d], sort_keys=True), []).append(d)
    # Label groups by what tells them apart.
    keys = sorted({k for s in settings.values() for k in s})
    varying = [k for k in keys if len({json.dumps(s.get(k)) for s in settings.values()}) > 1]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for dirs in groups.values():
        s = settings[dirs[0]]
        label = " ".join(f"{k}={s.get(k)}" for k in varying) or f"{s.get('agent')} {s.get('env')}"
        label += (f" (IQM of {len(dirs)} seeds, 95% CI)" if len(dirs) > 1 else " (1 seed)")
        for ax, x, y in ((axes[0], "env_steps", "return_mean"),
                         (axes[1], "eval_env_steps", "eval_return_mean")):
            curves = [_series(read_metrics(d), x, y) for d in dirs]
            curves = [c for c in curves if c[0]]
            if not curves:
                continue
            grid, iqm, low, high = seeds_aggregate(curves)
            line, = ax.plot(grid, iqm, label=label)
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
    windows = sorted({str(_window(d)) for d in run_dirs})
    axes[0].set_title(f"training return (last {' or '.join(windows)} episodes)")
    axes[1].set_title("evaluation return (greedy)")
    for ax in axes:
        ax.set_xlabel("env steps")
        _steps_axis(ax)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("episode return")
    axes[0].legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


