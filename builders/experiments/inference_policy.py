"""Central inference's policy call: the jitted policy on one padded batch of env slots.

A recurrent policy's state lives here, on the device, one row per env slot (SEED RL): the
jitted call that picks the actions also gathers the batch's rows and scatters the new state
back, so the state never visits the host on the way; the rows it started from come back on
the device, for the recorder to fetch when an unroll starts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import Policy, State, Tree
from trellis.builders.experiments.inference_slots import Request
from trellis.builders.experiments.step_format import StepFormat


def _act(policy: Policy, params: Any, key: jax.Array, count: np.uint32, obs: Tree,
         first: jax.Array) -> tuple[Tree, Mapping[str, Tree]]:
    """A feed-forward policy's step: nothing to gather or scatter.

    The step's key is `key` folded with the batch count, inside the jitted call: the key stays
    the same host array, so no key comes back with the actions, and every call takes inputs of
    the same kinds (a key out of a jitted call is committed to the device, a fresh one is not,
    and each kind compiles a program of its own).
    """
    actions, extras, _ = policy(params, jax.random.fold_in(key, count), obs, {}, first)
    return actions, extras


def _act_with_state(policy: Policy, params: Any, key: jax.Array, count: np.uint32, obs: Tree,
                    first: jax.Array, slots: jax.Array, state: State
                    ) -> tuple[Tree, Mapping[str, Tree], State, State]:
    """A stateful policy's step on the rows `slots` [N] of every slot's `state` [S, ...].

    Padding rows carry slot S (out of range): their gather reads some row (clipped) and
    their scatter is dropped. The key as in `_act`; returns the rows used too, for the
    recorder.
    """
    rows = {name: s.at[slots].get(mode="clip") for name, s in state.items()}
    actions, extras, new_rows = policy(params, jax.random.fold_in(key, count), obs, rows, first)
    state = {name: s.at[slots].set(new_rows[name], mode="drop") for name, s in state.items()}
    return actions, extras, state, rows


def _fetch(outputs: Tree, on_host: bool) -> Any:
    """`outputs` as numpy arrays. Arrays on a CPU device already are in host memory: there
    `jax.device_get`'s asynchronous copy of each leaf only costs (about 10 us of the serving
    thread per leaf, a quarter of its host work on CartPole, 2026-11-29); elsewhere every
    leaf's copy starts before the first is awaited, so the transfers overlap."""
    leaves, tree = jax.tree.flatten(outputs)
    if not on_host:
        for leaf in leaves:
            leaf.copy_to_host_async()
    return jax.tree.unflatten(tree, [np.asarray(leaf) for leaf in leaves])


def _reset_rows(state: State, initial: State, slots: jax.Array) -> State:
    """`state` with the rows `slots` back at their initial values."""
    return {name: s.at[slots].set(initial[name][slots]) for name, s in state.items()}


class BatchedPolicy:
    """The policy, jitted with its state's gather and scatter, on batches of env slots.

    Args:
      policy: `policy(params, key, obs[N], state, first[N]) -> (actions[N], extras,
        new_state)` (`builders.contract.agent.Policy`).
      key: RNG key; each batch's is this key folded with the batch count.
      step_format: what the workers send; the policy's `obs` is its `policy_obs`.
      initial_state: every slot's initial policy state {name: [num_workers * K, ...]}
        (`Builder.initial_state`); {} for a feed-forward policy.
      num_workers, envs_per_worker: the env slots (worker w's are rows w * K .. w * K + K - 1).
    """

    def __init__(self, policy: Policy, key: jax.Array, step_format: StepFormat,
                 initial_state: Mapping[str, np.ndarray], num_workers: int,
                 envs_per_worker: int):
        self._format = step_format
        self._key = jax.device_get(key)  # On the host, the same for every call (see `_act`).
        self._count = 0  # Batches served: folded into the key.
        self._num_workers = num_workers
        self._k = envs_per_worker
        self._on_host = jax.devices()[0].platform == "cpu"  # Where the policy's outputs are.
        # The state lives on the device; each step donates its buffers to the next.
        self._initial = {name: jax.device_put(v) for name, v in initial_state.items()}
        self._state = {name: v.copy() for name, v in self._initial.items()}
        self._slots = [np.arange(w * envs_per_worker, (w + 1) * envs_per_worker, dtype=np.int32)
                       for w in range(num_workers)]  # Each worker's rows of the state.
        self._act: jax.stages.Wrapped
        if self._state:
            self._act = jax.jit(functools.partial(_act_with_state, policy), donate_argnums=6)
            self._reset = jax.jit(_reset_rows, donate_argnums=0)
        else:
            self._act = jax.jit(functools.partial(_act, policy))

    def lower(self, params: Any, n: int) -> jax.stages.Lowered:
        """The policy lowered for a batch of n envs, with arguments of the kinds a batch's
        call passes (so the call runs the program compiled from it)."""
        obs = {name: spec.zeros((n,)) for name, spec in self._format.inputs.items()}
        args = (params, self._key, np.uint32(0), self._format.policy_obs(obs), obs["first"])
        if self._state:
            return self._act.lower(*args, np.zeros(n, np.int32), self._initial)
        return self._act.lower(*args)

    def act(self, params: Any, batch: Sequence[Request], is_new_run: Callable[[int, int], bool],
            obs: Tree, first: np.ndarray) -> tuple[Tree, Mapping[str, Tree], State | None]:
        """The policy on one padded batch of `batch`'s workers: (actions, extras) on the host
        (one transfer for both) and, for a stateful policy, the state rows it started from (on
        the device).

        A worker that starts a new run (`is_new_run(worker_id, run_id)`) gets its slots'
        state reset first.
        """
        count = np.uint32(self._count & 0xFFFFFFFF)  # Distinct keys for 2^32 batches.
        self._count += 1
        if not self._state:
            actions, extras = _fetch(self._act(params, self._key, count, obs, first),
                                     self._on_host)
            return actions, extras, None
        k = self._k
        slots = np.full(len(first), self._num_workers * k, np.int32)
        for i, request in enumerate(batch):
            worker_slots = self._slots[request.worker_id]
            slots[i * k:(i + 1) * k] = worker_slots
            if is_new_run(request.worker_id, request.run_id):
                self._state = self._reset(self._state, self._initial, worker_slots)
        actions, extras, self._state, rows = self._act(
            params, self._key, count, obs, first, slots, self._state)
        actions, extras = _fetch((actions, extras), self._on_host)
        return actions, extras, rows
