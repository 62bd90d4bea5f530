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
fields of `env_worker.StepFormat` (`obs/<agent>`, ..., `first`), the policy gets them as one
`MultiAgentStep` of {agent: [N, ...]} and answers {agent: [N, ...]} actions; a multi-agent
agent's policy acts for each of its policies on that policy's agents stacked as extra rows
(builders/contract/policy_mapping.py), so every policy runs once per batch, and its recurrent
state, if any, is a row per env slot holding every agent's.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from trellis.builders.contract.agent import (
    STATE_PREFIX,
    ArraySpec,
    Builder,
    Policy,
    State,
    state_specs,
)
from trellis.builders.experiments.env_worker import (
    ACTIONS,
    FAILED,
    REQUEST,
    STOPPING,
    StepFormat,
    step_format,
    unpack_hello,
)
from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.specs import EnvSpec
from trellis.launch.runtime import shm
from trellis.launch.runtime.priority import lower_thread_priority

Episodes = Sequence[tuple[float, int]]


def step_specs(spec: EnvSpec | MultiAgentSpec, extras: Mapping[str, ArraySpec],
               initial_state: Mapping[str, np.ndarray] | None = None) -> dict[str, ArraySpec]:
    """The fields of one recorded step, as stored in unrolls.

    What the env worker sent (`env_worker.StepFormat.inputs`: the observation and how it was
    reached: reward, terminated, truncated, first; multi-agent, those per agent with `alive`,
    and the global state), what the policy did there (the action fields, extras) and, for a
    stateful policy, the fields `state/<name>` of its state (`Builder.initial_state` rows give
    their specs), recorded once per unroll.
    """
    fmt = step_format(spec)
    return {**fmt.inputs, **fmt.actions, **fmt.extras_specs(extras),
            **state_specs(initial_state or {})}


def agent_step_specs(builder: Builder, spec: EnvSpec | MultiAgentSpec) -> dict[str, ArraySpec]:
    """`step_specs` of `builder`'s agent on envs of `spec`, its state's shapes traced
    (`jax.eval_shape`), not computed: the launcher builds programs with these, and computing
    the state there would start a JAX backend in the launcher process (on a GPU, a CUDA
    context holding XLA's preallocated share of the GPU's memory for the whole run)."""
    initial_state = jax.eval_shape(lambda: builder.initial_state(spec, 1))
    return step_specs(spec, builder.extras_spec(spec), initial_state)


def _single_agent_format(specs: Mapping[str, ArraySpec]) -> StepFormat:
    """The step format of a single-agent env's recorded fields (`step_specs`)."""
    return StepFormat({name: specs[name] for name in
                       ("obs", "reward", "terminated", "truncated", "first")},
                      {"action": specs["action"]})


@dataclasses.dataclass
class _Request:
    """One worker's step, whose inputs are in the worker's row of the server's slots; `finish`
    hands it `actions`, or None (stopping), or `error`.

    The row stays as the worker wrote it until `finish`, since the worker waits for the answer
    before writing again. `actions` is set only when the request is answered with them (the
    shared-memory path finds them in its row, where the batch's answer was scattered).
    """

    worker_id: int
    run_id: int
    channel: shm.Channel | None = None
    done: threading.Event | None = None  # The RPC path's wake-up (`step` makes one).
    actions: dict[str, np.ndarray] | None = None  # The action fields (`StepFormat.actions`).
    error: BaseException | None = None

    def finish(self) -> None:
        if self.done is not None:
            self.done.set()
            return
        answer = (FAILED if self.error is not None else
                  STOPPING if self.actions is None else ACTIONS)
        with contextlib.suppress(OSError):  # A worker that died meanwhile needs no answer.
            self.channel.send(answer)


