"""The search state and its pure ask and tell, for our OpenAI-ES and evosax's strategies, and
the host shell that the learner node and the env workers hold.

A `Search` is four pure functions of an explicit `ESState`: `init(key)`, `ask(state)` (the
generation's population, a pure function of the state: its noise key and generation count
give the common random numbers), `update(state, {"fitness": [N]})` (tell, which draws the same
population again) and `mean(state)`. Anakin jits ask and update into one generation; on the
host, the learner node and every env worker run the same jitted functions on the CPU, so each
worker rebuilds the search state from the broadcast fitnesses (docs/es.md).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from trellis.agents.common import scale_by_learning_rate_factor
from trellis.agents.common.params import Params
from trellis.agents.es import losses
from trellis.agents.es.config import EVOSAX_STRATEGIES, OPEN_ES, ESConfig
from trellis.agents.es.networks import ESNetworks


@flax.struct.dataclass
class ESState:
    """What a search carries from generation to generation.

    Attributes:
      search: the strategy's own state (`OpenESState`, or evosax's), with its `mean` [D].
      key: the noise key (raw uint32 [2]): with `generation`, it gives every member's noise.
      generation: generations told so far (int32 []).
    """

    search: Any
    key: jax.Array
    generation: jax.Array


@flax.struct.dataclass
class OpenESState:
    mean: jax.Array  # [D]
    opt_state: optax.OptState


# The episodes' draws (resets, env steps) come from the generation's key folded with this:
# apart from the noise drawn from the same key.
_EPISODE_STREAM = 0x45505331  # "EPS1"


@dataclasses.dataclass(frozen=True)
class Search:
    """A strategy as pure functions of `ESState` (see the module docstring): a
    `builders.contract.population.Search`.

    Attributes:
      init: `init(key) -> state`, the mean at the network's initial params.
      ask: `ask(state) -> [N, D]`, the generation's members as flat params.
      update: `update(state, {"fitness": [N]}) -> (state, metrics)`, fitness maximised.
      num_members: N.
    """

    init: Callable[[jax.Array], ESState]
    ask: Callable[[ESState], jax.Array]
    update: Callable[[ESState, Mapping[str, jax.Array]], tuple[ESState, dict[str, jax.Array]]]
    num_members: int

    @staticmethod
    def mean(state: ESState) -> jax.Array:
        """The search's mean, [D]: the policy it stands for."""
        mean: jax.Array = state.search.mean
        return mean

    @staticmethod
    def episode_key(state: ESState) -> jax.Array:
        """The key of the generation's episodes, apart from its members' noise."""
        return jax.random.fold_in(losses.generation_key(state.key, state.generation),
                                  _EPISODE_STREAM)


def make_optimizer(config: ESConfig) -> optax.GradientTransformation:
    """Adam on the mean, its steps scaled by the learning-rate schedule's factor
    (`builders.contract.hparams`; 1 unless the schedule sets it)."""
    return optax.chain(optax.adam(config.learning_rate, eps=config.adam_eps),
                       scale_by_learning_rate_factor())


def fitness_metrics(fitness: jax.Array) -> dict[str, jax.Array]:
    """Best, mean and spread of a generation's fitness."""
    return {"fitness_max": jnp.max(fitness), "fitness_mean": jnp.mean(fitness),
            "fitness_std": jnp.std(fitness), "fitness_min": jnp.min(fitness)}


