"""A run's trained policy out of its run directory: it acts, and it exports.

`rebuild` rebuilds a run's agent from its config.json, and `Rebuilt.member` restores the member
its agent's kind says (`session.restore_run_member`: a host learner's params, an anakin
population's member, an evolution strategy's mean); evaluate.py plays what it gives.
`load_policy` makes the member a `LoadedPolicy` (`trellis.load`): `policy(obs)` gives the
greedy action (or a sampled one), keeping a recurrent agent's state between calls, and
`policy.export(DIR)` writes
DIR/policy.jax, `jax.export`'s serialized function from a batch of observations to a batch of
greedy actions with the params inside, and DIR/spec.json, what the function takes and gives:
jax alone runs it (`jax.export.deserialize(open(DIR/policy.jax, "rb").read()).call(obs)`).
A self-play run's player is its search (`SearchPolicy`: AlphaZero's, from pgx's game states),
which is not exported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from trellis.builders.contract.agent import SELF_PLAY, Acting, Policy, State
from trellis.builders.experiments.restore import Member, PolicyMember, Wanted
from trellis.builders.experiments.self_play_run import MatchMember
from trellis.builders.experiments.session import restore_run_member
from trellis.envs.contract import EnvFactory
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep
from trellis.envs.specs import EnvSpec
from trellis.launch.flags import RunSettings, load_run
from trellis.launch.onnx_policy import ONNX_FILE, OnnxError, write_onnx

FUNCTION_FILE = "policy.jax"
SPEC_FILE = "spec.json"
# spec.json's `format`: a reader checks it before it reads the rest.
SPEC_FORMAT = "trellis.policy/1"

# act(params, key, obs, state, first) -> (actions, state): the policy on a batch of
# observations ({agent: obs} for a multi-agent env).
Act = Callable[[Any, jax.Array, Any, State, jax.Array], tuple[Any, State]]


class LoadError(ValueError):
    """A policy that cannot be loaded, called or exported as asked: one line."""


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """A run's agent and envs, rebuilt from the settings its config.json saved (no flags, no
    defaults re-parsed).

    Attributes:
      run_dir: the run directory.
      settings: the run's saved settings.
      builder: the run's agent.
      env_factory: the run's envs.
    """

    run_dir: str
    settings: RunSettings
    builder: Any
    env_factory: EnvFactory

    def member(self, step: int | None = None, member: int = 0,
               opponent: str | None = None) -> Member:
        """The run's member at checkpoint `step` (None: the newest), restored as its agent's
        kind says (`session.restore_run_member`); it plays.

        Args:
          step: the checkpoint's env steps; None: the newest.
          member: an anakin population's member.
          opponent: a self-play run's baseline (None: the run's own).

        Raises:
          builders.experiments.restore.RestoreError: the run has no checkpoints.
          builders.experiments.checkpointing.CheckpointError: no such checkpoint, or
            unreadable.
          builders.experiments.anakin_run.AnakinError: no such member.
        """
        options = self.settings.options
        wanted = Wanted(self.run_dir, options.platform, options.num_seeds, step, member,
                        opponent)
        return restore_run_member(self.builder, self.env_factory, self.settings.experiment,
                                  wanted)


def rebuild(run_dir: str) -> Rebuilt:
    """The run's agent and envs (`Rebuilt`).

    Raises:
      trellis.launch.flags.UsageError: no config.json, or invalid settings in it.
      ValueError: an extra the run needs is not installed.
    """
    settings = load_run(run_dir)
    builder, env_factory = settings.build()
    return Rebuilt(run_dir, settings, builder, env_factory)


def load_policy(run_dir: str, step: int | None = None, member: int = 0,
                seed: int = 0) -> LoadedPolicy | SearchPolicy:
    """The run's policy at checkpoint `step` (None: the newest): see `LoadedPolicy`; a
    self-play run's player is its search (`SearchPolicy`).

    Args:
      run_dir: the run directory.
      step: the checkpoint's env steps; None: the newest.
      member: an anakin population's member.
      seed: the key of sampled actions (and of a search's).

    Raises:
      LoadError: a self-play agent without a search that plays on its own.
      trellis.launch.flags.UsageError: no config.json, or invalid settings in it.
      ValueError: an extra the run needs is not installed.
      builders.experiments.restore.RestoreError: the run has no checkpoints.
      builders.experiments.checkpointing.CheckpointError: no such checkpoint, or unreadable.
      builders.experiments.anakin_run.AnakinError: no such member.
    """
    rebuilt = rebuild(run_dir)
    agent = rebuilt.settings.options.agent
    if rebuilt.builder.capabilities.learns_from == SELF_PLAY:
        if not isinstance(rebuilt.builder, SearchPlayerAgent):
            raise LoadError(f"{agent} gives no search that plays on its own "
                            "(make_search_player): `evaluate.py RUN_DIR` plays its games")
        return search_policy(rebuilt, step, seed)
    restored = rebuilt.member(step, member)
    # Every kind but self-play restores an acting policy's member (session.EXECUTIONS).
    assert isinstance(restored, PolicyMember), restored
    builder: Acting[Any] = rebuilt.builder
    spec = rebuilt.env_factory.spec()
    networks = builder.make_networks(spec)
    return LoadedPolicy(
        agent=agent, env_id=rebuilt.env_factory.env_id, spec=spec, step=restored.step,
        params=restored.params,
        greedy=acting(builder.make_policy(networks, evaluation=True), spec),
        sampled=acting(builder.make_policy(networks, evaluation=False), spec),
        initial_state=restored.initial_state, key=jax.random.PRNGKey(seed))


def acting(policy: Policy, spec: EnvSpec | MultiAgentSpec) -> Act:
    """`policy` on a batch of observations: for a multi-agent env, {agent: obs [N, ...]} made
    the step the policy takes (every agent acting, no rewards, zero global state)."""

    def act(params: Any, key: jax.Array, obs: Any, state: State, first: jax.Array
            ) -> tuple[Any, State]:
        inputs = multi_agent_step(spec, obs, first) if isinstance(spec, MultiAgentSpec) else obs
        actions, _, new_state = policy(params, key, inputs, state, first)
        return actions, new_state

    return act


def multi_agent_step(spec: MultiAgentSpec, obs: Mapping[str, jax.Array],
                     first: jax.Array) -> MultiAgentStep:
    """The step of N envs in which every agent of `spec` observes `obs[agent]` [N, ...]."""
    n = first.shape[0]
    no = {a: jnp.zeros(n, bool) for a in spec.agents}
    global_state = (None if spec.global_state_shape is None
                    else jnp.zeros((n, *spec.global_state_shape), jnp.float32))
    return MultiAgentStep({a: obs[a] for a in spec.agents},
                          {a: jnp.zeros(n, jnp.float32) for a in spec.agents}, no, no,
                          {a: jnp.ones(n, bool) for a in spec.agents}, first, global_state)


@dataclasses.dataclass(eq=False)
class LoadedPolicy:
    """A run's trained policy (`trellis.load(run_dir)`).

    `policy(obs)` is the greedy action for one observation, or the actions [N] for a batch
    [N, ...]; `policy(obs, sample=True)` samples the agent's exploring policy instead. A
    multi-agent env's observations are {agent: obs}, its actions {agent: action}. A recurrent
    agent's state (R2D2's LSTM) is kept from call to call, for the batch size of the first
    call after `reset()`: call `reset()` when an episode starts.

    Attributes:
      agent: the run's agent (--agent).
      env_id: the run's env.
      spec: the env's spec: what the policy observes and does.
      step: the checkpoint's env steps.
      params: the acting params.
      greedy: the greedy policy on a batch (`acting`), not jitted: what `export` traces.
      sampled: the exploring policy on a batch.
      initial_state: `initial_state(N)`, the policy's state for N envs ({}: feed-forward).
      key: the key of sampled actions.
    """

    agent: str
    env_id: str
    spec: EnvSpec | MultiAgentSpec
    step: int
    params: Any
    greedy: Act
    sampled: Act
    initial_state: Callable[[int], dict[str, np.ndarray]]
    key: jax.Array
    _state: State | None = dataclasses.field(default=None, init=False)
    _batch: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        self._jitted = {False: jax.jit(self.greedy), True: jax.jit(self.sampled)}

    @property
    def recurrent(self) -> bool:
        """The policy keeps a state from step to step."""
        return bool(self.initial_state(1))

    def reset(self) -> None:
        """Starts new episodes: the next call starts from the initial state."""
        self._state = None

    def __call__(self, obs: Any, *, sample: bool = False) -> Any:
        """The action for `obs` (one observation, or a batch [N, ...]; {agent: obs} for a
        multi-agent env): greedy, or sampled with `sample`.

        Raises:
          LoadError: `obs` is not of the env's observation shape (or a batch of them), or a
            multi-agent observation lacks an agent.
        """
        batch, batched = self._as_batch(obs)
        n = int(jax.tree.leaves(batch)[0].shape[0])
        first = self._state is None or n != self._batch
        if first:
            self._state = {k: jnp.asarray(v) for k, v in self.initial_state(n).items()}
            self._batch = n
        assert self._state is not None
        self.key, key = jax.random.split(self.key)
        actions, self._state = self._jitted[sample](self.params, key, batch, self._state,
                                                    jnp.full(n, first))
        actions = jax.tree.map(np.asarray, actions)
        return actions if batched else jax.tree.map(lambda a: a[0], actions)

    def _as_batch(self, obs: Any) -> tuple[Any, bool]:
        """`obs` as a batch of the spec's dtype, and whether it was one."""
        if isinstance(self.spec, MultiAgentSpec):
            if not isinstance(obs, Mapping) or set(self.spec.agents) - set(obs):
                raise LoadError(f"a multi-agent policy observes {{agent: obs}} for the agents "
                                f"{list(self.spec.agents)}, got {_described(obs)}")
            arrays = {a: self._observation(self.spec.specs[a], obs[a]) for a in self.spec.agents}
            batched = arrays[self.spec.agents[0]][1]
            return {a: x for a, (x, _) in arrays.items()}, batched
        return self._observation(self.spec, obs)

    def _observation(self, spec: EnvSpec, obs: Any) -> tuple[jax.Array, bool]:
        x = np.asarray(obs, spec.observation_dtype)
        if x.shape == spec.observation_shape:
            return jnp.asarray(x)[None], False
        if x.shape[1:] == spec.observation_shape:
            return jnp.asarray(x), True
        raise LoadError(f"{self.env_id}'s observations are of shape {spec.observation_shape} "
                        f"(or a batch [N, *shape]), got {x.shape}")

    def export(self, directory: str, *, force: bool = False, onnx: bool = False) -> str:
        """Writes DIRECTORY/policy.jax and DIRECTORY/spec.json (see the module docstring), and
        with `onnx` DIRECTORY/policy.onnx (launch/onnx_policy.py: the `onnx` extra).

        The function takes a batch of observations of any size (for a multi-agent env,
        {agent: obs [N, ...]}) and gives the greedy actions; a recurrent policy's takes and
        gives its state too: `(obs, state, first) -> (actions, state)`, `first` [N] true on an
        episode's first step (spec.json names the state's arrays, zeros at the start).

        Args:
          directory: created if missing.
          force: overwrite the files of an earlier export.
          onnx: also write the greedy policy as ONNX (a feed-forward policy of a single-agent
            env only).

        Returns:
          The path of policy.jax.

        Raises:
          LoadError: the files exist and `force` is false; `onnx` for a recurrent or
            multi-agent policy, or one jax2onnx cannot convert (or jax2onnx is missing).
        """
        function_path = os.path.join(directory, FUNCTION_FILE)
        spec_path = os.path.join(directory, SPEC_FILE)
        onnx_path = os.path.join(directory, ONNX_FILE)
        existing = [p for p in (function_path, spec_path, *([onnx_path] if onnx else []))
                    if os.path.exists(p)]
        if existing and not force:
            raise LoadError(f"{existing[0]} exists: export elsewhere, or overwrite it with "
                            "force=True (--force)")
        if onnx and (self.recurrent or isinstance(self.spec, MultiAgentSpec)):
            raise LoadError(f"ONNX export takes a feed-forward policy of a single-agent env; "
                            f"{self.agent}'s on {self.env_id} is "
                            f"{'recurrent' if self.recurrent else 'multi-agent'} "
                            "(policy.jax exports it)")
        exported = jax.export.export(jax.jit(self._exported_function()),
                                     platforms=_platforms())(*self._exported_arguments())
        os.makedirs(directory, exist_ok=True)
        if onnx:  # First: a policy it cannot convert leaves no files behind.
            assert isinstance(self.spec, EnvSpec)
            try:
                write_onnx(self._exported_function(), self.spec, onnx_path)
            except OnnxError as e:
                raise LoadError(f"{self.agent}'s policy: {e}") from e
        with open(function_path, "wb") as f:
            f.write(exported.serialize())
        with open(spec_path, "w") as f:
            json.dump(self.export_spec(), f, indent=2)
            f.write("\n")
        return function_path

    def _exported_function(self) -> Callable[..., Any]:
        """The greedy policy with the params and a key inside: obs -> actions, or (obs, state,
        first) -> (actions, state) for a recurrent policy."""
        params = jax.device_get(self.params)
        key = jax.random.PRNGKey(0)  # Unused by greedy policies; a constant in the function.

        def recurrent(obs: Any, state: State, first: jax.Array) -> tuple[Any, State]:
            return self.greedy(params, key, obs, state, first)

        def feed_forward(obs: Any) -> Any:
            n = jax.tree.leaves(obs)[0].shape[0]
            return self.greedy(params, key, obs, {}, jnp.ones(n, bool))[0]

        return recurrent if self.recurrent else feed_forward

    def _exported_arguments(self) -> tuple[Any, ...]:
        """The function's arguments' shapes and dtypes, the batch axis of symbolic size."""
        (n,) = jax.export.symbolic_shape("batch")
        if isinstance(self.spec, MultiAgentSpec):
            obs: Any = {a: jax.ShapeDtypeStruct((n, *s.observation_shape), s.observation_dtype)
                        for a, s in self.spec.specs.items()}
        else:
            obs = jax.ShapeDtypeStruct((n, *self.spec.observation_shape),
                                       self.spec.observation_dtype)
        if not self.recurrent:
            return (obs,)
        state = {k: jax.ShapeDtypeStruct((n, *v.shape[1:]), v.dtype)
                 for k, v in self.initial_state(1).items()}
        return obs, state, jax.ShapeDtypeStruct((n,), bool)

    def export_spec(self) -> dict[str, Any]:
        """spec.json's content: what the exported function takes and gives, and where it
        runs."""
        if isinstance(self.spec, MultiAgentSpec):
            observation: Any = {a: _observation_spec(s) for a, s in self.spec.specs.items()}
            action: Any = {a: _action_spec(s) for a, s in self.spec.specs.items()}
        else:
            observation, action = _observation_spec(self.spec), _action_spec(self.spec)
        spec: dict[str, Any] = {
            "format": SPEC_FORMAT, "agent": self.agent, "env": self.env_id,
            "checkpoint_env_steps": self.step, "multi_agent": isinstance(self.spec,
                                                                         MultiAgentSpec),
            "observation": observation, "action": action, "batch_axis": 0,
            "recurrent": self.recurrent, "platforms": list(_platforms()),
            "call": ("(obs, state, first) -> (actions, state)" if self.recurrent
                     else "obs -> actions"),
        }
        if self.recurrent:
            spec["state"] = {k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype)}
                             for k, v in self.initial_state(1).items()}
        return spec


