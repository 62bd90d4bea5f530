"""ES builder: the one place that wires the policy network, the search and its host shell."""

from __future__ import annotations

import jax
import numpy as np

from trellis.agents.common import STATE_HPARAMS
from trellis.agents.common.params import Params
from trellis.agents.es.config import OPEN_ES, ESConfig
from trellis.agents.es.learner import ESLearner, Search, evosax_algorithms, make_search
from trellis.agents.es.networks import ESNetworks, make_networks
from trellis.builders.contract.agent import EPISODES, Capabilities, Policy, State, Training
from trellis.builders.contract.population import MemberPolicy
from trellis.envs.specs import EnvSpec


class ESBuilder:
    """Builder for evolution strategies: no gradient, fitness from whole episodes
    (`builders.contract.population.PopulationSearch`).

    On anakin a generation is one jitted call (builders/experiments/es_run.py); on the host
    platforms env workers evaluate members drawn from common random numbers and send back
    scalar fitnesses only (builders/experiments/es_node.py).

    Raises:
      ValueError: the strategy's package, evosax, is missing (one line): before anything
        starts rather than when the search is first made.
    """

    def __init__(self, config: ESConfig):
        self.config = config
        if config.strategy != OPEN_ES:
            evosax_algorithms(config.strategy)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(EPISODES, anakin=True)

    def make_networks(self, spec: EnvSpec) -> ESNetworks:
        return make_networks(spec, self.config.hidden_sizes)

    def make_policy(self, networks: ESNetworks, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first)`: deterministic whether evaluating
        or not (the search explores in parameter space, not by sampling actions)."""
        del evaluation

        def policy(params: Params, key: jax.Array, obs: jax.Array, state: State,
                   first: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], State]:
            del key, first
            return networks.act(params, obs), {}, state

        return policy

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        """None: the policy is feed-forward."""
        del spec, num_slots
        return {}

    def make_member_policy(self, networks: ESNetworks) -> MemberPolicy:
        """`act(flat_params [D], obs [N, ...]) -> actions [N, ...]` of one member."""
        return lambda flat, obs: networks.act(networks.unravel(flat), obs)

    def make_search(self, networks: ESNetworks) -> Search:
        """The search's pure functions (agents/es/learner.py)."""
        return make_search(networks, self.config)

    def make_training(self, networks: ESNetworks, spec: EnvSpec) -> Training:
        """init is the search state; update(state, {"fitness": [N]}) is tell. The learning rate
        is scheduled where the strategy has one (`ESConfig.has_learning_rate`)."""
        del spec
        search = self.make_search(networks)
        return Training(search.init, lambda mesh: search.update,
                        hparams=STATE_HPARAMS if self.config.has_learning_rate else None)

    def make_learner(self, networks: ESNetworks, spec: EnvSpec, key: jax.Array) -> ESLearner:
        """The search's host shell; on the CPU (`ESLearner` says why)."""
        del spec
        return ESLearner(self.make_search(networks), networks, key)
