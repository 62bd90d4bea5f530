"""Pieces every on-accelerator agent shares: torsos, the optimizer, the training state, the
data-parallel host shell that places a pure `update(state, batch)` on a device mesh, its
replay variant for off-policy agents, and the base of every builder.

Agents import from here instead of from each other, so no agent depends on another. A new
agent is its networks, losses and update, a learner made of `DataParallelLearner` (or
`ReplayLearner`) and a short `AgentBuilder` subclass (notebooks/custom_agent.ipynb).
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import chex
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis import reverb_tables as rt
from trellis.agents.replay import TransitionReplay
from trellis.builders.base import ArraySpec, Learner, Policy, QueueSpec
from trellis.builders.config import AgentConfig, ReplayConfig
from trellis.envs.specs import EnvSpec

# --- Networks -------------------------------------------------------------------------


class MLPTorso(nn.Module):
    """Tanh MLP on flattened vector observations."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, x):  # [..., D]
        x = x.reshape(x.shape[: x.ndim - 1] + (-1,)).astype(jnp.float32)
        for size in self.hidden_sizes:
            x = nn.tanh(nn.Dense(size)(x))
        return x


def _frames(x: jax.Array, channels_first: bool) -> jax.Array:
    """uint8 frames [..., H, W, C] or [..., C, H, W] as floats in [0, 1], [N, H, W, C]."""
    x = x.reshape((-1,) + x.shape[-3:]).astype(jnp.float32) / 255.0
    return jnp.moveaxis(x, 1, -1) if channels_first else x


class ConvTorso(nn.Module):
    """The small DQN-style conv torso for uint8 frames, [H, W, C] or [C, H, W]."""

    channels_first: bool = False
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x):  # [..., H, W, C] or [..., C, H, W]
        batch_shape = x.shape[:-3]
        x = _frames(x, self.channels_first)
        x = nn.relu(nn.Conv(16, (8, 8), strides=(4, 4))(x))
        x = nn.relu(nn.Conv(32, (4, 4), strides=(2, 2))(x))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden_size)(x))
        return x.reshape(batch_shape + (self.hidden_size,))


class ResidualBlock(nn.Module):
    """relu, conv 3x3, relu, conv 3x3, plus the input (Espeholt et al., 2018, Figure 3)."""

    @nn.compact
    def __call__(self, x):  # [N, H, W, C]
        channels = x.shape[-1]
        y = nn.Conv(channels, (3, 3))(nn.relu(x))
        y = nn.Conv(channels, (3, 3))(nn.relu(y))
        return x + y


class ImpalaResNetTorso(nn.Module):
    """The deep residual torso of the IMPALA paper (Espeholt et al., 2018, Figure 3, right).

    Three sections of conv 3x3 + max-pool 3x3 stride 2 + two residual blocks, with 16, 32
    and 32 channels, then relu and a Dense layer of `hidden_size` (256 in the paper), for
    uint8 frames [H, W, C] or [C, H, W].
    """

    channels_first: bool = False
    channels: Sequence[int] = (16, 32, 32)
    hidden_size: int = 256

    @nn.compact
    def __call__(self, x):  # [..., H, W, C] or [..., C, H, W]
        batch_shape = x.shape[:-3]
        x = _frames(x, self.channels_first)
        for channels in self.channels:
            x = nn.Conv(channels, (3, 3))(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = ResidualBlock()(x)
            x = ResidualBlock()(x)
        x = nn.relu(x).reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(self.hidden_size)(x))
        return x.reshape(batch_shape + (self.hidden_size,))


def channels_first(spec: EnvSpec) -> bool:
    """Whether pixel observations put channels first."""
    # Frames are wider than deep: ALE's vector env stacks [4, 84, 84], wrappers give HWC.
    return spec.observation_shape[0] < spec.observation_shape[-1]


def make_torso(spec: EnvSpec, hidden_sizes: Sequence[int]) -> nn.Module:
    """A conv torso for pixel observations, otherwise an MLP with `hidden_sizes`."""
    if spec.pixels:
        return ConvTorso(channels_first=channels_first(spec))
    return MLPTorso(tuple(hidden_sizes))


# --- Recurrent core -------------------------------------------------------------------

LSTMState = dict[str, jax.Array]  # {"c": [B, H], "h": [B, H]}: cell and hidden state.