def _platforms() -> tuple[str, ...]:
    """Where the exported function runs: this machine's backend, and the CPU everywhere."""
    return tuple(sorted({jax.default_backend(), "cpu"}))


def _observation_spec(spec: EnvSpec) -> dict[str, Any]:
    return {"shape": list(spec.observation_shape), "dtype": spec.observation_dtype}


def _action_spec(spec: EnvSpec) -> dict[str, Any]:
    action: dict[str, Any] = {"discrete": spec.discrete, "shape": list(spec.action_shape),
                              "dtype": spec.action_dtype}
    if spec.discrete:
        action["num_actions"] = spec.num_actions
    else:
        action.update(low=list(spec.action_low or ()), high=list(spec.action_high or ()))
    return action


def _described(obs: Any) -> str:
    return f"keys {sorted(obs)}" if isinstance(obs, Mapping) else type(obs).__name__


# player(key, games) -> actions: a search from a batch of game states.
Player = Callable[[jax.Array, Any], jax.Array]


@runtime_checkable
class SearchPlayerAgent(Protocol):
    """A self-play agent whose search plays on its own, without exploration (AlphaZero)."""

    def make_search_player(self, networks: Any, env: Any, params: Any) -> Player: ...


def search_policy(rebuilt: Rebuilt, step: int | None, seed: int) -> SearchPolicy:
    """A self-play run's search with the params of checkpoint `step`."""
    restored = rebuilt.member(step)
    assert isinstance(restored, MatchMember), restored  # session.EXECUTIONS' self-play.
    program = restored.program
    builder: SearchPlayerAgent = rebuilt.builder
    return SearchPolicy(
        agent=rebuilt.settings.options.agent, env_id=rebuilt.env_factory.env_id,
        step=restored.step, env=program.env,
        player=jax.jit(builder.make_search_player(program.networks, program.env,
                                                  restored.params)),
        key=jax.random.PRNGKey(seed))


