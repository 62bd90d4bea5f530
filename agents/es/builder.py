"""ES builder: the one place that wires the policy network, the search and its host shell."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from trellis.agents.common import AgentBuilder
from trellis.agents.es.config import OPEN_ES, ESConfig
from trellis.agents.es.learner import ESLearner, Search, evosax_algorithms, make_search
from trellis.agents.es.networks import ESNetworks, make_networks
from trellis.builders.contract.agent import EPISODES, Capabilities, QueueSpec, Training
from trellis.envs.specs import EnvSpec


class ESBuilder(AgentBuilder):
    """Builder for evolution strategies: no gradient, fitness from whole episodes.

    On anakin a generation is one jitted call (builders/experiments/es_run.py); on the host
    platforms env workers evaluate members drawn from common random numbers and send back
    scalar fitnesses only (builders/experiments/es_node.py).
    """

    config: ESConfig

    def __init__(self, config: ESConfig):
        """Raises ValueError (one line) when the strategy's package, evosax, is missing: before
        anything starts rather than when the search is first made."""
        super().__init__(config)  # type: ignore[arg-type]  # Not an AgentConfig: no unrolls.
        if config.strategy != OPEN_ES:
            evosax_algorithms(config.strategy)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(EPISODES, anakin=True)

    def queue_spec(self) -> QueueSpec:
        raise TypeError("ES learns from whole episodes' fitness, not from queued unrolls")

    def make_networks(self, spec: EnvSpec) -> ESNetworks:
        return make_networks(spec, self.config.hidden_sizes)

    def make_policy(self, networks: ESNetworks, evaluation: bool = False):
        """`policy(params, key, obs[N, ...], state, first)`: deterministic whether evaluating
        or not (the search explores in parameter space, not by sampling actions)."""
        del evaluation

        def policy(params, key, obs, state, first):
            del key, first
            return networks.act(params, obs), {}, state

        return policy

    def make_search(self, networks: ESNetworks) -> Search:
        """The search's pure functions (agents/es/learner.py)."""
        return make_search(networks, self.config)

    def make_training(self, networks: ESNetworks, spec: EnvSpec) -> Training:
        """init is the search state; update(state, {"fitness": [N]}) is tell."""
        del spec
        search = self.make_search(networks)
        return Training(search.init, lambda mesh: search.update)

    def make_learner(self, networks: ESNetworks, spec: EnvSpec, key: jax.Array, *,
                     devices: Sequence[jax.Device] | None = None,
                     replay: Any = None) -> ESLearner:
        del spec, devices, replay  # The search runs on the CPU (ESLearner says why).
        return ESLearner(self.make_search(networks), networks, key)
