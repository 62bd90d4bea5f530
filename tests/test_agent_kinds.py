"""An agent of each kind, written here outside agents/, trains through the public entry
(`session.run_experiment`) without an edit to Trellis: a gradient learner
(`builders.contract.agent.Builder`), a population search
(`builders.contract.population.PopulationSearch`) and a self-play agent
(`builders.contract.self_play.SelfPlayAgent`). A run that sets hyper-parameters an agent gives
no access to is refused in one line before anything starts."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import pytest

pytest.importorskip("gymnax", reason="gymnax is an optional extra (pip install -e '.[gymnax]')")

import flax.linen as nn  # noqa: E402
import flax.struct  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from trellis.agents.common import (  # noqa: E402
    STATE_HPARAMS,
    AgentBuilder,
    TrainingState,
    init_training_state,
    make_optimizer,
)
from trellis.builders.contract.agent import (  # noqa: E402
    EPISODES,
    SELF_PLAY,
    UNROLLS,
    Capabilities,
    Training,
)
from trellis.builders.contract.config import AgentConfig, Config, ExperimentConfig, setting  # noqa: E402
from trellis.builders.contract.self_play import SelfPlayCounts  # noqa: E402
from trellis.builders.experiments.platforms import PopulationSettings  # noqa: E402
from trellis.builders.experiments.session import UnsupportedError, run_experiment  # noqa: E402
from trellis.envs import make_env_factory  # noqa: E402
from trellis.envs.specs import EnvSpec  # noqa: E402

CARTPOLE = "gymnax:CartPole-v1"

# --- A gradient agent: advantage actor-critic on inference's unrolls -------------------------


class ActorCritic(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = nn.tanh(nn.Dense(64)(nn.tanh(nn.Dense(64)(obs))))
        return nn.Dense(self.num_actions)(h), nn.Dense(1)(h)[..., 0]


@dataclasses.dataclass(frozen=True)
class A2CConfig(AgentConfig):
    unroll_length: int = 16
    batch_size: int = 32
    learning_rate: float = 3e-3
    max_grad_norm: float = 0.5


def a2c_loss(params: Any, network: ActorCritic, batch: Mapping[str, jax.Array],
             discount: float) -> jax.Array:
    """One-step-bootstrapped n-step returns over the unroll [T + 1, B]; transitions out of a
    last step (terminated or truncated) are the envs' resets, not learned from."""
    logits, values = network.apply(params, batch["obs"])  # [T + 1, B, A], [T + 1, B]
    ended = batch["terminated"] | batch["truncated"]

    def back(future: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array]:
        bootstrap = jnp.where(batch["terminated"][t + 1], 0.0, values[t + 1])
        ret = batch["reward"][t + 1] + discount * jnp.where(ended[t + 1], bootstrap, future)
        return ret, ret

    steps = batch["obs"].shape[0] - 1
    _, returns = jax.lax.scan(back, values[-1], jnp.arange(steps), reverse=True)  # [T, B]
    valid = (~ended[:-1]).astype(jnp.float32)
    advantage = jax.lax.stop_gradient(returns - values[:-1])
    log_probs = jax.nn.log_softmax(logits[:-1])
    taken = jnp.take_along_axis(log_probs, batch["action"][:-1, :, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    per_step = -taken * advantage + 0.5 * (returns - values[:-1]) ** 2 - 0.01 * entropy
    return jnp.sum(valid * per_step) / jnp.maximum(jnp.sum(valid), 1.0)


class A2CBuilder(AgentBuilder):
    """A gradient agent of one's own; `hparams=False` leaves its `Training` without access
    to the state's hyper-parameters."""

    config: A2CConfig

    def __init__(self, config: A2CConfig, hparams: bool = True):
        super().__init__(config)
        self._hparams = hparams

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(UNROLLS, anakin=True)

    def make_networks(self, spec: EnvSpec) -> ActorCritic:
        return ActorCritic(spec.num_actions)

    def make_policy(self, networks: ActorCritic, evaluation: bool = False) -> Any:
        def policy(params, key, obs, state, first):
            del first
            logits, _ = networks.apply(params, obs)
            action = (jnp.argmax(logits, -1) if evaluation
                      else jax.random.categorical(key, logits))
            return action.astype(jnp.int32), {}, state

        return policy

    def make_training(self, networks: ActorCritic, spec: EnvSpec) -> Training:
        optimizer = make_optimizer(self.config)
        example = jnp.zeros((1, *spec.observation_shape), jnp.float32)

        def init(key: jax.Array) -> TrainingState:
            return init_training_state(lambda k: networks.init(k, example), optimizer, key)

        def update(state: TrainingState, batch: Mapping[str, jax.Array]):
            loss, grads = jax.value_and_grad(a2c_loss)(state.params, networks, batch,
                                                       self.config.discount)
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            return state.replace(params=optax.apply_updates(state.params, updates),
                                 opt_state=opt_state, step=state.step + 1), {"loss": loss}

        return Training(init, lambda mesh: update,
                        hparams=STATE_HPARAMS if self._hparams else None)


def _summary(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def test_gradient_agent_of_ones_own_learns_cartpole_on_anakin(tmp_path):
    """Random play lasts ~22 steps; the agent's greedy-free sampling policy gets well past
    it, with its learning rate following the linear schedule through its `Training`."""
    config = ExperimentConfig(total_env_steps=300_000, stop_at_return=150.0, return_window=50,
                              seed=1)
    summary = run_experiment(
        A2CBuilder(A2CConfig(learning_rate_schedule="linear")), make_env_factory(CARTPOLE),
        config, str(tmp_path), platform=PopulationSettings(updates_per_call=16), quiet=True)
    assert summary["mean_return"] is not None and summary["mean_return"] > 80.0, summary
    assert summary["learner_steps"] > 0 and summary["episodes"] > 100
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    factors = [r["learner/learning_rate_factor"] for r in records
               if "learner/learning_rate_factor" in r]
    assert factors and factors[-1] < 1.0  # The schedule reached the update.


@pytest.mark.parametrize("platform, asked", [
    ("anakin", "--learning_rate_schedule=linear"),
    (PopulationSettings(num_seeds=2, hparams={"learning_rate": [1e-3, 3e-3]}),
     "--member_hparams"),
])
def test_hyper_parameters_of_an_agent_without_them_are_refused_before_the_start(
        tmp_path, platform, asked):
    schedule = "linear" if "schedule" in asked else "constant"
    builder = A2CBuilder(A2CConfig(learning_rate_schedule=schedule), hparams=False)
    with pytest.raises(UnsupportedError) as error:
        run_experiment(builder, make_env_factory(CARTPOLE), ExperimentConfig(), str(tmp_path),
                       platform=platform, quiet=True)
    message = str(error.value)
    assert "\n" not in message and asked in message and "A2CBuilder" in message
    assert "gives no hparams" in message
    assert not os.path.exists(tmp_path / "metrics.jsonl")  # Nothing started.


# --- A population search: a plain evolution strategy on a linear policy -----------------------


@dataclasses.dataclass(frozen=True)
class TinyESConfig(Config):
    population_size: int = setting(32, "members per generation", ge=2)
    sigma: float = setting(0.1, "noise scale", gt=0)
    step_size: float = setting(0.2, "step of the mean along the fitness-weighted noise", gt=0)
    episodes_per_member: int = setting(1, "episodes per member and generation", ge=1)
    learning_rate_schedule: str = setting("constant", "no schedule", choices=("constant",))


@flax.struct.dataclass
class TinyESState:
    mean: jax.Array  # [D]
    key: jax.Array
    generation: jax.Array


@dataclasses.dataclass(frozen=True)
class LinearPolicy:
    num_params: int
    num_actions: int

    def unravel(self, flat: jax.Array) -> jax.Array:
        return flat.reshape(-1, self.num_actions)

    def act(self, flat: jax.Array, obs: jax.Array) -> jax.Array:
        return jnp.argmax(obs @ self.unravel(flat), axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class TinySearch:
    """Members mean + sigma * eps_i; the mean moves along the noise weighted by the
    members' standardised fitness."""

    config: TinyESConfig
    dim: int

    @property
    def num_members(self) -> int:
        return self.config.population_size

    def init(self, key: jax.Array) -> TinyESState:
        return TinyESState(jnp.zeros(self.dim), key, jnp.zeros((), jnp.int32))

    def _noise(self, state: TinyESState) -> jax.Array:
        key = jax.random.fold_in(state.key, state.generation)
        return jax.random.normal(key, (self.num_members, self.dim))

    def ask(self, state: TinyESState) -> jax.Array:
        return state.mean + self.config.sigma * self._noise(state)

    def update(self, state: TinyESState, batch: Mapping[str, jax.Array]):
        fitness = batch["fitness"]
        weights = (fitness - fitness.mean()) / (fitness.std() + 1e-8)
        step = self.config.step_size * weights @ self._noise(state) / self.num_members
        return (state.replace(mean=state.mean + step, generation=state.generation + 1),
                {"fitness_mean": fitness.mean()})

    def episode_key(self, state: TinyESState) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(state.key, state.generation), 1)


class TinySearchLearner:
    """The search's host shell (for the host platforms' learner node and workers)."""

    def __init__(self, search: TinySearch, key: jax.Array):
        self.num_members = search.num_members
        self._search = search
        self.state = jax.jit(search.init)(key)

    @property
    def generation(self) -> int:
        return int(self.state.generation)

    @property
    def params(self) -> jax.Array:
        return self.state.mean

    def step(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, Any]:
        self.state, metrics = jax.jit(self._search.update)(self.state, batch)
        return metrics

    def population(self) -> np.ndarray:
        return np.asarray(jax.jit(self._search.ask)(self.state))

    def restore(self, state: Any) -> None:
        self.state = state


class TinyESBuilder:
    def __init__(self, config: TinyESConfig):
        self.config = config

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(EPISODES, anakin=True)

    def make_networks(self, spec: EnvSpec) -> LinearPolicy:
        return LinearPolicy(spec.observation_shape[0] * spec.num_actions, spec.num_actions)

    def make_policy(self, networks: LinearPolicy, evaluation: bool = False) -> Any:
        return lambda params, key, obs, state, first: (networks.act(params, obs), {}, state)

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        return {}

    def make_search(self, networks: LinearPolicy) -> TinySearch:
        return TinySearch(self.config, networks.num_params)

    def make_member_policy(self, networks: LinearPolicy) -> Any:
        return networks.act

    def make_training(self, networks: LinearPolicy, spec: EnvSpec) -> Training:
        search = self.make_search(networks)
        return Training(search.init, lambda mesh: search.update, lambda state: state.mean)

    def make_learner(self, networks: LinearPolicy, spec: EnvSpec, key: jax.Array
                     ) -> TinySearchLearner:
        return TinySearchLearner(self.make_search(networks), key)


def test_population_search_of_ones_own_improves_on_anakin(tmp_path):
    config = ExperimentConfig(total_env_steps=150_000, stop_at_return=None, return_window=32)
    summary = run_experiment(TinyESBuilder(TinyESConfig()), make_env_factory(CARTPOLE),
                             config, str(tmp_path),
                             platform=PopulationSettings(updates_per_call=1), quiet=True)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    fitness = [r["learner/fitness_mean"] for r in records if "learner/fitness_mean" in r]
    assert summary["generations"] == summary["learner_steps"] > 10
    assert summary["env_steps"] >= 150_000 and summary["episodes"] >= 32 * 10
    assert fitness[-1] > 2 * fitness[0] and fitness[-1] > 60.0, fitness


# --- A self-play agent: a policy network playing itself, learning from won games --------------

@dataclasses.dataclass(frozen=True)
class TinySelfPlayConfig(AgentConfig):
    batch_size: int = 64
    learning_rate: float = 3e-3
    eval_every_updates: int = setting(20, "updates between evaluations", ge=0)
    eval_games: int = setting(20, "games per evaluation", ge=2)
    eval_opponent: str = setting("random", "the baseline", choices=("random",))


class MoveNet(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        flat = obs.reshape(*obs.shape[:-3], -1).astype(jnp.float32)
        return nn.Dense(self.num_actions)(nn.relu(nn.Dense(64)(flat)))


@flax.struct.dataclass
class TinySelfPlayState:
    train: TrainingState
    games: Any
    key: jax.Array
    moves: jax.Array
    games_finished: jax.Array


def _legal_logits(net: MoveNet, params: Any, games: Any) -> jax.Array:
    return jnp.where(games.legal_action_mask, net.apply(params, games.observation), -1e9)


@dataclasses.dataclass(frozen=True)
class TinySelfPlay:
    """Both sides sample the network's legal moves; a move that ends the game is reinforced
    by its reward for the mover (REINFORCE on one-move returns)."""

    env: Any
    net: MoveNet
    training: Training
    num_games: int

    def init(self, key: jax.Array) -> TinySelfPlayState:
        train_key, games_key, key = jax.random.split(key, 3)
        games = jax.vmap(self.env.init)(jax.random.split(games_key, self.num_games))
        zero = jnp.zeros((), jnp.int32)
        return TinySelfPlayState(self.training.init(train_key), games, key, zero, zero)

    def iterate(self, state: TinySelfPlayState):
        key, move_key, reset_key = jax.random.split(state.key, 3)
        games = state.games
        action = jax.random.categorical(move_key,
                                        _legal_logits(self.net, state.train.params, games))
        after = jax.vmap(self.env.step)(games, action)
        reward = jnp.take_along_axis(after.rewards, games.current_player[:, None], -1)[:, 0]
        batch = {"obs": games.observation, "legal": games.legal_action_mask,
                 "action": action, "reward": reward}
        train, metrics = self.training.make_update(None)(state.train, batch)
        fresh = jax.vmap(self.env.init)(jax.random.split(reset_key, self.num_games))
        over = after.terminated
        games = jax.tree.map(
            lambda f, a: jnp.where(over.reshape(over.shape + (1,) * (a.ndim - 1)), f, a),
            fresh, after)
        return TinySelfPlayState(train, games, key, state.moves + self.num_games,
                                 state.games_finished + over.sum(dtype=jnp.int32)), metrics

    @staticmethod
    def params(state: TinySelfPlayState) -> Any:
        return state.train.params

    @staticmethod
    def counts(state: TinySelfPlayState) -> SelfPlayCounts:
        return SelfPlayCounts(state.moves, state.train.step, state.games_finished)


class TinySelfPlayBuilder:
    def __init__(self, config: TinySelfPlayConfig):
        self.config = config

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(SELF_PLAY, anakin=True)

    def make_networks(self, spec: EnvSpec) -> MoveNet:
        return MoveNet(spec.num_actions)

    def make_training(self, networks: MoveNet, spec: EnvSpec) -> Training:
        optimizer = make_optimizer(self.config)
        example = jnp.zeros((1, *spec.observation_shape), jnp.float32)

        def loss(params, batch):
            log_probs = jax.nn.log_softmax(jnp.where(
                batch["legal"], networks.apply(params, batch["obs"]), -1e9))
            taken = jnp.take_along_axis(log_probs, batch["action"][:, None], -1)[:, 0]
            return -jnp.mean(taken * batch["reward"])

        def update(state: TrainingState, batch: Mapping[str, jax.Array]):
            value, grads = jax.value_and_grad(loss)(state.params, batch)
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            return state.replace(params=optax.apply_updates(state.params, updates),
                                 opt_state=opt_state, step=state.step + 1), {"loss": value}

        return Training(
            lambda key: init_training_state(lambda k: networks.init(k, example), optimizer,
                                            key),
            lambda mesh: update, hparams=STATE_HPARAMS)

    def make_self_play(self, networks: MoveNet, spec: EnvSpec, env: Any) -> TinySelfPlay:
        return TinySelfPlay(env, networks, self.make_training(networks, spec),
                            self.config.batch_size)

    def make_match(self, networks: MoveNet, env: Any, opponent: str, num_games: int) -> Any:
        """The network's most likely legal move against uniformly random legal moves; ours is
        player 0 in half the games."""
        if opponent != "random":
            raise ValueError(f"no baseline {opponent!r}: random only")

        def play(params: Any, key: jax.Array) -> jax.Array:
            init_key, key = jax.random.split(key)
            games = jax.vmap(env.init)(jax.random.split(init_key, num_games))
            ours = jnp.arange(num_games) % 2

            def body(carry):
                key, games, outcome = carry
                key, move_key = jax.random.split(key)
                mine = jnp.argmax(_legal_logits(networks, params, games), -1)
                other = jax.random.categorical(
                    move_key, jnp.where(games.legal_action_mask, 0.0, -jnp.inf))
                action = jnp.where(games.current_player == ours, mine, other)
                games = jax.vmap(env.step)(games, action)
                outcome = outcome + jnp.take_along_axis(games.rewards, ours[:, None], -1)[:, 0]
                return key, games, outcome

            carry = (key, games, jnp.zeros(num_games, jnp.float32))
            return jax.lax.while_loop(lambda c: ~jnp.all(c[1].terminated), body, carry)[2]

        return play


def test_self_play_agent_of_ones_own_runs_and_evaluates(tmp_path):
    pytest.importorskip("pgx", reason="pgx is in the search extra (pip install -e '.[search]')")
    config = ExperimentConfig(total_env_steps=64 * 200, stop_at_return=None, return_window=20)
    summary = run_experiment(
        TinySelfPlayBuilder(TinySelfPlayConfig(learning_rate_schedule="linear")),
        make_env_factory("pgx:tic_tac_toe"), config, str(tmp_path),
        platform=PopulationSettings(updates_per_call=1), quiet=True)
    assert summary["env_steps"] == 64 * 200 and summary["learner_steps"] == 200
    assert summary["self_play_games"] > 64 * 200 / 9  # Games last at most 9 moves.
    assert summary["episodes"] >= 20 * 10  # Evaluation games at 0, 20, ..., 180 updates.
    assert -1.0 <= summary["mean_return"] <= 1.0
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert any("eval/win" in r for r in records)
    factors = [r["learner/learning_rate_factor"] for r in records
               if "learner/learning_rate_factor" in r]
    assert factors and factors[-1] < 0.1