@dataclasses.dataclass(eq=False)
class SearchPolicy:
    """A self-play run's player (`trellis.load` of an AlphaZero run): `policy(state)` searches
    from a game's state (pgx's `State`: one, or a batch made with `jax.vmap(env.init)`) with
    the checkpoint's network, without exploration noise, and gives its move (or moves [N]).

    Attributes:
      agent: the run's agent.
      env_id: the run's game.
      step: the checkpoint's env steps (moves).
      env: the game (pgx's `Env`: `env.init(key)`, `env.step(state, action)`).
      player: `player(key, states) -> actions`, jitted.
      key: the searches' key.
    """

    agent: str
    env_id: str
    step: int
    env: Any
    player: Player
    key: jax.Array

    def __call__(self, state: Any) -> Any:
        """The search's move from `state` (one game state or a batch)."""
        batched = jnp.ndim(state.current_player) == 1
        states = state if batched else jax.tree.map(lambda x: jnp.asarray(x)[None], state)
        self.key, key = jax.random.split(self.key)
        actions = np.asarray(self.player(key, states))
        return actions if batched else actions[0]

    def export(self, directory: str, *, force: bool = False, onnx: bool = False) -> NoReturn:
        """Refused: a search runs the game's own model (pgx) inside; what `export` writes is a
        function of observations.

        Raises:
          LoadError: always.
        """
        del directory, force, onnx
        raise LoadError(f"{self.agent}'s player is a tree search that steps the game's own "
                        "model: export writes policies of observations (the other agents')")
