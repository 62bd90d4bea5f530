"""The hyper-parameters a training state holds as arrays, and the learning-rate schedule.

`--member_hparams`, PBT and `--learning_rate_schedule` reach an agent of any kind through its
`Training.hparams`, a `HyperParams`: the experiment layer reads and writes a state's
hyper-parameters through it, never through one agent's implementation (`trellis.agents.common`
gives one, `STATE_HPARAMS`, which its optimizer and training states honour). An agent whose
`Training` has none runs, and a run that asks it for these is refused in one line before
anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CONSTANT", "LEARNING_RATE_SCHEDULES", "LINEAR", "HyperParams", "array_module",
           "learning_rate_factor"]

# What an agent's `learning_rate_schedule` may be: the rate as configured, or falling linearly
# to 0 over the run's env-step budget.
CONSTANT = "constant"
LINEAR = "linear"
LEARNING_RATE_SCHEDULES = (CONSTANT, LINEAR)


class HyperParams(Protocol):
    """Reads and writes the hyper-parameters a training state holds as arrays.

    Each works on the training state or on any pytree that holds it (a population's stacked
    states, a self-play loop's state), inside jit and vmap too: values are arrays the update
    reads, so changing them needs no recompilation.
    """

    def get(self, state: Any) -> dict[str, jax.Array]:
        """The state's hyper-parameters, {name: array} (scalars; [M] in a population)."""
        ...

    def set(self, state: Any, values: Mapping[str, Any]) -> Any:
        """A copy of `state` with the hyper-parameters in `values` replaced.

        Raises:
          ValueError: a name in `values` that the state does not hold (one line).
        """
        ...

    def set_learning_rate_factor(self, state: Any, factor: Any) -> Any:
        """A copy of `state` whose optimizers scale their steps by `factor` (the schedule's,
        `learning_rate_factor`), apart from the learning rate itself, so that PBT's changes
        of the rate and the schedule's compose.

        Raises:
          ValueError: the state has no such factor (one line).
        """
        ...


def learning_rate_factor(env_steps: Any, total_env_steps: int) -> Any:
    """The linear schedule's factor on the learning rate after `env_steps` of a budget of
    `total_env_steps`: 1 at the start, 0 at the budget's end and after it (the IMPALA paper's
    schedule, Espeholt et al., 2018, and cleanrl's PPO). A float32 array, inside jit too; of
    a number, a numpy one (`array_module`)."""
    xp = array_module(env_steps)
    # The budget as a float: as an int, jax takes it as int32, and budgets reach 10^12.
    return xp.clip(1.0 - xp.asarray(env_steps, xp.float32) / float(total_env_steps), 0.0, 1.0)


def array_module(x: Any) -> Any:
    """jax.numpy for a jax array (or a tracer), numpy for a number or a numpy array.

    The host's schedule runs on numbers: as eager jax ops, each would be compiled for the
    device at the first call, and the learner node's first call comes before its first
    update (0.7 s on a cold 2-core start with 32 workers, while the data waiting aged).
    """
    return jnp if isinstance(x, jax.Array) else np
