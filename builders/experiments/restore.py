"""A run's member restored from its checkpoint, for evaluation (launch/evaluate.py).

Each kind of agent says how its acting params are restored from a run directory (the
`restore` of its entry in `session.EXECUTIONS`): a gradient agent's from its learner's
checkpoint (host platforms) or from its population's (anakin, one member), a population
search's from its search state, a self-play agent's from its loop's state. What comes back
is a `Member`, which plays: evaluate.py asks the run's kind and plays what it gets, without
knowing the kind.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from trellis.builders.contract.agent import Acting, Learner, Policy
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.contract.population import PopulationSearch, SearchLearner
from trellis.builders.experiments import recording
from trellis.builders.experiments.checkpointing import (
    Checkpointer,
    checkpoint_dir,
    read_newest,
)
from trellis.builders.experiments.device_evaluation import play_episodes
from trellis.builders.experiments.evaluation import record_episode, run_episodes, summarize
from trellis.envs.contract import EnvFactory, is_host, is_jax
from trellis.envs.specs import EnvSpec


class RestoreError(ValueError):
    """The run's member cannot be restored or played as asked: one line."""


@dataclasses.dataclass(frozen=True)
class Wanted:
    """What an evaluation asks of a run.

    Attributes:
      run_dir: the run directory.
      platform: the platform the run ran on (its config.json's).
      num_seeds: the run's population size (anakin).
      step: the checkpoint's env steps; None: the newest.
      member: a population's member (anakin).
      opponent: the baseline a self-play agent plays against; None: the run's own.
    """

    run_dir: str
    platform: str
    num_seeds: int = 1
    step: int | None = None
    member: int = 0
    opponent: str | None = None


class Member(Protocol):
    """A run's member restored from a checkpoint: it plays fresh episodes (or games)."""

    @property
    def step(self) -> int:
        """The checkpoint's env steps."""
        ...

    @property
    def progress(self) -> Mapping[str, Any]:
        """The checkpoint's progress record (learner_steps, ...)."""
        ...

    def play(self, episodes: int, seed: int) -> dict[str, Any]:
        """Plays `episodes` episodes from `seed`: `evaluation.summarize` of their returns,
        with the member's own fields."""
        ...

    def record(self, episodes: int, seed: int, video_dir: str) -> dict[str, Any]:
        """As `play`, one env at a time, each episode recorded as a video into `video_dir`.

        Raises:
          RestoreError: the env cannot be recorded (its factory does not render, or the
            video extra is missing: `recording.check_recordable`).
        """
        ...


@dataclasses.dataclass(frozen=True)
class PolicyMember:
    """An acting agent's member: its greedy policy with the checkpoint's params, played one
    episode per env in fresh envs: the JAX env `jax_env` on the device, or else the factory's
    host envs.

    Attributes:
      policy: the greedy policy (`make_policy(networks, evaluation=True)`), jitted.
      initial_state: `initial_state(num_slots)`, the policy's state.
      params: the acting params.
      step, progress: the checkpoint's (`Member`).
      env_factory: the run's envs.
      jax_env: the JAX env the policy acts in (e.g. the anakin program's), or None.
      fields: more fields of the result (e.g. the member).
    """

    policy: Policy
    initial_state: Callable[[int], dict[str, np.ndarray]]
    params: Any
    step: int
    progress: Mapping[str, Any]
    env_factory: EnvFactory
    jax_env: Any = None
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def play(self, episodes: int, seed: int) -> dict[str, Any]:
        if self.jax_env is not None:
            play = jax.jit(functools.partial(play_episodes, self.jax_env, self.policy,
                                             initial_state={}, num_episodes=episodes))
            returns = np.asarray(play(self.params, key=jax.random.key(seed))).tolist()
        elif is_host(self.env_factory):
            envs = self.env_factory.make_vector(episodes, seed=seed)
            try:
                returns = run_episodes(self.policy, self.params, envs, episodes,
                                       jax.random.PRNGKey(seed), seed,
                                       self.initial_state(episodes))
            finally:
                envs.close()
        else:
            raise RestoreError(f"{self.env_factory.env_id} is written in JAX and this member "
                               "has no JAX env to play it in")
        return {**summarize(returns), **self.fields}

    def record(self, episodes: int, seed: int, video_dir: str) -> dict[str, Any]:
        """As `play`, one episode at a time, each written to VIDEO_DIR/step-S-episode-I.mp4
        (S: the checkpoint's env steps) by `evaluation.record_episode`."""
        try:
            recording.check_recordable(self.env_factory)
        except recording.RecordingError as e:
            raise RestoreError(str(e)) from e
        os.makedirs(video_dir, exist_ok=True)
        key, returns = jax.random.PRNGKey(seed), []
        for i in range(episodes):
            key, episode_key = jax.random.split(key)
            path = os.path.join(video_dir, f"step-{self.step}-episode-{i}.mp4")
            returns.append(record_episode(
                self.policy, self.params, self.initial_state, self.env_factory, seed + i,
                episode_key, path, self.jax_env))
        return {**summarize(returns), **self.fields}


