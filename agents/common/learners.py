"""The host shells of the pure update: `DataParallelLearner` (a device mesh) and its off-policy
variant `ReplayLearner` (n-step transitions replayed in-process)."""


from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trellis import reverb_tables as rt
from trellis.agents.common.params import Params
from trellis.agents.common.replay import TransitionReplay
from trellis.agents.common.training import get_hparams, set_hparams
from trellis.builders.contract.agent import Training, init_device
from trellis.builders.contract.config import ReplayConfig

# `ReplayLearner.save_replay`'s layout: the table client's checkpoint, and the learner's own.
_REPLAY_TABLES = "tables"
_REPLAY_LEARNER = "learner.json"

Batch = Mapping[str, jax.Array]  # Unrolls, time-major: each leaf [T+1, B, ...].
# A learner step's metrics: device scalars, and host counts (`ReplayLearner`'s replay_size).
Metrics = Mapping[str, jax.Array | int]


# The init runs once, on the start-up's critical path (the first env step waits for its
# params), so it is compiled for start-up: on the host's CPU backend whatever the learner's
# devices (on an H100, XLA compiled Pong's init, the deep residual torso and Adam's state, for
# 9-13 s, autotuning GPU kernels it would run once; docs/benchmarks.md), and at XLA's backend
# optimisation level 1 instead of the default 3 (the deep residual torso's init in 1.8 s
# instead of 3.7 on a 2-core CPU, MinAtar's torso 0.7 s instead of 1.9) with the same state,
# bit for bit (tests/test_impala_learner.py); level 0 would change the state's last bits.
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}