class UnrollRecorder:
    """Per-worker unroll buffers [T + 1, K, ...]; hands each one over when it is full.

    A worker's K envs advance in lockstep, so one time index per worker suffices. The last
    `overlap` steps of an unroll are copied to be the first of the next one; a full unroll's
    buffers go to `on_unroll` as they are (this side never writes them again), so nothing
    else is copied; with them goes the params version of each of its steps [T + 1]. A new
    run id for a worker (the process restarted) drops its partial unroll, so no unroll spans
    two runs.

    Fields named `state/<name>` are not per step: an unroll holds them once, [1, K, ...], as
    the policy state at its first step. `record` asks for the state (a callable, so it is
    fetched from the device only then) at the steps where an unroll begins: every
    `T + 1 - overlap` steps from a run's first. With an overlap beyond half the unroll (R2D2's
    burn-in) several unrolls have begun and not ended, so their states wait in order.
    """

    def __init__(
        self,
        specs: Mapping[str, ArraySpec],
        num_workers: int,
        envs_per_worker: int,
        unroll_length: int,
        on_unroll: Callable[[dict[str, np.ndarray], np.ndarray], None],
        overlap: int = 1,
    ):
        self._specs = dict(specs)
        self._steps = [name for name in specs if not name.startswith(STATE_PREFIX)]
        self._states = [name for name in specs if name.startswith(STATE_PREFIX)]
        self._k = envs_per_worker
        self._length = unroll_length + 1
        self._overlap = overlap
        self._on_unroll = on_unroll
        self._unrolls = [self._empty() for _ in range(num_workers)]  # Each worker's current.
        self._versions = [np.zeros(self._length, np.int64) for _ in range(num_workers)]
        self._t = [0] * num_workers  # Steps in the current unroll.
        self._since_start = [0] * num_workers  # Steps since the latest unroll began.
        # The states of the unrolls begun and not emitted yet, oldest first.
        self._begun: list[collections.deque] = [collections.deque() for _ in range(num_workers)]
        self._run_ids: list[int | None] = [None] * num_workers
        self.resets = 0

    def _empty(self) -> dict[str, np.ndarray]:
        """One unroll's buffers: [T + 1, K, ...] per step field, [1, K, ...] per state field.

        Not zeroed: every row is written before the unroll is handed over, and zeroing a
        Pong unroll (19 MB at 32 envs) made recording a step 1.4x slower
        (benchmarks/inference_copies.py).
        """
        return {name: np.empty((1 if name.startswith(STATE_PREFIX) else self._length, self._k)
                               + s.shape, s.dtype)
                for name, s in self._specs.items()}

    def is_new_run(self, worker_id: int, run_id: int) -> bool:
        """Whether `run_id` is not the run this worker's buffers hold (a start or a restart)."""
        return self._run_ids[worker_id] != run_id

    def record(self, worker_id: int, run_id: int, step: Mapping[str, np.ndarray],
               state: Callable[[], Mapping[str, np.ndarray]] | None = None,
               version: int = 0) -> None:
        """Writes one step of worker `worker_id`'s K envs; emits the unroll it completes.

        Args:
          worker_id, run_id: whose step; a new run id restarts the worker's unroll.
          step: {field: [K, ...]} for every per-step field.
          state: returns the policy state {name: [K, ...]} that this step started from;
            called only where an unroll begins, and needed when `state/` fields are recorded.
          version: the version of the params that picked this step's actions.
        """
        if self.is_new_run(worker_id, run_id):
            if self._run_ids[worker_id] is not None:
                self.resets += 1
            self._run_ids[worker_id] = run_id
            self._t[worker_id] = 0
            self._since_start[worker_id] = 0
            self._begun[worker_id].clear()
        if self._states and self._since_start[worker_id] == 0:  # An unroll begins here.
            rows = state()
            self._begun[worker_id].append(
                {name: np.array(rows[name.removeprefix(STATE_PREFIX)]) for name in self._states})
        self._since_start[worker_id] = (self._since_start[worker_id] + 1) % (
            self._length - self._overlap)
        t = self._t[worker_id]
        unroll = self._unrolls[worker_id]
        for name in self._steps:
            unroll[name][t] = step[name]
        versions = self._versions[worker_id]
        versions[t] = version
        if t + 1 < self._length:
            self._t[worker_id] = t + 1
            return
        if self._states:
            for name, rows in self._begun[worker_id].popleft().items():
                unroll[name][0] = rows
        following = self._empty()
        for name in self._steps:
            following[name][:self._overlap] = unroll[name][-self._overlap:]
        self._unrolls[worker_id] = following
        self._versions[worker_id] = np.concatenate(
            [versions[-self._overlap:], np.zeros(self._length - self._overlap, np.int64)])
        self._t[worker_id] = self._overlap
        self._on_unroll(unroll, versions)


