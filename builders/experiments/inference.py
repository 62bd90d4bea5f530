"""SEED-style central inference: dynamic batching over env workers, unrolls kept here.

Every env worker sends the K observations of its envs and waits for K actions: through its
shared-memory slots when it runs on this host (`launch.shm`, see `env_worker.shm_step`),
through the `step` RPC otherwise. The serving thread waits on both at once, gathers requests
until `max_batch` envs are waiting or `timeout_s` has passed since the first one, copies their
inputs into one preallocated batch, runs the jitted policy once on it, and replies to each
worker with its slice before anything else, so the workers step their envs while this thread
records: what the policy saw and did is written into per-worker unroll buffers on this side
(env workers stay stateless); each full unroll of T + 1 steps goes to the learner through
`on_unroll`, with the version of the params that acted at each of its steps (the learner
updates they had seen, `set_params`), from which the learner measures its policy lag.

A recurrent policy's state lives here too, on the device, one row per env slot (SEED RL): the
jitted call that picks the actions also gathers the batch's rows and scatters the new state
back, so the state never visits the host on the way; it is fetched only when an unroll
starts, to be recorded with it.

Multi-agent envs (envs/multi_agent.py) go through the same batch: a worker's step is the named
fields of `step_format.StepFormat` (`obs/<agent>`, ..., `first`), the policy gets them as one
`MultiAgentStep` of {agent: [N, ...]} and answers {agent: [N, ...]} actions; a multi-agent
agent's policy acts for each of its policies on that policy's agents stacked as extra rows
(builders/contract/policy_mapping.py), so every policy runs once per batch, and its recurrent
state, if any, is a row per env slot holding every agent's.

The server is its serving loop over four parts, each with one job: the workers' slots and
requests (`inference_slots.WorkerSlots`: the shared-memory hub and the RPC path), the batching
(`inference_batching.Batching`: which requests make a batch, padded to a compiled size), the
policy call (`inference_policy.BatchedPolicy`: the jitted policy and the state on the device)
and the recorder (`unroll_recorder.UnrollRecorder`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import ArraySpec, Builder, Policy
from trellis.builders.experiments.inference_batching import Batching
from trellis.builders.experiments.inference_policy import BatchedPolicy
from trellis.builders.experiments.inference_slots import Episodes, OnSteps, Request, WorkerSlots
from trellis.builders.experiments.step_format import StepFormat, step_format, step_specs
from trellis.builders.experiments.unroll_recorder import OnUnroll, UnrollRecorder
from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec
from trellis.launch.runtime.node_context import StopEvent


def agent_step_specs(builder: Builder[Any], spec: EnvSpec | MultiAgentSpec
                     ) -> dict[str, ArraySpec]:
    """`step_specs` of `builder`'s agent on envs of `spec`, its state's shapes traced
    (`jax.eval_shape`), not computed: the launcher builds programs with these, and computing
    the state there would start a JAX backend in the launcher process (on a GPU, a CUDA
    context holding XLA's preallocated share of the GPU's memory for the whole run)."""
    initial_state = jax.eval_shape(lambda: builder.initial_state(spec, 1))
    return step_specs(spec, builder.extras_spec(spec), initial_state)


@dataclasses.dataclass(frozen=True)
class ServedPolicy:
    """The policy a server runs, and what it serves and records of each step.

    Attributes:
      policy: `policy(params, key, obs[N], state, first[N]) -> (actions[N], extras,
        new_state)` (`builders.contract.agent.Policy`); jitted by the server, with the state's
        gather and scatter.
      params: the initial params (`InferenceServer.set_params` replaces them).
      key: RNG key; each batch's is this key folded with the batch count.
      spec: the envs' spec: what the workers send and get back is its `step_format`
        (multi-agent, the policy's `obs` is the step's `MultiAgentStep` and its actions
        {agent: [N, ...]}).
      extras: what the policy records beside its actions (`Builder.extras_spec`).
      initial_state: every slot's initial policy state {name: [num_workers * K, ...]}
        (`Builder.initial_state`); {} for a feed-forward policy.
    """

    policy: Policy
    params: Any
    key: jax.Array
    spec: EnvSpec | MultiAgentSpec
    extras: Mapping[str, Any]
    initial_state: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def step_format(self) -> StepFormat:
        return step_format(self.spec)

    @property
    def recorded(self) -> dict[str, ArraySpec]:
        """The recorded fields of a step (`step_specs`)."""
        return step_specs(self.spec, self.extras, self.initial_state)


@dataclasses.dataclass(frozen=True)
class InferenceSettings:
    """The env slots a server serves, and how it batches and records their steps.

    Attributes:
      num_workers, envs_per_worker: the env slots served (worker_id in [0, num_workers)).
      unroll_length: T.
      overlap: steps repeated between consecutive unrolls (`QueueSpec.overlap`).
      max_batch: envs per policy call at most (None: all of them).
      timeout_s: how long a batch waits for more workers after its first request.
      shared_memory: serve the workers on this host through shared slots (a
        `launch.shm.Hub`) beside the `step` RPC; False: the `step` RPC only.
    """

    num_workers: int
    envs_per_worker: int
    unroll_length: int
    overlap: int = 1
    max_batch: int | None = None
    timeout_s: float = 0.002
    shared_memory: bool = False


class InferenceServer:
    """Batches policy calls from many env workers and records their unrolls.

    Args:
      served: the policy and the step it serves.
      settings: the env slots, the batching, the unrolls.
      on_unroll: receives each full unroll {field: [T + 1, K, ...]} and the params version
        of each of its steps [T + 1]; may block (back-pressure).
      stop: an event; once set, pending and new requests get `None` instead of actions.
      on_steps: called with (env steps, finished episodes) for each request, from either path.
      compiled: set when serving starts, the policy compiled for the largest batch (also if
        compiling fails); None: nothing is told.
    """

    def __init__(self, served: ServedPolicy, settings: InferenceSettings, on_unroll: OnUnroll,
                 stop: StopEvent, on_steps: OnSteps | None = None,
                 compiled: threading.Event | None = None):
        fmt = served.step_format
        w, k = settings.num_workers, settings.envs_per_worker
        self._format = fmt
        self._k = k
        # The params and their version (the learner updates they have seen), swapped together.
        self._acting = (served.params, 0)
        self._stop = stop
        self._slots = WorkerSlots(fmt, w, k, settings.shared_memory, stop,
                                  on_steps or (lambda steps, episodes: None))
        self._batching = Batching(self._slots.ready, fmt.inputs, w, k, settings.max_batch,
                                  settings.timeout_s)
        self._policy = BatchedPolicy(served.policy, served.key, fmt, served.initial_state, w, k)
        self._recorder = UnrollRecorder(served.recorded, w, k, settings.unroll_length, on_unroll,
                                        settings.overlap)
        # Not a daemon: the interpreter joins it at exit (it ends once `stop` is set). A daemon
        # thread still inside a JAX call when the interpreter finalizes is unwound by
        # pthread_exit through XLA's C++ frames, which aborts the process with "terminate
        # called after throwing an instance of '' / FATAL: exception not rethrown". Said
        # explicitly: a thread inherits daemon from the thread that creates it, and local_mt
        # constructs its nodes in daemon threads.
        self._thread = threading.Thread(target=self._serve, name="inference", daemon=False)
        self._compiled = compiled or threading.Event()
        self.batches = 0
        self.steps = 0

    @property
    def slot_resets(self) -> int:
        """How many times a worker came back with a new run id (its slots were reset)."""
        return self._recorder.resets

    @property
    def compiled_all(self) -> bool:
        """Whether the policy is compiled for every batch size (the smaller ones compile while
        serving: `Batching.compile`)."""
        return self._batching.compiled_all

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def set_params(self, params: Any, version: int = 0) -> None:
        """The params the next batch uses, and their version (learner updates they have
        seen), recorded with the steps they act on."""
        self._acting = (params, version)  # One reference swap: atomic, read by one batch.

    def shm_address(self) -> str | None:
        """Where workers on this host connect their shared slots; None: use `step`."""
        return self._slots.address

    def step(self, worker_id: int, run_id: int, inputs: Mapping[str, np.ndarray],
             episodes: Episodes = ()) -> Any:
        """Called by env worker `worker_id` (any thread); blocks until its actions are ready
        (`inference_slots.WorkerSlots.step`: the arguments, the answer, the errors)."""
        return self._slots.step(worker_id, run_id, inputs, episodes)

    def _serve(self) -> None:
        compiling = None
        try:
            compiling = self._batching.compile(
                lambda n: self._policy.lower(self._acting[0], n))
            self._compiled.set()
            self._serve_until_stopped()
        finally:
            self._compiled.set()  # Also when compiling failed: nothing waits on it forever.
            self._slots.close()
            if compiling is not None:
                compiling.join()  # Every size reaches the compilation cache.

    def _serve_until_stopped(self) -> None:
        while not self._stop.is_set():
            batch = self._batching.next_batch()
            if not batch:
                continue
            try:
                self._serve_batch(batch)
            except BaseException as e:
                # A peer that stopped first (a replay node taking unrolls) is part of stopping,
                # not an error: the workers get the stop answer (None) and the thread ends.
                stopping = self._stop.is_set() and isinstance(e, ConnectionError | EOFError)
                for request in batch:  # Wake the workers still waiting, then let the node fail.
                    if request.actions is None:
                        request.error = None if stopping else e
                        request.finish()
                if stopping:
                    return
                raise

    def _serve_batch(self, batch: list[Request]) -> None:
        """Acts for every request, answers them all, then records the steps."""
        k, n = self._k, len(batch) * self._k

        def per_worker(fields: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            """{field: [padded, ...]} -> {field: [len(batch), K, ...]} (views)."""
            return {name: v[:n].reshape(len(batch), k, *v.shape[1:])
                    for name, v in fields.items()}

        slots = self._slots.rows
        workers = np.fromiter((r.worker_id for r in batch), np.intp, len(batch))
        inputs = self._batching.inputs(slots, workers)
        params, version = self._acting
        actions, extras, state_rows = self._policy.act(
            params, batch, self._recorder.is_new_run, self._format.policy_obs(inputs),
            inputs["first"])
        actions = per_worker(self._format.action_fields(actions))
        for name, value in actions.items():  # The scatter, into the workers' rows.
            slots[name][workers] = value
        # Answer first: the workers step their envs while this thread records (from `inputs`,
        # since they overwrite their rows once answered).
        for i, request in enumerate(batch):
            request.actions, request.index = actions, i
            request.finish()
        self._recorder.record(
            [(request.worker_id, request.run_id) for request in batch],
            {**per_worker(inputs), **actions, **per_worker(self._format.extras_fields(extras))},
            state=lambda: per_worker(jax.device_get(state_rows)), version=version)
        self.batches += 1
        self.steps += n