class DataParallelLearner:
    """Owns a training state on a device mesh and runs a jitted `update` on host batches.

    Data parallel over `devices` (default: every device JAX sees): axis 1 (B) of every batch
    leaf is sharded over the mesh axis "data", the state is replicated, and XLA inserts the
    gradient all-reduce. It runs any agent's `Training` (`Builder.make_training`).

    Across processes (a `jax.distributed` group, builders/experiments/distributed.py) the mesh
    spans every process's devices: each process runs the same updates on its own share of
    the global batch, the batches that `place`, `step` and `compile` take being that share
    (B / processes unrolls, stacked in process order into the global batch), and `state` and
    `params` are this process's copy of the replicated state.

    Args:
      training: the agent's pure pieces; `init` is jitted once (one compiled call instead of
        many small eager ops: seconds faster at start-up), `make_update` gets this learner's
        mesh so an update may constrain the sharding of what it builds (minibatches).
      key: the learner's root key.
      batch_size: B, the global batch; must divide evenly over the devices.
      devices: the learner devices, of this process and (under `jax.distributed`) others.

    Raises:
      ValueError: `batch_size` does not divide over the devices.
    """

    def __init__(
        self,
        training: Training,
        key: jax.Array,
        batch_size: int,
        devices: Sequence[jax.Device] | None = None,
    ):
        devices = list(devices if devices is not None else jax.devices())
        if batch_size % len(devices):
            raise ValueError(
                f"batch_size={batch_size} must be divisible by the number of learner "
                f"devices ({len(devices)}) to shard the batch evenly."
            )
        self.mesh = Mesh(np.array(devices), ("data",))
        self._init = training.init
        self._acting_params = training.acting_params
        self._replicated = replicated = NamedSharding(self.mesh, PartitionSpec())
        self._batch_sharding = NamedSharding(self.mesh, PartitionSpec(None, "data"))
        self._key = key
        # Processes whose devices the mesh holds: each gives its share of every batch.
        self._processes = len({d.process_index for d in devices})
        # A batch placed by a jitted identity: jit's own dispatch moves its host arrays in
        # C++, where `jax.device_put` walked IMPALA's 8 leaves in Python (25 us against
        # 200 us of the prefetch thread per batch on 2 cores, 2026-11-29). Not donated: on a
        # CPU device the input may be the host arrays' own memory, and with jax 0.4.34 (the
        # dm-reverb environment) donating it fed IMPALA's first updates garbage (mean_rho=inf,
        # NaN logits at acting) in most runs on one core.
        self._place = jax.jit(lambda batch: batch, in_shardings=self._batch_sharding,
                              out_shardings=self._batch_sharding)
        self._update = jax.jit(
            training.make_update(self.mesh),
            in_shardings=(replicated, self._batch_sharding),
            # No donation: inference may still be reading the params published last step.
            out_shardings=(replicated, replicated),
        )

    @functools.cached_property
    def _state(self) -> Any:
        # Made at first use (a second or so of compiling), so a learner that restores a
        # checkpoint first does not pay for it twice. Assignments replace it.
        key = jax.device_put(self._key, init_device(self.mesh.devices.flat))
        # jax annotates compiler options as str or bool, but XLA takes this level as an int
        # (the default 3 is one): jax hands the values to XLA unchanged.
        init = jax.jit(self._init).lower(key).compile(
            compiler_options=INIT_COMPILER_OPTIONS)  # type: ignore[arg-type]
        return self._to_mesh(init(key), self._replicated)

    def _to_mesh(self, tree: Any, sharding: NamedSharding) -> Any:
        """`tree`, this process's part of global arrays, placed on the mesh with `sharding`.

        Leaves placed so already are kept: the learning-rate schedule replaces one factor of
        the state, and putting every leaf again took 3 ms of Python per replacement on 2
        cores (a sixth of IMPALA's learner thread on CartPole, 2026-11-29).
        """
        leaves, structure = jax.tree.flatten(tree)
        moved = [i for i, x in enumerate(leaves)
                 if not (isinstance(x, jax.Array) and x.sharding == sharding)]
        if self._processes == 1:
            placed = jax.device_put([leaves[i] for i in moved], sharding)
        else:
            # A mesh across processes: each places its part on its own devices (no transfer
            # between processes); a replicated array's part is the whole array.
            placed = [jax.make_array_from_process_local_data(sharding, np.asarray(leaves[i]))
                      for i in moved]
        for i, x in zip(moved, placed, strict=True):
            leaves[i] = x
        return jax.tree.unflatten(structure, leaves)

    def _local(self, tree: Any) -> Any:
        """This process's copy of replicated global arrays (`tree` as it is on one process)."""
        if self._processes == 1:
            return tree
        return jax.tree.map(lambda x: x.addressable_data(0), tree)

    def compile(self, batch: Mapping[str, Any]) -> None:
        """Compiles the update for batches shaped as `batch` (a tree of
        `jax.ShapeDtypeStruct`, this process's share); the state's shapes come from `init`
        without running it."""
        def placed(sharding: NamedSharding, share: int = 1
                   ) -> Callable[[Any], jax.ShapeDtypeStruct]:
            # `share`: the processes whose shares of axis 1 the global batch stacks.
            return lambda x: jax.ShapeDtypeStruct(
                x.shape[:1] + tuple(n * share for n in x.shape[1:2]) + x.shape[2:], x.dtype,
                sharding=sharding)

        state = jax.tree.map(placed(self._replicated), jax.eval_shape(self._init, self._key))
        self._update.lower(state, jax.tree.map(placed(self._batch_sharding, self._processes),
                                               batch)).compile()

    def place(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """`batch` on the learner's devices, sharded as `step` takes it (the learner node
        places the next batch while the current update runs)."""
        placed: dict[str, Any] = (self._to_mesh(dict(batch), self._batch_sharding)
                                  if self._processes > 1 else self._place(dict(batch)))
        return placed

    def step(self, batch: Mapping[str, Any]) -> Metrics:
        """One update on a batch, on the host or `place`d; returns the metrics as device
        scalars (this process's copy)."""
        if not all(isinstance(x, jax.Array) and x.sharding == self._batch_sharding
                   for x in jax.tree.leaves(batch)):
            # Not `place`d. Once placed, device_put would change nothing and still take
            # 0.4 ms of Python for IMPALA's 8 fields (2 cores): a tenth of the learner thread.
            batch = self._to_mesh(dict(batch), self._batch_sharding)
        metrics: dict[str, jax.Array]
        self._state, metrics = self._update(self._state, batch)
        local: Metrics = self._local(metrics)
        return local

    @property
    def params(self) -> Params:
        """What the acting policy reads (`Training.acting_params`), this process's copy."""
        return self._local(self._acting_params(self._state))

    @property
    def state(self) -> Any:
        """The whole training state (a pytree), this process's copy: what checkpoints save.

        On a mesh across processes, host (numpy) arrays: orbax, saving from one process of
        several, refuses device arrays that are not global.
        """
        if self._processes == 1:
            return self._state
        return jax.device_get(self._local(self._state))

    def restore(self, state: Any) -> None:
        """Replaces the training state, e.g. with one read from a checkpoint, keeping this
        learner's hyper-parameters (`get_hparams`).

        Raises:
          ValueError: `state` is not structured like this learner's state.
        """
        expected, got = jax.tree.structure(self._state), jax.tree.structure(state)
        # jaxlib's PyTreeDef is not resolved by mypy (no stub for it): its `!=` looks unsupported.
        if expected != got:  # type: ignore[operator]
            raise ValueError(f"cannot restore a learner state shaped {got}; expected {expected}")
        # The hyper-parameters stay this learner's (its config's): a resumed run's flags and
        # PBT's new values apply to the params, moments, key and step that `state` brings.
        state = set_hparams(state, get_hparams(self.state))
        self._state = self._to_mesh(state, self._replicated)


class ReplayLearner(DataParallelLearner):
    """Host shell of an off-policy learner: unrolls in, replay, jitted SGD steps, priorities out.

    Each `step` turns the unrolls from inference into n-step transitions in an in-process
    table (`agents.replay.TransitionReplay`) and, once it holds `min_replay_size`, samples
    `updates_per_step` minibatches of `sample_batch_size` and runs the update on them in one
    jitted call: once per step, or with `replay_ratio` as many calls as the step's env steps
    owe (ratio x env steps, the remainder carried to the next step), so the SGD steps per env
    step hold whatever the batch's size. When the env workers outrun the learner its batches
    grow (the learner batch follows the arrival rate) and so do its calls, while the bounded
    unroll queue holds the workers back; when they lag, the learner waits for unrolls. When
    the update returns `priorities` [U, S] they are written back, and new transitions enter at
    the largest priority so far, so each is sampled at least once soon
    (Schaul et al., 2016); a uniform selector ignores priorities. The table is saved beside
    a session's final checkpoint (`save_replay`, the contract's `KeepsReplay`) and restored
    when the run resumes from it; resumed from a periodic checkpoint, it refills first.

    Args:
      training: as for `DataParallelLearner`; its update takes the minibatches as
        `TransitionReplay.sample` gives them, each leaf [U, S, ...].
      key: split into the learner's key and the table's sampling seed.
      config: the agent's replay settings.
      selector: how the table samples, e.g. `rt.Prioritized(0.6)` or `rt.Uniform()`.
      obs_spec, action_spec: (shape, dtype) of one observation and one action.
      devices: the learner devices.
    """

    def __init__(
        self,
        training: Training,
        key: jax.Array,
        config: ReplayConfig,
        selector: rt.Selector,
        obs_spec: tuple[tuple[int, ...], str],
        action_spec: tuple[tuple[int, ...], str],
        devices: Sequence[jax.Device] | None = None,
    ):
        self._config = config
        learner_key, table_key = jax.random.split(key)
        super().__init__(training, learner_key, config.sample_batch_size, devices)
        self.replay = TransitionReplay(
            selector, config.replay_size, obs_spec, action_spec, config.n_step, config.discount,
            seed=int(jax.random.randint(table_key, (), 0, 2**31 - 1)))
        self._max_priority = 1.0
        self._owed = 0.0  # SGD steps the env steps learned from owe (with replay_ratio).
        self._sgd_steps = 0

    def save_replay(self, directory: str) -> int:
        """Writes the table and the priority new items enter at into `directory`."""
        self.replay.client.checkpoint(os.path.join(directory, _REPLAY_TABLES))
        with open(os.path.join(directory, _REPLAY_LEARNER), "w") as f:
            json.dump({"max_priority": self._max_priority}, f)
        return len(self.replay.table)

    def restore_replay(self, directory: str) -> int:
        """Reads what `save_replay` wrote to `directory` into the table.

        Raises:
          ValueError: the saved table's spec is not this learner's (nothing is changed).
        """
        self.replay.client.restore(os.path.join(directory, _REPLAY_TABLES))
        with open(os.path.join(directory, _REPLAY_LEARNER)) as f:
            self._max_priority = float(json.load(f)["max_priority"])
        return len(self.replay.table)

    def place(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch as it is: its unrolls go into the host table first."""
        return dict(batch)

    def compile(self, batch: Mapping[str, Any]) -> None:
        """Compiles the update for the minibatches it samples, whatever the unrolls' shapes
        (`batch`), so the first update after the table fills does not wait for it."""
        del batch
        c = self._config
        super().compile(self.replay.sample_shapes(c.updates_per_step, c.sample_batch_size))

    def step(self, batch: Mapping[str, np.ndarray]) -> Metrics:
        """Inserts the unrolls' transitions, then learns once the table is large enough.

        Args:
          batch: unrolls {field: [T + 1, B, ...]} as recorded by inference.

        Returns:
          The last update's metrics (device scalars), `replay_size` and `sgd_steps` (all
          this learner's SGD steps so far); without an update (the table still filling, or
          with `replay_ratio` fewer steps owed than one call's) only those two.
        """
        c = self._config
        size = self.replay.add(batch, self._max_priority)
        counts: Metrics = {"replay_size": size}
        if size < c.min_replay_size:
            return {**counts, "sgd_steps": self._sgd_steps}
        metrics: Metrics = {}
        for _ in range(self._calls(batch)):
            metrics = self._update_once()
        return {**metrics, **counts, "sgd_steps": self._sgd_steps}

    def _calls(self, batch: Mapping[str, np.ndarray]) -> int:
        """Calls of the update (`updates_per_step` SGD steps each) that `batch` earns."""
        c = self._config
        if c.replay_ratio is None:
            return 1
        first = batch["first"]  # [T + 1, B]
        self._owed += c.replay_ratio * (first.shape[0] - 1) * first.shape[1]
        calls = int(self._owed // c.updates_per_step)
        self._owed -= calls * c.updates_per_step
        return calls

    def _update_once(self) -> Metrics:
        """One jitted call: `updates_per_step` SGD steps on fresh samples, priorities written
        back."""
        c = self._config
        minibatches, keys = self.replay.sample(c.updates_per_step, c.sample_batch_size)
        metrics = dict(super().step(minibatches))
        self._sgd_steps += c.updates_per_step
        if "priorities" in metrics:
            priorities = np.asarray(metrics.pop("priorities"), np.float64).reshape(-1)
            # An item drawn twice keeps its latest priority.
            self.replay.table.update_priorities(dict(zip(keys.tolist(), priorities.tolist(),
                                                         strict=True)))
            self._max_priority = max(self._max_priority, float(priorities.max()))
        return metrics