def make_open_es(networks: ESNetworks, config: ESConfig) -> Search:
    """OpenAI-ES: antithetic noise, centred ranks, weight decay, Adam (agents/es/losses.py)."""
    size, dim, sigma = config.population_size, networks.num_params, config.sigma
    optimizer = make_optimizer(config)

    def init(key: jax.Array) -> ESState:
        params_key, noise_key = jax.random.split(key)
        mean = networks.init_flat(params_key)
        return ESState(OpenESState(mean, optimizer.init(mean)), noise_key,
                       jnp.zeros((), jnp.int32))

    def noise(state: ESState) -> jax.Array:  # [N / 2, D]
        return losses.pair_noise(state.key, state.generation, size // 2, dim)

    def ask(state: ESState) -> jax.Array:
        return Search.mean(state) + sigma * losses.antithetic(noise(state))

    def update(state: ESState, batch: Mapping[str, jax.Array]
               ) -> tuple[ESState, dict[str, jax.Array]]:
        fitness = batch["fitness"]
        mean = state.search.mean
        gradient = losses.gradient_estimate(losses.centered_ranks(fitness), noise(state), sigma)
        step, opt_state = optimizer.update(
            losses.descent_direction(gradient, mean, config.weight_decay),
            state.search.opt_state, mean)
        # optax annotates the result as any pytree; from the array [D] it is the array [D].
        mean = jnp.asarray(optax.apply_updates(mean, step))
        metrics = {**fitness_metrics(fitness), "gradient_norm": jnp.linalg.norm(gradient),
                   "mean_norm": jnp.linalg.norm(mean)}
        return ESState(OpenESState(mean, opt_state), state.key, state.generation + 1), metrics

    return Search(init, ask, update, size)


def evosax_algorithms(strategy: str) -> Any:
    """evosax's `algorithms` module, which `strategy` (one of EVOSAX_STRATEGIES) needs.

    Raises:
      ValueError: evosax (the es extra) is not installed; one line.
    """
    try:
        return importlib.import_module("evosax.algorithms")
    except ImportError as e:
        raise ValueError(f"--strategy={strategy} needs evosax: pip install -e '.[es]' "
                         "(--strategy=open_es needs nothing more)") from e


def make_evosax(networks: ESNetworks, config: ESConfig) -> Search:
    """One of evosax 0.3's strategies on the flat params (it minimises: we tell -fitness).

    Raises:
      ValueError: evosax is not installed.
    """
    algorithms = evosax_algorithms(config.strategy)
    cls = getattr(algorithms, EVOSAX_STRATEGIES[config.strategy])
    solution = jnp.zeros(networks.num_params, jnp.float32)
    options: dict[str, Any] = {}
    if config.strategy == "evosax_open_es":
        options = {"optimizer": make_optimizer(config),
                   "std_schedule": optax.constant_schedule(config.sigma)}
    es = cls(population_size=config.population_size, solution=solution, **options)
    params = es.default_params
    if hasattr(params, "std_init"):
        params = params.replace(std_init=config.sigma)

    def init(key: jax.Array) -> ESState:
        params_key, noise_key, es_key = jax.random.split(key, 3)
        search = es.init(es_key, networks.init_flat(params_key), params)
        return ESState(search, noise_key, jnp.zeros((), jnp.int32))

    def asked(state: ESState) -> tuple[jax.Array, Any]:
        population_and_state: tuple[jax.Array, Any] = es.ask(
            losses.generation_key(state.key, state.generation), state.search, params)
        return population_and_state

    def update(state: ESState, batch: Mapping[str, jax.Array]
               ) -> tuple[ESState, dict[str, jax.Array]]:
        fitness = batch["fitness"]
        population, search = asked(state)
        tell_key = jax.random.fold_in(losses.generation_key(state.key, state.generation), 1)
        search, _ = es.tell(tell_key, population, -fitness, search, params)
        metrics = {**fitness_metrics(fitness), "mean_norm": jnp.linalg.norm(search.mean)}
        return ESState(search, state.key, state.generation + 1), metrics

    return Search(init, lambda state: asked(state)[0], update, config.population_size)


def make_search(networks: ESNetworks, config: ESConfig) -> Search:
    """The strategy `config.strategy` names."""
    return (make_open_es if config.strategy == OPEN_ES else make_evosax)(networks, config)


class ESLearner:
    """The host shell of a search, on the CPU (`builders.contract.agent.Learner`).

    The learner node and every env worker hold one and run the same jitted functions on the
    same device kind and dtype, so a worker that tells the broadcast fitnesses gets the
    learner's state bit for bit (docs/es.md says why the CPU, and how a divergence is caught).

    Args:
      search: the strategy.
      networks: for `params` (the mean as the policy's params pytree).
      key: the search's key (`Search.init`).
    """

    def __init__(self, search: Search, networks: ESNetworks, key: jax.Array):
        self._device = jax.devices("cpu")[0]
        self._networks = networks
        self.num_members = search.num_members
        self._ask = jax.jit(search.ask)
        self._update = jax.jit(search.update)
        self._state: ESState = jax.device_put(jax.jit(search.init)(key), self._device)

    def step(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Tells the generation's fitness ({"fitness": [N]}); the update's metrics."""
        fitness = jax.device_put(np.asarray(batch["fitness"], np.float32), self._device)
        metrics: dict[str, jax.Array]
        self._state, metrics = self._update(self._state, {"fitness": fitness})
        return metrics

    def population(self) -> np.ndarray:
        """This generation's members as flat params, [N, D]."""
        return np.asarray(self._ask(self._state))

    @property
    def generation(self) -> int:
        return int(self._state.generation)

    @property
    def params(self) -> Params:
        return self._networks.unravel(Search.mean(self._state))

    @property
    def state(self) -> ESState:
        return self._state

    def restore(self, state: Any) -> None:
        self._state = jax.device_put(state, self._device)
