"""The hyper-parameters a run sets through an agent's contract (`Training.hparams`): the
learning-rate schedule on the host, and the one-line refusal of an agent that has none.

The schedule is one mechanism for every kind of agent: `LearningRateSchedule` sets the factor
of `builders.contract.hparams.learning_rate_factor` into a state from the run's env steps (the
learner node, ES's learner and env workers, ES and self-play on anakin); the anakin program of
the gradient agents computes the same factor inside its jitted step, per member. Each reports
the learning rate in effect (`LEARNING_RATE`: the configured rate, or a member's own, times the
factor) in its stats.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import jax

from trellis.builders.contract.agent import Agent, Training
from trellis.builders.contract.hparams import CONSTANT, HyperParams, learning_rate_factor

# How many times over the budget a host schedule sets the factor at most: each replaces the
# learner's state on the host (1.5 ms for feed-forward IMPALA on 2 cores). At 1,000, IMPALA on
# CartPole (300k env steps, ~170 env steps per update) replaced it every other update; at 100
# the rate steps by 1% of its start, and the state is replaced once in ~20 updates.
_SETTINGS_PER_BUDGET = 100

# The learning rate in effect, as a metrics record names it (a top-level field).
LEARNING_RATE = "learning_rate"


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


def require_hparams(agent: Agent[Any], training: Training, asked: str) -> HyperParams:
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


def asked_hparams(agent: Agent[Any], member_hparams: bool = False, pbt: bool = False) -> str | None:
    """What of the run sets the agent's hyper-parameters (flags, comma-separated), or None."""
    asked = [f"--learning_rate_schedule={agent.config.learning_rate_schedule}"
             if agent.config.learning_rate_schedule != CONSTANT else "",
             "--member_hparams" if member_hparams else "", "--pbt" if pbt else ""]
    return ", ".join(a for a in asked if a) or None


@runtime_checkable
class LearningRateSettings(Protocol):
    """An agent's config with a learning rate (the gradient agents', ES's, AlphaZero's)."""

    @property
    def learning_rate(self) -> float: ...


def configured_learning_rate(agent: Agent[Any]) -> float | None:
    """The learning rate the agent's config sets, or None for a config without one."""
    config = agent.config
    return float(config.learning_rate) if isinstance(config, LearningRateSettings) else None


class LearningRateSchedule:
    """The learning rate in effect: the configured one times the linear schedule's factor,
    which is set into a state from the run's env steps, at most `_SETTINGS_PER_BUDGET` times
    over the budget. A constant rate's schedule sets nothing (its `factor` stays None) and
    only reports the rate.

    Args:
      hparams: how the agent's states take the factor; None: a constant rate.
      total_env_steps: the run's budget, where the factor reaches 0.
      learning_rate: the configured rate, or None for an agent without one (its metrics then
        hold the factor only).
    """

    def __init__(self, hparams: HyperParams | None, total_env_steps: int,
                 learning_rate: float | None = None):
        self._hparams = hparams
        self._total = total_env_steps
        self._learning_rate = learning_rate
        self._next = 0  # Env steps at which the factor is next due.
        self.factor: float | None = None  # The factor set last; None before the first.

    @classmethod
    def of(cls, agent: Agent[Any], training: Training, total_env_steps: int
           ) -> LearningRateSchedule | None:
        """The agent's schedule (its config's `learning_rate_schedule`); a constant rate's
        when the config has a rate (to report it), else None if constant.

        Raises:
          HyperParamsError: a schedule, and the agent's `Training` has no `hparams`.
        """
        schedule = agent.config.learning_rate_schedule
        learning_rate = configured_learning_rate(agent)
        if schedule == CONSTANT:
            return None if learning_rate is None else cls(None, total_env_steps, learning_rate)
        return cls(require_hparams(agent, training, f"--learning_rate_schedule={schedule}"),
                   total_env_steps, learning_rate)

    def due(self, env_steps: int) -> bool:
        """Whether `apply` would set the factor now (never for a constant rate)."""
        return self._hparams is not None and env_steps >= self._next

    def apply(self, state: Any, env_steps: int) -> Any:
        """`state` with the factor after `env_steps` set, when due; else `state` itself."""
        if not self.due(env_steps):
            return state
        factor = float(learning_rate_factor(env_steps, self._total))
        self._next = env_steps + max(1, self._total // _SETTINGS_PER_BUDGET)
        state = self.set(state, factor)
        self.factor = factor
        return state

    def set(self, state: Any, factor: float) -> Any:
        """`state` with `factor` set (e.g. one a learner applied, on a copy of its state).

        Raises:
          HyperParamsError: a constant rate's schedule, which sets no factor.
        """
        if self._hparams is None:
            raise HyperParamsError("a constant learning rate has no factor to set")
        return self._hparams.set_learning_rate_factor(state, factor)

    def metrics(self) -> dict[str, float]:
        """`learning_rate` in effect and the schedule's `learning_rate_factor` (each where
        known)."""
        factor = 1.0 if self.factor is None else self.factor
        return {**({} if self.factor is None else {"learning_rate_factor": factor}),
                **({} if self._learning_rate is None
                   else {LEARNING_RATE: self._learning_rate * factor})}
