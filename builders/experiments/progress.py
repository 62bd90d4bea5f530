"""Progress display for runs: a live rich progress bar on a terminal, one line redrawn in place
in a Jupyter notebook, plain lines otherwise."""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any, TextIO


def _fmt_return(stats: dict[str, Any]) -> str:
    mean = stats.get("mean_return")
    if mean is None:
        return "-"
    return f"{mean:.1f} ({stats.get('returns_in_window', 0)} ep)"


def _fmt_eta(stats: dict[str, Any], total_env_steps: int) -> str:
    rate = stats.get("env_steps_per_s", 0.0)
    left = total_env_steps - stats.get("env_steps", 0)
    if rate <= 0 or left <= 0:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(left / rate))


def describe(stats: dict[str, Any], total_env_steps: int) -> str:
    """One line: env steps / budget, env steps/s, ETA, mean episode return, episodes."""
    steps = stats.get("env_steps", 0)
    line = (
        f"env steps {steps:>10,d}/{total_env_steps:,d} | "
        f"{stats.get('env_steps_per_s', 0.0):>8,.0f} steps/s | "
        f"ETA {_fmt_eta(stats, total_env_steps)} | "
        f"return {_fmt_return(stats)} | episodes {stats.get('episodes', 0):,d} | "
        f"learner steps {stats.get('learner_steps', 0):,d}"
    )
    evaluation = stats.get("evaluation")
    if evaluation:
        line += f" | eval {evaluation['return_mean']:.1f}"
    return line


def in_notebook(stream: TextIO) -> bool:
    """Whether `stream` is a Jupyter kernel's output (ipykernel's OutStream, as sys.stdout in a
    notebook or on Colab), whose front end redraws a display in place."""
    return type(stream).__module__.startswith("ipykernel.")


class Progress:
    """Shows stats as they arrive: a rich status line on a TTY, one line redrawn in place in
    a Jupyter notebook (IPython's display, updated by its id; no widgets needed), plain lines
    elsewhere.

    Args:
      total_env_steps: the budget, shown as the denominator.
      quiet: show nothing.
      stream: where to write (default stdout).
      plain_every_s: interval between plain lines when not on a TTY.
      initial: env steps already done (a resumed run), where the bar starts.
    """

    def __init__(
        self,
        total_env_steps: int,
        quiet: bool = False,
        stream: TextIO | None = None,
        plain_every_s: float = 5.0,
        initial: int = 0,
    ):
        self._total = total_env_steps
        self._quiet = quiet
        self._stream = stream or sys.stdout
        self._plain_every_s = plain_every_s
        self._last_plain = -float("inf")  # The first stats are shown at once.
        self._start = time.monotonic()
        self._bar = None
        self._display: Any = None  # IPython's DisplayHandle in a notebook.
        if not quiet and in_notebook(self._stream):
            # IPython is there: the kernel runs on it. Loaded by name: it is no dependency.
            display = importlib.import_module("IPython.display").display
            self._display = display({"text/plain": describe({}, total_env_steps)}, raw=True,
                                    display_id=True)
        elif not quiet and self._stream.isatty():
            from rich import progress
            from rich.console import Console

            self._bar = progress.Progress(
                progress.BarColumn(bar_width=16),
                progress.TaskProgressColumn(),
                progress.TimeElapsedColumn(),
                progress.TextColumn("ETA"),
                progress.TimeRemainingColumn(),
                progress.TextColumn("{task.fields[info]}"),
                console=Console(file=self._stream),
            )
            self._task = self._bar.add_task("train", total=total_env_steps, info="",
                                            completed=initial)
            self._bar.start()

    def update(self, stats: dict[str, Any]) -> None:
        if self._quiet:
            return
        elapsed = time.monotonic() - self._start
        if self._bar is not None:
            rate = stats.get("env_steps_per_s", 0.0)
            info = f"{stats.get('env_steps', 0):,d} steps {rate:,.0f}/s return {_fmt_return(stats)}"
            self._bar.update(self._task, completed=stats.get("env_steps", 0), info=info)
        elif self._display is not None:  # Every report: it replaces the one before.
            self._display.update({"text/plain": self._line(elapsed, stats)}, raw=True)
        elif elapsed - self._last_plain >= self._plain_every_s:
            self._last_plain = elapsed
            print(self._line(elapsed, stats), file=self._stream, flush=True)

    def _line(self, elapsed: float, stats: dict[str, Any]) -> str:
        return f"[{elapsed:6.1f}s] " + describe(stats, self._total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
