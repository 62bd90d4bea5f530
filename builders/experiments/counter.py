"""The run's counter: env steps, learner steps, episodes and the window of recent returns.

Acme's `build_counter` is the idea: counting is its own small piece, shared by whoever counts
(the env workers' step RPCs and the learner thread both update one `Counter`), read by whoever
decides or reports (the stop rule in `builders.experiments.stop`, `stats()`, the checkpointer).

A `Counter` is thread-safe; `snapshot()` gives an immutable `CounterSnapshot`, from which the
stop rule decides and the reports are computed, so a decision never sees half an update.
Its checkpointable form, `CounterSnapshot.progress()`, is the `progress` dict that
`checkpointing` saves beside the learner state; `Counter.restore` continues from it, so a
resumed run goes on counting (and timing) where the checkpoint left off.

Episodes are counted one way: a `ReturnWindow` (how many finished, and the returns and lengths
of the latest `return_window`) inside the `Counter` of the host platforms and in the
in-process runs of ES and self-play; the anakin program keeps the same window on the device
and gives it as `CounterSnapshot`s. A population's members are combined by `combined_stats`.

No JAX here (numpy only): the counter and the stop rule are tested without an accelerator.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class CounterSnapshot:
    """The counter at one moment.

    Attributes:
      env_steps: env steps taken by all env workers, over all sessions of the run.
      learner_steps: learner updates, over all sessions.
      episodes: finished episodes, over all sessions.
      returns: undiscounted returns of the last (at most `return_window`) episodes, oldest first.
      lengths: lengths of the same episodes.
      elapsed_s: training time summed over the run's sessions (resumes included).
      resumes: how many times the run was resumed from a checkpoint (0 for a fresh run).
    """

    env_steps: int
    learner_steps: int
    episodes: int
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    elapsed_s: float
    resumes: int

    def stats(self) -> dict[str, Any]:
        """Counters and the return window's statistics, as reported by the learner node.

        Returns:
          env_steps, learner_steps, episodes, elapsed_s, resumes, returns_in_window, and
          mean_return, min_return, max_return, mean_episode_length (None while no episode
          has finished).
        """
        returns, lengths = self.returns, self.lengths
        return {
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "mean_return": float(np.mean(returns)) if returns else None,
            "min_return": float(np.min(returns)) if returns else None,
            "max_return": float(np.max(returns)) if returns else None,
            "returns_in_window": len(returns),
            "mean_episode_length": float(np.mean(lengths)) if lengths else None,
            "elapsed_s": self.elapsed_s,
            "resumes": self.resumes,
        }

    def window_mean(self, window: int) -> float | None:
        """The mean return of the last `window` episodes, or None while fewer have finished
        (what the stop rule's target is checked on)."""
        if len(self.returns) < window:
            return None
        return float(np.mean(self.returns[-window:]))

    def progress(self) -> dict[str, Any]:
        """The checkpointable form: plain JSON types, the keys `Counter.restore` reads.

        The keys (env_steps, learner_steps, episodes, returns, lengths, elapsed_s, resumes)
        are those of existing run directories' checkpoints: keep them, or old runs stop
        resuming.
        """
        return {
            "env_steps": self.env_steps,
            "learner_steps": self.learner_steps,
            "episodes": self.episodes,
            "returns": [float(r) for r in self.returns],
            "lengths": [int(n) for n in self.lengths],
            "elapsed_s": self.elapsed_s,
            "resumes": self.resumes,
        }


def combined_stats(members: Sequence[CounterSnapshot]) -> dict[str, Any]:
    """`CounterSnapshot.stats` of a population's members (one member: its own stats).

    Counts are the first member's (members step in lockstep) but episodes, summed; the mean
    return is the mean of the members' window means, min and max are over all windows,
    `returns_in_window` is the least filled window.
    """
    per_member = [m.stats() for m in members]
    means = [s["mean_return"] for s in per_member if s["mean_return"] is not None]
    returns = [r for m in members for r in m.returns]
    lengths = [n for m in members for n in m.lengths]
    return {
        **per_member[0],
        "episodes": sum(m.episodes for m in members),
        "mean_return": float(np.mean(means)) if means else None,
        "min_return": float(np.min(returns)) if returns else None,
        "max_return": float(np.max(returns)) if returns else None,
        "returns_in_window": min(s["returns_in_window"] for s in per_member),
        "mean_episode_length": float(np.mean(lengths)) if lengths else None,
    }


class ReturnWindow:
    """Finished episodes: how many, and the returns and lengths of the latest `size`.

    Not locked: `Counter` holds it under its lock; an in-process run uses it on one thread.

    Args:
      size: how many of the latest episodes the window keeps (>= 1).
      progress: a checkpoint's progress (`CounterSnapshot.progress`) to continue from: its
        episodes, returns and lengths (the newest `size` of them).

    Raises:
      ValueError: `size` < 1.
    """

    def __init__(self, size: int, progress: Mapping[str, Any] | None = None):
        if size < 1:
            raise ValueError(f"return_window must be >= 1, got {size}")
        progress = progress or {}
        self.size = size
        self.episodes = int(progress.get("episodes", 0))
        self._returns: collections.deque[float] = collections.deque(
            (float(r) for r in progress.get("returns", [])), maxlen=size)
        self._lengths: collections.deque[int] = collections.deque(
            (int(n) for n in progress.get("lengths", [])), maxlen=size)

    def add(self, returns: Iterable[float], lengths: Iterable[int] = ()) -> None:
        """Counts finished episodes: their returns, and their lengths where known (a game's
        outcome has none)."""
        for episode_return in returns:
            self._returns.append(float(episode_return))
            self.episodes += 1
        self._lengths.extend(int(n) for n in lengths)

    @property
    def returns(self) -> tuple[float, ...]:
        """The window's returns, oldest first."""
        return tuple(self._returns)

    @property
    def lengths(self) -> tuple[int, ...]:
        """The window's lengths, oldest first."""
        return tuple(self._lengths)


class Counter:
    """Thread-safe counts of one run, continued across resumed sessions.

    Args:
      return_window: how many of the latest episodes the return window keeps.
      clock: seconds from a monotonic clock (injectable so that tests control time).
    """

    def __init__(self, return_window: int, clock: Clock = time.monotonic):
        self._lock = threading.Lock()
        self._clock = clock
        self._env_steps = 0
        self._learner_steps = 0
        self._episodes = ReturnWindow(return_window)
        self._elapsed_before = 0.0
        self._session_start = clock()
        self._resumes = 0

    @classmethod
    def restore(cls, progress: Mapping[str, Any], return_window: int,
                clock: Clock = time.monotonic) -> Counter:
        """A counter that continues from a checkpoint's `progress` (`CounterSnapshot.progress`).

        Counts and elapsed time go on from the saved ones, the return window is refilled with
        the saved returns (its newest `return_window` if the window is now smaller), and
        `resumes` is one more than saved.

        Args:
          progress: the checkpoint's progress dict; env_steps and learner_steps are required,
            the other keys default as for a fresh run (0, empty window) when absent.
          return_window: as for the constructor.
          clock: as for the constructor.

        Raises:
          KeyError: `progress` lacks env_steps or learner_steps.
        """
        counter = cls(return_window, clock)
        counter._env_steps = int(progress["env_steps"])
        counter._learner_steps = int(progress["learner_steps"])
        counter._episodes = ReturnWindow(return_window, progress)
        counter._elapsed_before = float(progress.get("elapsed_s", 0.0))
        counter._resumes = int(progress.get("resumes", 0)) + 1
        return counter

    def start_session(self) -> None:
        """Starts this session's clock now (so set-up time before training is not counted)."""
        with self._lock:
            self._session_start = self._clock()

    def add_env_steps(self, steps: int, episodes: Iterable[tuple[float, int]] = ()) -> None:
        """Counts `steps` env steps and the episodes that finished in them.

        Args:
          steps: env steps taken (one per env of a vectorised step).
          episodes: (return, length) of each episode that finished in those steps.
        """
        with self._lock:
            self._env_steps += steps
            for episode_return, length in episodes:
                self._episodes.add((episode_return,), (length,))

    def add_learner_step(self) -> None:
        """Counts one learner update."""
        with self._lock:
            self._learner_steps += 1

    def env_steps(self) -> int:
        """Env steps so far (cheaper than a snapshot, for frequent polls)."""
        with self._lock:
            return self._env_steps

    def snapshot(self) -> CounterSnapshot:
        """All counts at one moment, consistent with each other."""
        with self._lock:
            return CounterSnapshot(
                env_steps=self._env_steps,
                learner_steps=self._learner_steps,
                episodes=self._episodes.episodes,
                returns=self._episodes.returns,
                lengths=self._episodes.lengths,
                elapsed_s=self._elapsed_before + self._clock() - self._session_start,
                resumes=self._resumes,
            )


class StepRate:
    """Env steps per second over about the last `window_s` seconds.

    Over a window, not since the last read: the stats are read by several pollers (the
    session's, the display's), and env steps may come in bursts (on 2 cores Pong's workers
    wait out each update of several seconds), where a rate since the last read showed
    0 steps/s between bursts.

    Args:
      steps: the step count at the start.
      window_s: how far back the rate looks (once the run is that old).
      clock: as for `Counter`.
    """

    def __init__(self, steps: int = 0, window_s: float = 5.0, clock: Clock = time.monotonic):
        self._clock = clock
        self._window_s = window_s
        # (time, steps) a tenth of the window apart at least: at most ~11 kept.
        self._samples = collections.deque([(clock(), steps)])

    def update(self, steps: int) -> float:
        """The rate given the step count now."""
        now = self._clock()
        if now - self._samples[-1][0] >= self._window_s / 10:
            self._samples.append((now, steps))
        # The oldest kept is the newest at least `window_s` old.
        while len(self._samples) > 1 and now - self._samples[1][0] >= self._window_s:
            self._samples.popleft()
        t0, s0 = self._samples[0]
        return (steps - s0) / (now - t0) if now > t0 else 0.0
