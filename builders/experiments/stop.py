"""When a run stops: the env-step budget, or a mean return target over a full return window.

Acme's `StepsLimiter` is the idea: stopping is its own small piece, a pure function of the
counter (`builders.counter.CounterSnapshot`), asked by the learner loop between steps. It
returns why the run should stop, which the program reports as `stopped_by`, or None.

No JAX here (numpy only), like the counter.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trellis.builders.experiments.counter import CounterSnapshot

BUDGET = "budget"
RETURN_TARGET = "return_target"


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
    """

    total_env_steps: int
    stop_at_return: float | None = None
    return_window: int = 100

    def __post_init__(self):
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