def restore_state(run_dir: str, target: Any, step: int | None
                  ) -> tuple[Any, int, dict[str, Any]]:
    """(state, step, progress) of the run's checkpoint `step` (None: the newest one that
    restores, past unreadable newer ones with one warning line, as `--resume` goes past them,
    but leaving them in place: `checkpointing.read_newest`), restored onto `target`'s
    structure.

    Raises:
      RestoreError: the run has no checkpoints.
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable
        (with `step` None: none is readable).
    """
    directory = checkpoint_dir(run_dir)
    if not os.path.isdir(directory):
        raise RestoreError(f"no checkpoints in {directory}")
    checkpointer = Checkpointer(directory)
    try:
        if step is None:
            step, (state, progress) = read_newest(
                directory, functools.partial(checkpointer.restore, target))
        else:
            state, progress = checkpointer.restore(target, step)
    finally:
        checkpointer.close()
    return state, step, progress


def policy_member(builder: Acting[Any], env_factory: EnvFactory, networks: Any, params: Any,
                  step: int, progress: Mapping[str, Any], jax_env: Any = None,
                  fields: Mapping[str, Any] | None = None) -> PolicyMember:
    """The member of an acting agent with `params`: its greedy policy, jitted."""
    spec = env_factory.spec()
    return PolicyMember(jax.jit(builder.make_policy(networks, evaluation=True)),
                        functools.partial(builder.initial_state, spec),
                        jax.device_get(params), step, progress, env_factory, jax_env,
                        fields or {})


def restore_learner(builder: Acting[Any], env_factory: EnvFactory, networks: Any,
                    learner: Learner | SearchLearner, wanted: Wanted, jax_env: Any = None,
                    fields: Mapping[str, Any] | None = None) -> PolicyMember:
    """The member whose params are a host learner's checkpoint (a gradient learner's on the
    host platforms, a population search's anywhere).

    Args:
      builder: the agent.
      env_factory: the run's envs.
      networks: the agent's networks for them.
      learner: the learner the agent makes of `networks` (its state is the checkpoint's
        structure).
      wanted: the run and the checkpoint.
      jax_env: the JAX env the policy plays in, if the run's envs are JAX envs.
      fields: more fields of the result.

    Raises:
      RestoreError, CheckpointError: see `restore_state`.
    """
    state, step, progress = restore_state(wanted.run_dir, learner.state, wanted.step)
    learner.restore(state)
    return policy_member(builder, env_factory, networks, learner.params, step, progress,
                         jax_env, fields)


def restore_search(builder: PopulationSearch, env_factory: EnvFactory, config: ExperimentConfig,
                   wanted: Wanted) -> Member:
    """A population search's member (`session.EXECUTIONS`' restore): its search state's mean
    (one search, not a population), in the run's JAX env or host envs.

    Raises:
      RestoreError, CheckpointError: see `restore_state`.
    """
    del config  # The search state holds all.
    spec = env_factory.spec()
    # `session.check_supported` runs population searches on single-agent envs only.
    assert isinstance(spec, EnvSpec), spec
    networks = builder.make_networks(spec)
    learner = builder.make_learner(networks, spec, jax.random.PRNGKey(0))
    if is_jax(env_factory):
        return restore_learner(builder, env_factory, networks, learner, wanted,
                               env_factory.make(), {"member": wanted.member})
    return restore_learner(builder, env_factory, networks, learner, wanted)
