"""The hyper-parameters a run sets through an agent's contract (`Training.hparams`): the
learning-rate schedule on the host, and the one-line refusal of an agent that has none.

The schedule is one mechanism for every kind of agent: `LearningRateSchedule` sets the factor
of `builders.contract.hparams.learning_rate_factor` into a state from the run's env steps (the
learner node, ES's learner and env workers, ES and self-play on anakin); the anakin program of
the gradient agents computes the same factor inside its jitted step, per member.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from trellis.builders.contract.agent import Agent, Training
from trellis.builders.contract.hparams import CONSTANT, HyperParams, learning_rate_factor

# How many times over the budget a host schedule sets the factor at most: each is a
# replacement of the state on the host.
_SETTINGS_PER_BUDGET = 1_000


class HyperParamsError(ValueError):
    """The run sets hyper-parameters the agent gives no access to: one line."""


class _NoHyperParams:
    """The hyper-parameters of an agent whose `Training.hparams` is None: none to read, none
    to set (a run that would set some is refused before it starts: `require_hparams`)."""

    def get(self, state: Any) -> dict[str, jax.Array]:
        del state
        return {}

    def set(self, state: Any, values: Mapping[str, Any]) -> Any:
        if values:
            raise HyperParamsError(f"{', '.join(sorted(values))}: this agent's training state "
                                   "holds no hyper-parameters")
        return state

    def set_learning_rate_factor(self, state: Any, factor: Any) -> Any:
        raise HyperParamsError("this agent's training state holds no learning-rate factor")


NO_HPARAMS: HyperParams = _NoHyperParams()


def require_hparams(agent: Agent, training: Training, asked: str) -> HyperParams:
    """The agent's access to its training state's hyper-parameters.

    Args:
      agent: the agent, for the message.
      training: its `make_training`'s.
      asked: what the run asks for, e.g. "--member_hparams".

    Raises:
      HyperParamsError: `training.hparams` is None.
    """
    if training.hparams is None:
        raise HyperParamsError(
            f"{asked} sets the training state's hyper-parameters, and "
            f"{type(agent).__name__}'s Training gives no hparams (a "
            "builders.contract.hparams.HyperParams, e.g. trellis.agents.common.STATE_HPARAMS "
            "for states and optimizers made with agents.common)")
    return training.hparams


def asked_hparams(agent: Agent, member_hparams: bool = False, pbt: bool = False) -> str | None:
    """What of the run sets the agent's hyper-parameters (flags, comma-separated), or None."""
    asked = [f"--learning_rate_schedule={agent.config.learning_rate_schedule}"
             if agent.config.learning_rate_schedule != CONSTANT else "",
             "--member_hparams" if member_hparams else "", "--pbt" if pbt else ""]
    return ", ".join(a for a in asked if a) or None


class LearningRateSchedule:
    """The linear schedule's factor, set into a state from the run's env steps, at most
    `_SETTINGS_PER_BUDGET` times over the budget.

    Args:
      hparams: how the agent's states take the factor.
      total_env_steps: the run's budget, where the factor reaches 0.
    """

    def __init__(self, hparams: HyperParams, total_env_steps: int):
        self._hparams = hparams
        self._total = total_env_steps
        self._next = 0  # Env steps at which the factor is next due.
        self.factor = 1.0

    @classmethod
    def of(cls, agent: Agent, training: Training, total_env_steps: int
           ) -> LearningRateSchedule | None:
        """The agent's schedule (its config's `learning_rate_schedule`); None if constant.

        Raises:
          HyperParamsError: a schedule, and the agent's `Training` has no `hparams`.
        """
        schedule = agent.config.learning_rate_schedule
        if schedule == CONSTANT:
            return None
        return cls(require_hparams(agent, training, f"--learning_rate_schedule={schedule}"),
                   total_env_steps)

    def due(self, env_steps: int) -> bool:
        return env_steps >= self._next

    def apply(self, state: Any, env_steps: int) -> Any:
        """`state` with the factor after `env_steps` set, when due; else `state` itself."""
        if not self.due(env_steps):
            return state
        self.factor = float(learning_rate_factor(env_steps, self._total))
        self._next = env_steps + max(1, self._total // _SETTINGS_PER_BUDGET)
        return self.set(state, self.factor)

    def set(self, state: Any, factor: float) -> Any:
        """`state` with `factor` set (e.g. one a learner applied, on a copy of its state)."""
        return self._hparams.set_learning_rate_factor(state, factor)

    def metrics(self) -> dict[str, float]:
        return {"learning_rate_factor": self.factor}
