"""Evaluation of the greedy policy on envs of its own: the evaluator node and its episode loop."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trellis.builders.contract.agent import Builder, Policy, State
from trellis.builders.contract.config import ExperimentConfig
from trellis.envs.contract import HostEnvFactory
from trellis.envs.multi_agent import MultiAgentStep, episode_done
from trellis.launch import runtime


def run_episodes(
    policy: Policy,
    params: Any,
    envs: Any,
    num_episodes: int,
    key: jax.Array,
    seed: int,
    initial_state: Mapping[str, np.ndarray],
    should_stop: Callable[[], bool] | None = None,
) -> list[float]:
    """Plays one episode in each of the `num_episodes` envs of a vector env; their returns.

    Args:
      policy: jitted `policy(params, key, obs[N], state, first[N]) -> (actions[N], extras,
        state)` (`builders.contract.agent.Policy`).
      params: the policy's params.
      envs: a Gymnasium vector env of `num_episodes` envs with next-step autoreset (after an
        env's episode ends it is ignored, so each env contributes exactly one episode), or a
        multi-agent one (envs/multi_agent.py, e.g. `pettingzoo_envs.PettingZooVector`), whose
        steps the policy takes whole and whose return is the team's (the sum over agents).
      num_episodes: the vector env's size.
      key: RNG key for stochastic policies.
      seed: reset seed, so that evaluations at different times see the same start states.
      initial_state: the policy's state for the `num_episodes` envs (`Builder.initial_state`).
      should_stop: polled every step; when it returns True the episodes are cut short.

    Returns:
      The `num_episodes` undiscounted returns.
    """
    obs = envs.reset(seed=seed)
    multi_agent = isinstance(obs, MultiAgentStep)
    if not multi_agent:
        obs, _ = obs
    returns = np.zeros(num_episodes, np.float64)
    running = np.ones(num_episodes, bool)
    # The policy's state and first flags as the contract's jax.Arrays (a jitted policy would
    # move numpy's to the device anyway).
    state: State = {name: jnp.asarray(x) for name, x in initial_state.items()}
    first = jnp.ones(num_episodes, bool)
    while running.any() and not (should_stop is not None and should_stop()):
        key, step_key = jax.random.split(key)
        actions, _, state = policy(params, step_key, obs, state, first)
        first = jnp.zeros(num_episodes, bool)  # One episode per env: no later starts count.
        if multi_agent:
            obs = envs.step(jax.tree.map(np.asarray, actions))
            reward = np.sum([obs.reward[a] for a in obs.reward], axis=0)
            done = np.asarray(episode_done(obs, tuple(obs.alive)))
        else:
            obs, reward, terminated, truncated, _ = envs.step(np.asarray(actions))
            done = np.asarray(terminated) | np.asarray(truncated)
        returns += np.where(running, reward, 0.0)
        running &= ~done
    return [float(r) for r in returns]


def evaluation_seed(seed: int) -> int:
    """The evaluator's seed (its envs' resets, its key) in a run of root seed `seed`: apart from
    every env worker's. `launch/evaluate.py --seed` with it replays the run's evaluations of a
    greedy (deterministic) policy."""
    return seed * 10_007 + 9_973


def summarize(returns: list[float]) -> dict[str, float]:
    """Mean, min and max of evaluation returns."""
    return {
        "return_mean": float(np.mean(returns)),
        "return_min": float(np.min(returns)),
        "return_max": float(np.max(returns)),
        "episodes": len(returns),
    }


class Evaluator:
    """Run-loop node: evaluates the learner's current greedy policy every `eval_every` env steps.

    The first evaluation happens at start (env step 0, or where a resumed run continues), then
    whenever the learner's env-step counter has advanced `config.eval_every` past the previous
    one. Each result goes to the learner node (`record_evaluation`), whose `stats()` the
    launcher writes to the run's metrics.

    Args:
      builder: the agent; its `make_policy(networks, evaluation=True)` is evaluated.
      env_factory: builds the evaluation envs (separate from the env workers').
      learner: client of the learner node (`env_steps`, `get_params`, `record_evaluation`).
      config: `eval_every`, `eval_episodes`, `seed`.
    """

    def __init__(self, builder: Builder[Any], env_factory: HostEnvFactory, learner: Any,
                 config: ExperimentConfig):
        self._builder = builder
        self._factory = env_factory
        self._learner = learner
        self._config = config

    def run(self) -> None:
        config = self._config
        spec = self._factory.spec()
        policy = jax.jit(self._builder.make_policy(self._builder.make_networks(spec),
                                                   evaluation=True))
        initial_state = self._builder.initial_state(spec, config.eval_episodes)
        seed = evaluation_seed(config.seed)
        envs = self._factory.make_vector(config.eval_episodes, seed=seed)
        key = jax.random.PRNGKey(seed)
        stop = runtime.stop_event()
        next_eval = None
        try:
            while not stop.is_set():
                env_steps = self._learner.env_steps()
                if next_eval is not None and env_steps < next_eval:
                    stop.wait(0.25)
                    continue
                params = self._learner.get_params()
                start = time.monotonic()
                key, eval_key = jax.random.split(key)
                returns = run_episodes(policy, params, envs, config.eval_episodes, eval_key, seed,
                                       initial_state, should_stop=stop.is_set)
                if stop.is_set():
                    return
                result = summarize(returns)
                result.update(env_steps=env_steps, duration_s=time.monotonic() - start)
                self._learner.record_evaluation(result)
                next_eval = env_steps + config.eval_every
        finally:
            envs.close()