def gather(rows: np.ndarray, workers: np.ndarray, out: np.ndarray) -> None:
    """Copies the rows [W, K, ...] of `workers` into `out` [len(workers) * K, ...], in order.

    With its default mode ("raise"), `np.take` writes through a temporary buffer when given
    `out`: about 3x slower for Pong's observations (benchmarks/inference_copies.py); the
    worker ids are always in range, so "clip" never clips.
    """
    np.take(rows, workers, axis=0, out=out.reshape(len(workers), *rows.shape[1:]),
            mode="clip")


def _bucket(n: int, largest: int) -> int:
    """Pads batch sizes to powers of two, so the policy compiles a handful of times, and to
    no more than the largest batch (`largest`, from every worker: 448 envs for 14 x 32, not
    512)."""
    return min(1 << max(0, n - 1).bit_length(), largest)


def _act(policy: Policy, params, key, count, obs, first):
    """A feed-forward policy's step: nothing to gather or scatter.

    The step's key is `key` folded with the batch count, inside the jitted call: the key stays
    the same host array, so no key comes back with the actions, and every call takes inputs of
    the same kinds (a key out of a jitted call is committed to the device, a fresh one is not,
    and each kind compiles a program of its own).
    """
    actions, extras, _ = policy(params, jax.random.fold_in(key, count), obs, {}, first)
    return actions, extras


def _act_with_state(policy: Policy, params, key, count, obs, first, slots, state: State):
    """A stateful policy's step on the rows `slots` [N] of every slot's `state` [S, ...].

    Padding rows carry slot S (out of range): their gather reads some row (clipped) and
    their scatter is dropped. The key as in `_act`; returns the rows used too, for the
    recorder.
    """
    rows = {name: s.at[slots].get(mode="clip") for name, s in state.items()}
    actions, extras, new_rows = policy(params, jax.random.fold_in(key, count), obs, rows, first)
    state = {name: s.at[slots].set(new_rows[name], mode="drop") for name, s in state.items()}
    return actions, extras, state, rows


def _reset_rows(state: State, initial: State, slots) -> State:
    """`state` with the rows `slots` back at their initial values."""
    return {name: s.at[slots].set(initial[name][slots]) for name, s in state.items()}


