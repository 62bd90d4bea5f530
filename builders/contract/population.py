"""Population search without gradients (`Capabilities.learns_from == EPISODES`): ask and tell
over parameter vectors, fitness from whole episodes (evolution strategies: agents/es/).

A search is pure functions of a state of the agent's own (a pytree): `ask` draws the
generation's members from the state's common random numbers, so that only seeds go out to env
workers and only scalar fitnesses come back; `update` tells the fitnesses (maximised). On
anakin a generation is one jitted call (builders/experiments/es_run.py); on the host platforms
the learner node and every env worker hold a host shell of the same search
(builders/experiments/es_node.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trellis.builders.contract.agent import Acting, AgentSettings
from trellis.envs.specs import EnvSpec

if TYPE_CHECKING:  # JAX only for annotations (see agent.py).
    import jax

__all__ = ["MemberPolicy", "PopulationSearch", "Search", "SearchLearner", "SearchSettings"]

# act(flat_params [D], obs [N, ...]) -> actions [N, ...]: one member's deterministic policy.
MemberPolicy = Callable[["jax.Array", "jax.Array"], "jax.Array"]


class Search(Protocol):
    """A strategy as pure functions of its state (jittable)."""

    @property
    def num_members(self) -> int:
        """N, the members of a generation."""
        ...

    def init(self, key: jax.Array) -> Any:
        """The first generation's state."""
        ...

    def ask(self, state: Any) -> jax.Array:
        """The generation's members as flat params, [N, D]: a pure function of `state`."""
        ...

    def update(self, state: Any, batch: Mapping[str, jax.Array]
               ) -> tuple[Any, dict[str, jax.Array]]:
        """Tell: `batch` is {"fitness": [N]}, maximised; the next generation's state."""
        ...

    def episode_key(self, state: Any) -> jax.Array:
        """The key of the generation's episodes (resets, env steps): a pure function of
        `state`, apart from the members' noise, so a resumed run plays what it would have."""
        ...


class SearchLearner(Protocol):
    """The host shell of a search, which the learner node and every env worker hold: the same
    jitted functions on the same device kind, so equal fitnesses give equal states."""

    @property
    def num_members(self) -> int: ...

    @property
    def generation(self) -> int:
        """Generations told so far."""
        ...

    @property
    def params(self) -> Any:
        """The search's mean as the policy's params."""
        ...

    @property
    def state(self) -> Any: ...

    def step(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, Any]:
        """Tells the generation's {"fitness": [N]}; the update's metrics."""
        ...

    def population(self) -> np.ndarray:
        """This generation's members as flat params, [N, D]."""
        ...

    def restore(self, state: Any) -> None: ...


class SearchSettings(AgentSettings, Protocol):
    """What the executions read of a population search's config."""

    @property
    def episodes_per_member(self) -> int:
        """Episodes each member plays per generation; its fitness is their mean return."""
        ...


class PopulationSearch(Acting[EnvSpec], Protocol):
    """What a population-search agent provides (agents/es/builder.py). Its `make_training`
    is the search's init and tell, with the state's hyper-parameters (`Training.hparams`)
    where the strategy has a learning rate to schedule."""

    @property
    def config(self) -> SearchSettings: ...

    def make_search(self, networks: Any) -> Search: ...

    def make_member_policy(self, networks: Any) -> MemberPolicy:
        """`act(flat_params [D], obs [N, ...]) -> actions [N, ...]`, deterministic (the
        search explores in parameter space), jittable and vmappable over members."""
        ...

    def make_learner(self, networks: Any, spec: EnvSpec, key: jax.Array) -> SearchLearner:
        """The search's host shell, its state from `Search.init(key)`."""
        ...
