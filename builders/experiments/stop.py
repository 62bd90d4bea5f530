"""When a run stops: the env-step budget, or a mean return target over a full return window.

Acme's `StepsLimiter` is the idea: stopping is its own small piece, a pure function of the
counters (`builders.experiments.counter.CounterSnapshot`, one per population member), asked
where the counters live: by the learner node between updates, by the anakin loop between
compiled calls. It returns why the run should stop, which the summary reports as `stopped_by`,
or None. The session (`builders.experiments.session`) makes one from the run's settings.

No JAX here (numpy only), like the counter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.counter import CounterSnapshot

# Why a run stopped (summary.json's `stopped_by`).
BUDGET = "budget"
RETURN_TARGET = "return_target"
SIGNAL = "signal"  # Ctrl-C, SIGTERM, SIGQUIT, or the caller's `on_stats` (e.g. Ray Tune).


@dataclasses.dataclass(frozen=True)
class StopRule:
    """Stops at whichever comes first: the env-step budget or the return target.

    Attributes:
      total_env_steps: stop once this many env steps are counted ("budget").
      stop_at_return: stop once the mean return of the last `return_window` episodes is at
        least this ("return_target"); None: no return target. Not checked before
        `return_window` episodes have finished, so a few lucky first episodes cannot stop
        the run.
      return_window: how many of the latest episodes the target's mean is over.
      every_member: a population reaches the target when every member has (independent
        seeds); False: when any member has (population-based training, whose exploits
        restart the windows of the members they replace, so some window is always filling).
    """

    total_env_steps: int
    stop_at_return: float | None = None
    return_window: int = 100
    every_member: bool = True

    def __post_init__(self) -> None:
        if self.total_env_steps < 1:
            raise ValueError(f"StopRule: total_env_steps must be >= 1, got {self.total_env_steps}")
        if self.return_window < 1:
            raise ValueError(f"StopRule: return_window must be >= 1, got {self.return_window}")

    def __call__(self, snapshot: CounterSnapshot) -> str | None:
        """Why the run should stop now ("budget" or "return_target"), or None to go on.

        The budget is checked first: a run that reaches both at once reports "budget".
        """
        if snapshot.env_steps >= self.total_env_steps:
            return BUDGET
        if self.stop_at_return is None or len(snapshot.returns) < self.return_window:
            return None
        # The snapshot's window may be longer than ours: the target is over our last episodes.
        window = snapshot.returns[-self.return_window:]
        return RETURN_TARGET if float(np.mean(window)) >= self.stop_at_return else None

    @classmethod
    def of(cls, config: ExperimentConfig, every_member: bool = True) -> StopRule:
        """The rule of a run's settings."""
        return cls(config.total_env_steps, config.stop_at_return, config.return_window,
                   every_member)

    def decide(self, members: Sequence[CounterSnapshot]) -> str | None:
        """Why a population should stop: any member at the budget (they step in lockstep),
        or the return target reached by every member (`every_member`) or by any; or None."""
        decisions = [self(m) for m in members]
        if BUDGET in decisions:
            return BUDGET
        reached = all if self.every_member else any
        return RETURN_TARGET if reached(d == RETURN_TARGET for d in decisions) else None