def reset_where(first: jax.Array, state: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """`state` with the rows where `first` [B] is set replaced by zeros."""
    def reset(s):
        rows = first.reshape(first.shape + (1,) * (s.ndim - first.ndim))
        return jnp.where(rows, jnp.zeros_like(s), s)

    return {name: reset(s) for name, s in state.items()}


class _ResettingLSTMCell(nn.Module):
    """One LSTM step that first zeroes the rows of the carry where a new episode starts."""

    hidden_size: int

    @nn.compact
    def __call__(self, carry, inputs):
        x, first = inputs  # [B, D], [B]
        c, h = (reset_where(first, {"c": carry[0], "h": carry[1]})[k] for k in ("c", "h"))
        return nn.OptimizedLSTMCell(self.hidden_size)((c, h), x)


class LSTMCore(nn.Module):
    """An LSTM unrolled over time that restarts from zeros wherever `first` is set.

    Call: `core(state, x[T, B, D], first[T, B]) -> (new_state, y[T, B, hidden_size])`, with
    `state` = {"c": [B, H], "h": [B, H]} (`lstm_initial_state`; other keys are ignored and not
    returned) the state before step 0. Step t uses zeros instead of the carried state where
    `first[t]` is set, so an acting policy (T = 1 per call, carrying the state) and a learner
    unrolling [T, B] from the state recorded at step 0 compute the same outputs.
    """

    hidden_size: int

    @nn.compact
    def __call__(self, state: Mapping[str, jax.Array], x: jax.Array,
                 first: jax.Array) -> tuple[LSTMState, jax.Array]:
        scan = nn.scan(_ResettingLSTMCell, variable_broadcast="params",
                       split_rngs={"params": False}, in_axes=0, out_axes=0)
        (c, h), y = scan(self.hidden_size, name="lstm")((state["c"], state["h"]), (x, first))
        return {"c": c, "h": h}, y


def lstm_initial_state(num_slots: int, hidden_size: int) -> dict[str, np.ndarray]:
    """Zero LSTM state {"c", "h"} [num_slots, hidden_size], as `LSTMCore` resets to."""
    return {name: np.zeros((num_slots, hidden_size), np.float32) for name in ("c", "h")}


# --- Observation normalization --------------------------------------------------------

OBS_NORM = "obs_norm"  # The flax collection of the running moments, beside "params".


def initial_moments(shape: Sequence[int]) -> dict[str, jax.Array]:
    """Running moments {"count": [], "mean", "var": shape} of no data: mean 0 and variance 1,
    so normalizing with them leaves observations unchanged."""
    return {"count": jnp.zeros((), jnp.float32), "mean": jnp.zeros(shape, jnp.float32),
            "var": jnp.ones(shape, jnp.float32)}


def update_moments(moments: Mapping[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    """`moments` with the samples `x` [..., *shape] merged in (Chan et al., 1979, the parallel
    variance formula), so the result is the population mean and variance of all samples."""
    shape = moments["mean"].shape
    x = x.reshape((-1,) + shape).astype(jnp.float32)
    n_a, n_b = moments["count"], x.shape[0]
    n = n_a + n_b
    delta = jnp.mean(x, axis=0) - moments["mean"]
    m2 = moments["var"] * n_a + jnp.var(x, axis=0) * n_b + jnp.square(delta) * n_a * n_b / n
    return {"count": n, "mean": moments["mean"] + delta * n_b / n, "var": m2 / n}


class ObservationNormalizer(nn.Module):
    """(obs - mean) / sqrt(var + 1e-8), clipped to +-`clip`, with the moments held in the
    collection `OBS_NORM` (`initial_moments`), which the learner updates from its batches.

    The moments are inputs, not trained: no gradient flows into them.
    """

    shape: Sequence[int]
    clip: float = 10.0

    @nn.compact
    def __call__(self, x):  # [..., *shape]
        moments = {name: jax.lax.stop_gradient(self.variable(OBS_NORM, name, jnp.asarray, v).value)
                   for name, v in initial_moments(tuple(self.shape)).items()}
        z = (x.astype(jnp.float32) - moments["mean"]) * jax.lax.rsqrt(moments["var"] + 1e-8)
        return jnp.clip(z, -self.clip, self.clip)


# --- Distributions --------------------------------------------------------------------


def diagonal_gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    """log N(x; mean, diag(exp(log_std)^2)), summed over the last axis: [..., D] -> [...]."""
    z = (x - mean) * jnp.exp(-log_std)
    return -jnp.sum(0.5 * jnp.square(z) + log_std + 0.5 * math.log(2 * math.pi), axis=-1)


# --- Optimisation ---------------------------------------------------------------------


def make_optimizer(config: AgentConfig) -> optax.GradientTransformation:
    """Adam after global-norm gradient clipping, as `config` sets them.

    The learning rate is injected (`optax.inject_hyperparams`): it lives in the optimizer
    state as an array, so checkpoints keep it and `set_hparams` changes it without a
    recompilation. Adam's other settings stay constants of the compiled update.
    """
    adam = optax.inject_hyperparams(optax.adam, static_args=("b1", "b2", "eps", "eps_root"))
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        adam(learning_rate=config.learning_rate, eps=config.adam_eps),
    )


@flax.struct.dataclass
class TrainingState:
    params: Any
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array
    # Hyper-parameters the update reads from the state, not from its config (e.g.
    # entropy_cost): float32 scalars, so PBT and populations change them without recompiling.
    hparams: dict[str, jax.Array] = flax.struct.field(default_factory=dict)


def init_training_state(
    init_params: Callable[[jax.Array], Any],
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    hparams: Mapping[str, float] | None = None,
) -> TrainingState:
    """Fresh params and optimizer state; the rest of `key` becomes the state's own key.

    Args:
      init_params: `init_params(key) -> params`.
      optimizer: e.g. `make_optimizer(config)`.
      key: the learner's key.
      hparams: the hyper-parameters the update reads from `state.hparams`, with their
        initial values (from the config).
    """
    init_key, state_key = jax.random.split(key)
    params = init_params(init_key)
    return TrainingState(params, optimizer.init(params), state_key, jnp.zeros((), jnp.int32),
                         {name: jnp.asarray(v, jnp.float32) for name, v in (hparams or {}).items()})


@flax.struct.dataclass
class TargetNetworkState:
    """The training state of a value-based learner with a target network (DQN, R2D2)."""

    params: Any
    target_params: Any
    opt_state: optax.OptState
    key: jax.Array
    step: jax.Array  # SGD steps taken.


def init_target_network_state(init_params: Callable[[jax.Array], Any],
                              optimizer: optax.GradientTransformation,
                              key: jax.Array) -> TargetNetworkState:
    """Fresh online params, the target network a copy of them."""
    init_key, state_key = jax.random.split(key)
    params = init_params(init_key)
    return TargetNetworkState(params, params, optimizer.init(params), state_key,
                              jnp.zeros((), jnp.int32))


def importance_weights(probabilities: jax.Array, table_size: jax.Array,
                       exponent: float) -> jax.Array:
    """(N P(i))^-exponent, divided by the batch's largest so weights only scale down
    (Schaul et al., 2016, section 3.4): prioritized replay's correction.

    Args:
      probabilities: [B] probability with which each item was sampled.
      table_size: [B] N, the table's size when each was sampled.
      exponent: beta.

    Returns:
      [B] weights in (0, 1].
    """
    chex.assert_rank([probabilities, table_size], 1)
    weights = (table_size * probabilities) ** -exponent
    return weights / jnp.max(weights)


# --- Hyper-parameters in a training state ---------------------------------------------
#
# A state's hyper-parameters are the injected ones of its optimizer states (the learning
# rate; SAC's three optimizers share it) and its `hparams` field. They are arrays the jitted
# update reads, so these helpers work on any state, inside jit and vmap too.


def _is_injected(node: Any) -> bool:
    return isinstance(node, optax.InjectStatefulHyperparamsState)


def get_hparams(state: Any) -> dict[str, jax.Array]:
    """The hyper-parameters held by a training state: {name: scalar array}."""
    found: dict[str, jax.Array] = {}
    for node in jax.tree.leaves(state, is_leaf=_is_injected):
        if _is_injected(node):
            found.update(node.hyperparams)
    found.update(getattr(state, "hparams", {}))
    return found


def set_hparams(state: Any, values: Mapping[str, Any]) -> Any:
    """A copy of `state` with the hyper-parameters in `values` replaced (keeping their dtypes).

    Raises:
      ValueError: a name in `values` is not a hyper-parameter of `state`.
    """
    held = get_hparams(state)
    unknown = sorted(set(values) - set(held))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} not among this training state's "
                         f"hyper-parameters ({', '.join(sorted(held)) or 'none'})")

    def put(hparams: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        return {name: jnp.asarray(values[name], jnp.result_type(v)) if name in values else v
                for name, v in hparams.items()}

    state = jax.tree.map(
        lambda node: node._replace(hyperparams=put(node.hyperparams)) if _is_injected(node)
        else node, state, is_leaf=_is_injected)
    if isinstance(getattr(state, "hparams", None), dict):
        state = state.replace(hparams=put(state.hparams))
    return state


# --- Data-parallel host shell ---------------------------------------------------------

Batch = Mapping[str, jax.Array]  # Unrolls, time-major: each leaf [T+1, B, ...].
Update = Callable[[Any, Batch], tuple[Any, dict]]


class DataParallelLearner:
    """Owns a training state on a device mesh and runs a jitted `update` on host batches.

    Data parallel over `devices` (default: all local devices): axis 1 (B) of every batch
    leaf is sharded over the mesh axis "data", the state is replicated, and XLA inserts the
    gradient all-reduce. Agents subclass it with their own `init` and `update`.

    Args:
      init: `init(key) -> state`, jitted once (one compiled call instead of many small eager
        ops: seconds faster at start-up).
      make_update: `make_update(mesh) -> update(state, batch) -> (state, metrics)`; gets the
        mesh so an update may constrain the sharding of what it builds inside (minibatches).
      key: the learner's root key.
      batch_size: B; must divide evenly over the devices.
      devices: the learner devices.

    Raises:
      ValueError: `batch_size` does not divide over the devices.
    """

    def __init__(
        self,
        init: Callable[[jax.Array], Any],
        make_update: Callable[[Mesh], Update],
        key: jax.Array,
        batch_size: int,
        devices: Sequence[jax.Device] | None = None,
    ):
        devices = list(devices if devices is not None else jax.local_devices())
        if batch_size % len(devices):
            raise ValueError(
                f"batch_size={batch_size} must be divisible by the number of learner "
                f"devices ({len(devices)}) to shard the batch evenly."
            )
        self.mesh = Mesh(np.array(devices), ("data",))
        # The pure pieces, kept for the anakin platform (builders/anakin.py), which jits them
        # into its own act-and-learn program.
        self.init, self.make_update = init, make_update
        self._replicated = replicated = NamedSharding(self.mesh, PartitionSpec())
        self._batch_sharding = NamedSharding(self.mesh, PartitionSpec(None, "data"))
        self._key = key
        self._update = jax.jit(
            make_update(self.mesh),
            in_shardings=(replicated, self._batch_sharding),
            # No donation: inference may still be reading the params published last step.
            out_shardings=(replicated, replicated),
        )

    @functools.cached_property
    def _state(self) -> Any:
        # Made at first use: the anakin platform keeps only the pure pieces and never needs
        # it (a second or so of compiling at its start). Assignments replace it.
        return jax.jit(self.init, out_shardings=self._replicated)(self._key)

    def step(self, batch: Mapping[str, np.ndarray]) -> dict:
        """One update on a host batch; returns the metrics as device scalars."""
        batch = jax.device_put(dict(batch), self._batch_sharding)
        self._state, metrics = self._update(self._state, batch)
        return metrics

    @property
    def params(self):
        return self._state.params

    @property
    def state(self):
        """The whole training state (a pytree): what checkpoints save."""
        return self._state

    def restore(self, state) -> None:
        """Replaces the training state, e.g. with one read from a checkpoint, keeping this
        learner's hyper-parameters (`get_hparams`).

        Raises:
          ValueError: `state` is not structured like this learner's state.
        """
        expected, got = jax.tree.structure(self._state), jax.tree.structure(state)
        if expected != got:
            raise ValueError(f"cannot restore a learner state shaped {got}; expected {expected}")
        # The hyper-parameters stay this learner's (its config's): a resumed run's flags and
        # PBT's new values apply to the params, moments, key and step that `state` brings.
        state = set_hparams(state, get_hparams(self._state))
        self._state = jax.device_put(state, self._replicated)


class ReplayLearner(DataParallelLearner):
    """Host shell of an off-policy learner: unrolls in, replay, jitted SGD steps, priorities out.

    Each `step` turns the unrolls from inference into n-step transitions in an in-process
    table (`agents.replay.TransitionReplay`) and, once it holds `min_replay_size`, samples
    `updates_per_step` minibatches of `sample_batch_size` and runs the update on them in one
    jitted call. When the update returns `priorities` [U, S] they are written back, and new
    transitions enter at the largest priority so far, so each is sampled at least once soon
    (Schaul et al., 2016); a uniform selector ignores priorities. The table is not
    checkpointed: a resumed run refills it before learning again.

    Args:
      init: `init(key) -> state`, as for `DataParallelLearner`.
      make_update: `make_update(mesh) -> update(state, minibatches) -> (state, metrics)`, the
        minibatches as `TransitionReplay.sample` gives them, each leaf [U, S, ...].
      key: split into the learner's key and the table's sampling seed.
      config: the agent's replay settings.
      selector: how the table samples, e.g. `rt.Prioritized(0.6)` or `rt.Uniform()`.
      obs_spec, action_spec: (shape, dtype) of one observation and one action.
      devices: the learner devices.
    """

    def __init__(
        self,
        init: Callable[[jax.Array], Any],
        make_update: Callable[[Mesh], Update],
        key: jax.Array,
        config: ReplayConfig,
        selector: rt.Selector,
        obs_spec: tuple[tuple[int, ...], str],
        action_spec: tuple[tuple[int, ...], str],
        devices: Sequence[jax.Device] | None = None,
    ):
        self._config = config
        learner_key, table_key = jax.random.split(key)
        super().__init__(init=init, make_update=make_update, key=learner_key,
                         batch_size=config.sample_batch_size, devices=devices)
        self.replay = TransitionReplay(
            selector, config.replay_size, obs_spec, action_spec, config.n_step, config.discount,
            seed=int(jax.random.randint(table_key, (), 0, 2**31 - 1)))
        self._max_priority = 1.0

    def step(self, batch: Mapping[str, np.ndarray]) -> dict:
        """Inserts the unrolls' transitions, then learns once the table is large enough.

        Args:
          batch: unrolls {field: [T + 1, B, ...]} as recorded by inference.

        Returns:
          The update's metrics (device scalars) and `replay_size`; only `replay_size`
          before learning starts.
        """
        c = self._config
        size = self.replay.add(batch, self._max_priority)
        if size < c.min_replay_size:
            return {"replay_size": size}
        minibatches, keys = self.replay.sample(c.updates_per_step, c.sample_batch_size)
        metrics = dict(super().step(minibatches))
        if "priorities" in metrics:
            priorities = np.asarray(metrics.pop("priorities"), np.float64).reshape(-1)
            # An item drawn twice keeps its latest priority.
            self.replay.table.update_priorities(dict(zip(keys.tolist(), priorities.tolist(),
                                                         strict=True)))
            self._max_priority = max(self._max_priority, float(priorities.max()))
        metrics["replay_size"] = size
        return metrics


# --- Builder --------------------------------------------------------------------------


class AgentBuilder(abc.ABC):
    """What every builder shares (the contract is `builders.base.Builder`).

    A subclass writes `make_networks`, `make_policy` and `make_learner`, `extras_spec`
    when its policy records something beside the action, and `initial_state` when its policy
    is recurrent. Acting is SEED-style: the central
    inference server runs the policy and records the unrolls.

    Args:
      config: the agent's config; the queue spec comes from its `unroll_length`,
        `batch_size` and `max_queue_size`.
    """

    def __init__(self, config: AgentConfig):
        self.config = config

    def queue_spec(self) -> QueueSpec:
        c = self.config
        return QueueSpec(c.unroll_length, c.batch_size, c.max_queue_size)

    def extras_spec(self, spec: EnvSpec) -> dict[str, ArraySpec]:
        """What inference records per step beside the action: nothing, unless overridden."""
        del spec
        return {}

    def initial_state(self, spec: EnvSpec, num_slots: int) -> dict[str, np.ndarray]:
        """Every env slot's initial policy state: none ({}, feed-forward) unless overridden."""
        del spec, num_slots
        return {}

    def replay_table(self, signature: Mapping[str, ArraySpec]) -> rt.TableSpec | None:
        """The agent's own replay table: none (unrolls reach the learner in order) unless
        overridden (`builders.base.Builder.replay_table`)."""
        del signature
        return None

    @abc.abstractmethod
    def make_networks(self, spec: EnvSpec) -> Any:
        """The agent's networks for an env with `spec`."""

    @abc.abstractmethod
    def make_policy(self, networks: Any, evaluation: bool = False) -> Policy:
        """`policy(params, key, obs[N, ...], state, first[N]) -> (actions[N, ...], extras,
        new_state)` (`builders.base.Policy`)."""

    @abc.abstractmethod
    def make_learner(self, networks: Any, spec: EnvSpec, key: jax.Array) -> Learner:
        """The learner, owning the training state, seeded from `key`."""