class InferenceServer:
    """Batches policy calls from many env workers and records their unrolls.

    Args:
      policy: `policy(params, key, obs[N], state, first[N]) -> (actions[N], extras,
        new_state)` (`builders.contract.agent.Policy`); jitted here, with the state's gather
        and scatter.
      params: initial params (replace with `set_params`; read by reference, no copy).
      key: RNG key; each batch's is this key folded with the batch count.
      specs: recorded fields (see `step_specs`).
      num_workers, envs_per_worker: the env slots served (worker_id in [0, num_workers)).
      unroll_length: T.
      on_unroll: receives each full unroll {field: [T + 1, K, ...]} and the params version
        of each of its steps [T + 1]; may block (back-pressure).
      max_batch: envs per policy call at most (default: all of them).
      timeout_s: how long a batch waits for more workers after its first request.
      stop: an event; once set, pending and new requests get `None` instead of actions.
      initial_state: every slot's initial policy state {name: [num_workers * K, ...]}
        (`Builder.initial_state`); None or {} for a feed-forward policy.
      overlap: steps repeated between consecutive unrolls (`QueueSpec.overlap`).
      on_steps: called with (env steps, finished episodes) for each request, from either path.
      shared_memory: the layout of each worker's shared slots (`env_worker.shm_layout`) to
        serve them through a `launch.shm.Hub`; None: the `step` RPC only.
      step_format: what the workers send and get back (`env_worker.step_format` of the env's
        spec); None: a single-agent env's, from `specs`. Multi-agent, the policy's `obs` is
        the step's `MultiAgentStep` and its actions {agent: [N, ...]}.
      compiled: set when serving starts, the policy compiled for the largest batch (also if
        compiling fails); None: nothing is told.
    """

    def __init__(
        self,
        policy: Policy,
        params,
        key: jax.Array,
        specs: Mapping[str, ArraySpec],
        num_workers: int,
        envs_per_worker: int,
        unroll_length: int,
        on_unroll: Callable[[dict[str, np.ndarray], np.ndarray], None],
        stop: threading.Event,
        max_batch: int | None = None,
        timeout_s: float = 0.002,
        initial_state: Mapping[str, np.ndarray] | None = None,
        overlap: int = 1,
        on_steps: Callable[[int, Episodes], None] | None = None,
        shared_memory: shm.Layout | None = None,
        step_format: StepFormat | None = None,
        compiled: threading.Event | None = None,
    ):
        self._format = step_format or _single_agent_format(specs)
        # The params and their version (the learner updates they have seen), swapped together.
        self._acting = (params, 0)
        self._key = jax.device_get(key)  # On the host, the same for every call (see `_act`).
        self._count = 0  # Batches served: folded into the key.
        self._specs = dict(specs)
        self._num_workers = num_workers
        self._k = envs_per_worker
        self._max_batch = max_batch or num_workers * envs_per_worker
        self._requests_per_batch = -(-self._max_batch // envs_per_worker)
        self._largest = self._requests_per_batch * envs_per_worker
        self._batch_sizes = sorted({_bucket(i * envs_per_worker, self._largest)
                                    for i in range(1, self._requests_per_batch + 1)})
        # One batch of inputs, reused: each request's are copied in and a padded prefix goes
        # to the policy (a prefix of a C-contiguous array is one too). Padding rows keep what
        # an earlier batch left there; their outputs are dropped.
        self._inputs = {name: self._specs[name].zeros((self._batch_sizes[-1],))
                        for name in self._format.inputs}
        self._compiled_sizes: tuple[int, ...] = ()  # Ascending; a batch pads to one of them.
        self._timeout_s = timeout_s
        self._stop = stop
        self._requests: queue.Queue[_Request] = queue.Queue()
        self._pending: list[_Request] = []  # Gathered beyond `max_batch`: the next batch's.
        self._on_steps = on_steps or (lambda steps, episodes: None)
        self._hub = None
        if shared_memory is not None:
            if shm.available():
                self._hub = shm.Hub(shared_memory, rows=num_workers)
            else:
                print("inference: no shared memory on this platform (needs Linux memfd); env "
                      "workers step over the socket", file=sys.stderr, flush=True)
        # Every worker's inputs and actions, a row per worker ([W, K, ...]): the shared
        # mapping workers write into, or arrays here that the RPC path copies into. A batch
        # gathers its workers' rows in one `np.take` per field and scatters its actions back
        # in one assignment per field, whatever the number of workers.
        slot_fields = {**self._format.inputs, **self._format.actions}
        self._rows = self._hub.arrays if self._hub is not None else {
            name: spec.zeros((num_workers, envs_per_worker)) for name, spec in slot_fields.items()}
        self._recorder = UnrollRecorder(
            self._specs, num_workers, envs_per_worker, unroll_length, on_unroll, overlap
        )
        # The state lives on the device; each step donates its buffers to the next.
        self._initial = {name: jax.device_put(v) for name, v in (initial_state or {}).items()}
        self._state = {name: v.copy() for name, v in self._initial.items()}
        self._slots = [np.arange(w * envs_per_worker, (w + 1) * envs_per_worker, dtype=np.int32)
                       for w in range(num_workers)]  # Each worker's rows of the state.
        if self._state:
            self._act = jax.jit(functools.partial(_act_with_state, policy), donate_argnums=6)
            self._reset = jax.jit(_reset_rows, donate_argnums=0)
        else:
            self._act = jax.jit(functools.partial(_act, policy))
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

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def set_params(self, params, version: int = 0) -> None:
        """The params the next batch uses, and their version (learner updates they have
        seen), recorded with the steps they act on."""
        self._acting = (params, version)  # One reference swap: atomic, read by one batch.

    def shm_address(self) -> str | None:
        """Where workers on this host connect their shared slots; None: use `step`."""
        return None if self._hub is None else self._hub.address

    def step(
        self,
        worker_id: int,
        run_id: int,
        inputs: Mapping[str, np.ndarray],
        episodes: Episodes = (),
    ) -> Any:
        """Called by env worker `worker_id` (any thread); blocks until its actions are ready.

        Args:
          worker_id, run_id: who steps; a new run id resets the worker's slots.
          inputs: {field: [K, ...]} for every input of the step format (single-agent: obs,
            reward, terminated, truncated, first).
          episodes: those that finished on this step (`env_worker.Episode`).

        Returns:
          The envs' actions: [K, ...], or {agent: [K, ...]} for a multi-agent env; None once
          the server is stopping.

        Raises:
          ValueError: worker_id out of range, or inputs missing or of the wrong shape (nothing
            recorded).
        """
        if not 0 <= worker_id < self._num_workers:
            raise ValueError(f"worker_id {worker_id} not in [0, {self._num_workers})")
        data = {}
        for name in self._format.inputs:
            value = inputs.get(name)
            expected = (self._k,) + self._specs[name].shape
            if value is None or np.shape(value) != expected:
                raise ValueError(f"worker {worker_id}: {name} has shape "
                                 f"{None if value is None else np.shape(value)}, expected "
                                 f"{expected}")
            data[name] = value
        for name, value in data.items():
            self._rows[name][worker_id] = value
        self._on_steps(self._k, episodes)
        done = threading.Event()
        request = _Request(worker_id, run_id, done=done)
        self._requests.put(request)
        if self._hub is not None:
            self._hub.wake()
        while not done.wait(0.1):
            if self._stop.is_set():
                return None
        if request.error is not None:
            raise RuntimeError("inference failed") from request.error
        return None if request.actions is None else self._format.env_actions(request.actions)

    def _gather(self) -> list[_Request]:
        batch = self._pending or self._ready(0.05)
        deadline = time.monotonic() + self._timeout_s
        limit = self._requests_per_batch
        while batch and len(batch) < limit and (remaining := deadline - time.monotonic()) > 0:
            batch += self._ready(remaining)
        batch, self._pending = batch[:limit], batch[limit:]
        return batch

    def _ready(self, timeout_s: float) -> list[_Request]:
        """The requests that came within `timeout_s`: through shared slots and the RPC queue."""
        if self._hub is None:
            try:
                return [self._requests.get(timeout=timeout_s)]
            except queue.Empty:
                return []
        ready = [self._shm_request(channel)
                 for channel, message in self._hub.poll(timeout_s) if message == REQUEST]
        while not self._requests.empty():  # `step` woke the hub after putting its request.
            ready.append(self._requests.get_nowait())
        return [r for r in ready if r is not None]

    def _shm_request(self, channel: shm.Channel) -> _Request | None:
        worker_id, run_id = unpack_hello(channel.hello)
        slots = channel.arrays
        request = _Request(worker_id, run_id, channel)
        if worker_id != channel.row:  # Its inputs are in another worker's row.
            request.error = ValueError(f"worker {worker_id} connected to the slots of row "
                                       f"{channel.row}")
            request.finish()
            return None
        count = int(slots["num_episodes"])
        self._on_steps(self._k, [(r, int(n)) for r, n in slots["episodes"][:count].tolist()]
                       if count else ())
        return request

    def _serve(self) -> None:
        compiling = None
        try:
            compiling = self._compile_largest()
            self._compiled.set()
            self._serve_until_stopped()
        finally:
            self._compiled.set()  # Also when compiling failed: nothing waits on it forever.
            if self._hub is not None:
                self._hub.close()  # Workers still waiting see EOF.
            if compiling is not None:
                compiling.join()  # Every size reaches the compilation cache.

    def _compile_largest(self) -> threading.Thread:
        """Compiles the policy for the largest batch, which serving can start with (any batch
        fits once padded to it), then the smaller sizes one by one in a thread; each batch is
        padded to the smallest size compiled so far. On 2 cores with 32 env workers, the six
        sizes compiled together took the learner's first 1.5 s with no env step served.

        Which sizes a run meets depends on how the workers' requests happen to meet, so
        compiling on first use would make a run's set of programs a matter of timing: a second
        run of the same config could still compile one (a miss in the persistent compilation
        cache). All of them compile; the returned thread ends once they have.
        """
        largest = self._batch_sizes[-1]
        with concurrent.futures.ThreadPoolExecutor(1, "compile") as pool:
            compiled = pool.submit(lambda: self._lower(largest).compile())
            # Workers connect and send their first steps meanwhile: take them now. A hub
            # answers a connecting worker only when polled, and a worker gives up on shared
            # memory after 10 s (Pong's policy compiled for 25 s on a GPU: 13 of 14 workers
            # fell back to the socket).
            while not compiled.done():
                self._pending += self._ready(0.1)
            compiled.result()
        self._compiled_sizes = (largest,)

        def compile_the_rest() -> None:
            # Batches pad to a size compiled already meanwhile: these compiles may wait for
            # idle cores (on 2 cores they took the serving thread's, 2026-11-28).
            lower_thread_priority()
            for n in reversed(self._batch_sizes[:-1]):
                self._lower(n).compile()
                self._compiled_sizes = (n, *self._compiled_sizes)

        compiling = threading.Thread(target=compile_the_rest, name="compile", daemon=False)
        compiling.start()
        return compiling

    def _lower(self, n: int) -> jax.stages.Lowered:
        """The policy lowered for a batch of n envs, with arguments of the kinds a batch's
        call passes (so the call runs the program compiled from it)."""
        obs = {name: self._specs[name].zeros((n,)) for name in self._format.inputs}
        args = (self._acting[0], self._key, np.uint32(0), self._format.policy_obs(obs),
                obs["first"])
        if self._state:
            return self._act.lower(*args, np.zeros(n, np.int32), self._initial)
        return self._act.lower(*args)

    def _padded(self, n: int) -> int:
        """The smallest batch size compiled so far that holds n envs."""
        return next(size for size in self._compiled_sizes if size >= n)

    def _serve_until_stopped(self) -> None:
        while not self._stop.is_set():
            batch = self._gather()
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

    def _serve_batch(self, batch: list[_Request]) -> None:
        """Acts for every request, answers them all, then records the steps."""
        k, n = self._k, len(batch) * self._k
        workers = np.fromiter((r.worker_id for r in batch), np.intp, len(batch))
        inputs = {name: buffer[:self._padded(n)]
                  for name, buffer in self._inputs.items()}
        for name, rows in inputs.items():
            gather(self._rows[name], workers, rows[:n])
        params, version = self._acting
        actions, extras, state_rows = self._act_on(
            params, batch, self._format.policy_obs(inputs), inputs["first"])
        actions = self._format.action_fields(actions)
        extras = self._format.extras_fields(extras)
        for name, value in actions.items():  # The scatter, into the workers' rows.
            self._rows[name][workers] = value[:n].reshape(len(batch), k, *value.shape[1:])
        # Answer first: the workers step their envs while this thread records (from `inputs`,
        # since they overwrite their rows once answered).
        for i, request in enumerate(batch):
            request.actions = {name: v[i * k:(i + 1) * k] for name, v in actions.items()}
            request.finish()
        host_rows: list[dict[str, np.ndarray]] = []  # The state rows, once fetched.

        def rows_of(rows: slice) -> dict[str, np.ndarray]:
            if not host_rows:
                host_rows.append(jax.device_get(state_rows))
            return {name: v[rows] for name, v in host_rows[0].items()}

        for i, request in enumerate(batch):
            rows = slice(i * k, (i + 1) * k)
            step = {name: v[rows] for name, v in inputs.items()}
            step.update(request.actions)
            step.update({name: v[rows] for name, v in extras.items()})
            self._recorder.record(request.worker_id, request.run_id, step,
                                  state=functools.partial(rows_of, rows), version=version)
        self.batches += 1
        self.steps += n

    def _act_on(self, params, batch: list[_Request], obs: Any, first: np.ndarray):
        """The policy on one padded batch: (actions, extras) on the host (one transfer for
        both) and, for a stateful policy, the state rows it started from (on the device).

        A worker that starts a new run gets its slots' state reset first.
        """
        count = np.uint32(self._count & 0xFFFFFFFF)  # Distinct keys for 2^32 batches.
        self._count += 1
        if not self._state:
            outputs = self._act(params, self._key, count, obs, first)
            return *jax.device_get(outputs), None
        k = self._k
        slots = np.full(len(first), self._num_workers * k, np.int32)
        for i, request in enumerate(batch):
            worker_slots = self._slots[request.worker_id]
            slots[i * k:(i + 1) * k] = worker_slots
            if self._recorder.is_new_run(request.worker_id, request.run_id):
                self._state = self._reset(self._state, self._initial, worker_slots)
        actions, extras, self._state, rows = self._act(
            params, self._key, count, obs, first, slots, self._state)
        return *jax.device_get((actions, extras)), rows
