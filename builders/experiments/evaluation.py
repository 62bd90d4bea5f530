"""Evaluation of the greedy policy on envs of its own: the evaluator node, its episode loop and
its recorded episodes (videos: `record_episode`).

A recorded episode of a host env: the policy acts on the observations of the factory's own
vector env, what it saw in training (Atari's stacked grey 84x84 frames), while the frames are
the env's pictures (Atari's raw 210x160 screen). Of a JAX env: the episode is stepped one
jitted step at a time, each state drawn by the factory on the host.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trellis.builders.contract.agent import Builder, Policy, State
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments import recording
from trellis.envs.contract import EnvFactory, HostEnvFactory, RenderedJaxEnvFactory
from trellis.envs.multi_agent import MultiAgentStep, episode_done
from trellis.launch import runtime

# A policy's state for N envs (`Builder.initial_state(spec, N)`).
InitialState = Callable[[int], Mapping[str, np.ndarray]]


def run_episodes(
    policy: Policy,
    params: Any,
    envs: Any,
    num_episodes: int,
    key: jax.Array,
    seed: int,
    initial_state: Mapping[str, np.ndarray],
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[], None] | None = None,
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
      on_step: called after the reset and after each step (a recording takes its frames).

    Returns:
      The `num_episodes` undiscounted returns.
    """
    obs = envs.reset(seed=seed)
    multi_agent = isinstance(obs, MultiAgentStep)
    if not multi_agent:
        obs, _ = obs
    if on_step is not None:
        on_step()
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
        if on_step is not None:
            on_step()
    return [float(r) for r in returns]


def _host_episode(policy: Policy, params: Any, initial_state: InitialState,
                  factory: Any, seed: int, key: jax.Array) -> tuple[float, list[np.ndarray]]:
    envs = factory.make_recorded(seed)
    frames: list[np.ndarray] = []
    try:
        (total,) = run_episodes(policy, params, envs, 1, key, seed, initial_state(1),
                                on_step=lambda: frames.append(np.asarray(envs.render()[0])))
    finally:
        envs.close()
    return total, frames


def _jax_episode(policy: Policy, params: Any, initial_state: InitialState, jax_env: Any,
                 render: Callable[[Any], np.ndarray], key: jax.Array
                 ) -> tuple[float, list[np.ndarray]]:
    reset, step = jax.jit(jax_env.reset), jax.jit(jax_env.step)
    key, reset_key = jax.random.split(key)
    env_state, timestep = reset(reset_key)
    frames = [render(env_state)]
    state: State = {name: jnp.asarray(x) for name, x in initial_state(1).items()}
    first, total = jnp.ones(1, bool), 0.0
    while True:
        key, policy_key, step_key = jax.random.split(key, 3)
        actions, _, state = policy(params, policy_key, timestep.obs[None], state, first)
        first = jnp.zeros(1, bool)
        env_state, timestep = step(step_key, env_state, actions[0])
        total += float(timestep.reward)
        frames.append(render(env_state))
        if bool(timestep.terminated | timestep.truncated):
            return total, frames


def record_episode(policy: Policy, params: Any, initial_state: InitialState,
                   factory: EnvFactory, seed: int, key: jax.Array, path: str,
                   jax_env: Any = None) -> float:
    """Plays one episode of `factory`'s env with `policy` and writes its video to `path`.

    Args:
      policy: jitted `policy(params, key, obs[1], state, first[1])`.
      params: its params.
      initial_state: the policy's state for N envs.
      factory: the env's factory; it must render (`recording.check_recordable` it first).
      seed: the episode's reset seed (a host env's; a JAX env's start comes from `key`).
      key: the policy's (and a JAX env's) RNG key.
      path: the MP4 to write.
      jax_env: the JAX env the policy plays in (default: `factory.make()` for a JAX factory).

    Returns:
      The episode's undiscounted return.

    Raises:
      recording.RecordingError: the video extra is not installed.
    """
    if isinstance(factory, RenderedJaxEnvFactory):
        env = factory.make() if jax_env is None else jax_env
        total, frames = _jax_episode(policy, params, initial_state, env, factory.render, key)
    else:
        total, frames = _host_episode(policy, params, initial_state, factory, seed, key)
    recording.write_video(path, frames)
    return total


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
      video_dir: where each evaluation also writes one recorded episode,
        step-S-episode-0.mp4 (S: the env steps it evaluated at); None: no videos.
    """

    def __init__(self, builder: Builder[Any], env_factory: HostEnvFactory, learner: Any,
                 config: ExperimentConfig, video_dir: str | None = None):
        self._builder = builder
        self._factory = env_factory
        self._learner = learner
        self._config = config
        self._video_dir = video_dir

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
                if self._video_dir is not None:
                    os.makedirs(self._video_dir, exist_ok=True)
                    record_episode(policy, params, functools.partial(
                        self._builder.initial_state, spec), self._factory, seed, eval_key,
                        os.path.join(self._video_dir, f"step-{env_steps}-episode-0.mp4"))
                self._learner.record_evaluation(result)
                next_eval = env_steps + config.eval_every
        finally:
            envs.close()
