"""SEED-style central inference: dynamic batching over env workers, unrolls kept here.

Every env worker sends the K observations of its envs and waits for K actions: through its
shared-memory slots when it runs on this host (`launch.shm`, see `env_worker.shm_step`),
through the `step` RPC otherwise. The serving thread waits on both at once, gathers requests
until `max_batch` envs are waiting or `timeout_s` has passed since the first one, runs the
jitted policy once on the concatenation, and replies to each worker with its slice. What the
policy saw and did is written into per-slot unroll buffers on this side (env workers stay
stateless); each full unroll of T + 1 steps goes to the learner through `on_unroll`.

A recurrent policy's state lives here too, on the device, one row per env slot (SEED RL): the
jitted call that picks the actions also gathers the batch's rows and scatters the new state
back, so the state never visits the host on the way; it is fetched only when an unroll
starts, to be recorded with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from trellis.builders.base import STATE_PREFIX, ArraySpec, Policy, State, state_specs
from trellis.builders.env_worker import ACTIONS, FAILED, REQUEST, STOPPING, unpack_hello
from trellis.envs.specs import EnvSpec
from trellis.launch import shm

Episodes = Sequence[tuple[float, int]]
_INPUTS = ("obs", "reward", "terminated", "truncated", "first")


def step_specs(spec: EnvSpec, extras: Mapping[str, ArraySpec],
               initial_state: Mapping[str, np.ndarray] | None = None) -> dict[str, ArraySpec]:
    """The fields of one recorded step, as stored in unrolls.

    How the observation was reached (reward, terminated, truncated, first), what the policy
    did there (action, extras) and, for a stateful policy, the fields `state/<name>` of its
    state (`Builder.initial_state` rows give their specs), recorded once per unroll.
    """
    return {
        "obs": ArraySpec(spec.observation_shape, spec.observation_dtype),
        "reward": ArraySpec((), "float32"),
        "terminated": ArraySpec((), "bool"),
        "truncated": ArraySpec((), "bool"),
        "first": ArraySpec((), "bool"),
        "action": ArraySpec(spec.action_shape, spec.action_dtype),
        **extras,
        **state_specs(initial_state or {}),
    }


@dataclasses.dataclass
class _Request:
    """One worker's step; `finish` hands it `actions`, or None (stopping), or `error`.

    Its `data` are views of the worker's shared slots when it came through `channel`: they
    stay valid until `finish`, since the worker waits for the answer before writing again.
    """

    worker_id: int
    run_id: int
    data: dict[str, np.ndarray]
    channel: shm.Channel | None = None
    done: threading.Event | None = None  # The RPC path's wake-up (`step` makes one).
    actions: np.ndarray | None = None
    error: BaseException | None = None

    def finish(self) -> None:
        if self.done is not None:
            self.done.set()
            return
        if self.error is None and self.actions is not None:
            self.channel.arrays["action"][...] = self.actions
        answer = (FAILED if self.error is not None else
                  STOPPING if self.actions is None else ACTIONS)
        with contextlib.suppress(OSError):  # A worker that died meanwhile needs no answer.
            self.channel.send(answer)


class UnrollRecorder:
    """Per-worker unroll buffers [T + 1, K, ...]; emits a copy when one is full.

    A worker's K envs advance in lockstep, so one time index per worker suffices. The last
    `overlap` steps of an unroll are kept as the first of the next. A new run id for a worker
    (the process restarted) drops its partial unroll, so no unroll spans two runs.

    Fields named `state/<name>` are not per step: an unroll holds them once, [1, K, ...], as
    the policy state at its first step. `record` asks for the state (a callable, so it is
    fetched from the device only then) at the steps where an unroll begins: a run's first
    step, and the step `overlap` from the end, which the next unroll starts with.
    """

    def __init__(
        self,
        specs: Mapping[str, ArraySpec],
        num_workers: int,
        envs_per_worker: int,
        unroll_length: int,
        on_unroll: Callable[[dict[str, np.ndarray]], None],
        overlap: int = 1,
    ):
        def buffers(length: int, is_state: bool) -> dict[str, np.ndarray]:
            return {name: s.zeros((num_workers, length, envs_per_worker))
                    for name, s in specs.items() if name.startswith(STATE_PREFIX) == is_state}

        self._buffers = buffers(unroll_length + 1, is_state=False)
        self._state = buffers(1, is_state=True)  # At the current unroll's first step.
        self._next_state = buffers(1, is_state=True)  # At the next unroll's first step.
        self._t = np.zeros(num_workers, np.int64)
        self._run_ids: list[int | None] = [None] * num_workers
        self._length = unroll_length + 1
        self._overlap = overlap
        self._on_unroll = on_unroll
        self.resets = 0

    def is_new_run(self, worker_id: int, run_id: int) -> bool:
        """Whether `run_id` is not the run this worker's buffers hold (a start or a restart)."""
        return self._run_ids[worker_id] != run_id

    def record(self, worker_id: int, run_id: int, step: Mapping[str, np.ndarray],
               state: Callable[[], Mapping[str, np.ndarray]] | None = None) -> None:
        """Writes one step of worker `worker_id`'s K envs; emits the unroll it completes.

        Args:
          worker_id, run_id: whose step; a new run id restarts the worker's unroll.
          step: {field: [K, ...]} for every per-step field.
          state: returns the policy state {name: [K, ...]} that this step started from;
            called only where an unroll begins, and needed when `state/` fields are recorded.
        """
        if self.is_new_run(worker_id, run_id):
            if self._run_ids[worker_id] is not None:
                self.resets += 1
            self._run_ids[worker_id] = run_id
            self._t[worker_id] = 0
        t = self._t[worker_id]
        if self._state and t in (0, self._length - self._overlap):
            rows = state()
            target = self._state if t == 0 else self._next_state
            for name, buffer in target.items():
                buffer[worker_id, 0] = rows[name.removeprefix(STATE_PREFIX)]
        for name, buffer in self._buffers.items():
            buffer[worker_id, t] = step[name]
        t += 1
        if t == self._length:
            unroll = {name: b[worker_id].copy() for name, b in self._buffers.items()}
            unroll.update({name: b[worker_id].copy() for name, b in self._state.items()})
            self._on_unroll(unroll)
            for buffer in self._buffers.values():
                buffer[worker_id, :self._overlap] = buffer[worker_id, -self._overlap:]
            for name, buffer in self._state.items():
                buffer[worker_id] = self._next_state[name][worker_id]
            t = self._overlap
        self._t[worker_id] = t


def _bucket(n: int) -> int:
    """Pads batch sizes to powers of two so the policy compiles a handful of times."""
    return 1 << max(0, n - 1).bit_length()


def _act(policy: Policy, params, key, obs, first):
    """A feed-forward policy's step: nothing to gather or scatter; returns the next key first.

    The key is split inside the jitted call: a split of its own costs about as much host time
    as the whole policy call on a small network (CPU, 64 CartPole envs: ~50 of ~190 us,
    measured on a busy 2-core machine).
    """
    key, step_key = jax.random.split(key)
    actions, extras, _ = policy(params, step_key, obs, {}, first)
    return key, actions, extras


def _act_with_state(policy: Policy, params, key, obs, first, slots, state: State):
    """A stateful policy's step on the rows `slots` [N] of every slot's `state` [S, ...].

    Padding rows carry slot S (out of range): their gather reads some row (clipped) and
    their scatter is dropped. Returns the next key first (as `_act`), and the rows used too,
    for the recorder.
    """
    key, step_key = jax.random.split(key)
    rows = {name: s.at[slots].get(mode="clip") for name, s in state.items()}
    actions, extras, new_rows = policy(params, step_key, obs, rows, first)
    state = {name: s.at[slots].set(new_rows[name], mode="drop") for name, s in state.items()}
    return key, actions, extras, state, rows


def _reset_rows(state: State, initial: State, slots) -> State:
    """`state` with the rows `slots` back at their initial values."""
    return {name: s.at[slots].set(initial[name][slots]) for name, s in state.items()}


def _padded(x: np.ndarray, n: int) -> np.ndarray:
    """`x` [M, ...] zero-padded to [n, ...]."""
    out = np.zeros((n,) + x.shape[1:], x.dtype)
    out[:len(x)] = x
    return out


class InferenceServer:
    """Batches policy calls from many env workers and records their unrolls.

    Args:
      policy: `policy(params, key, obs[N], state, first[N]) -> (actions[N], extras,
        new_state)` (`builders.base.Policy`); jitted here, with the state's gather and scatter.
      params: initial params (replace with `set_params`; read by reference, no copy).
      key: RNG key, split once per batch.
      specs: recorded fields (see `step_specs`).
      num_workers, envs_per_worker: the env slots served (worker_id in [0, num_workers)).
      unroll_length: T.
      on_unroll: receives each full unroll {field: [T + 1, K, ...]}; may block (back-pressure).
      max_batch: envs per policy call at most (default: all of them).
      timeout_s: how long a batch waits for more workers after its first request.
      stop: an event; once set, pending and new requests get `None` instead of actions.
      initial_state: every slot's initial policy state {name: [num_workers * K, ...]}
        (`Builder.initial_state`); None or {} for a feed-forward policy.
      overlap: steps repeated between consecutive unrolls (`QueueSpec.overlap`).
      on_steps: called with (env steps, finished episodes) for each request, from either path.
      shared_memory: the layout of each worker's shared slots (`env_worker.shm_layout`) to
        serve them through a `launch.shm.Hub`; None: the `step` RPC only.
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
        on_unroll: Callable[[dict[str, np.ndarray]], None],
        stop: threading.Event,
        max_batch: int | None = None,
        timeout_s: float = 0.002,
        initial_state: Mapping[str, np.ndarray] | None = None,
        overlap: int = 1,
        on_steps: Callable[[int, Episodes], None] | None = None,
        shared_memory: shm.Layout | None = None,
    ):
        self._params = params
        # On the host between calls, fetched with the actions: a key that came out of a jitted
        # call is committed to the device, a new one is not, and each kind compiles a program
        # of its own, so which ones a run compiles would depend on its first calls.
        self._key = jax.device_get(key)
        self._specs = dict(specs)
        self._num_workers = num_workers
        self._k = envs_per_worker
        self._max_batch = max_batch or num_workers * envs_per_worker
        self._timeout_s = timeout_s
        self._stop = stop
        self._requests: queue.Queue[_Request] = queue.Queue()
        self._pending: list[_Request] = []  # Gathered beyond `max_batch`: the next batch's.
        self._on_steps = on_steps or (lambda steps, episodes: None)
        self._hub = None
        if shared_memory is not None:
            if shm.available():
                self._hub = shm.Hub(shared_memory)
            else:
                print("inference: no shared memory on this platform (needs Linux memfd); env "
                      "workers step over the socket", file=sys.stderr, flush=True)
        self._recorder = UnrollRecorder(
            self._specs, num_workers, envs_per_worker, unroll_length, on_unroll, overlap
        )
        # The state lives on the device; each step donates its buffers to the next.
        self._initial = {name: jax.device_put(v) for name, v in (initial_state or {}).items()}
        self._state = {name: v.copy() for name, v in self._initial.items()}
        if self._state:
            self._act = jax.jit(functools.partial(_act_with_state, policy), donate_argnums=5)
            self._reset = jax.jit(_reset_rows, donate_argnums=0)
        else:
            self._act = jax.jit(functools.partial(_act, policy))
        # Not a daemon: the interpreter joins it at exit (it ends once `stop` is set). A daemon
        # thread still inside a JAX call when the interpreter finalizes is unwound by
        # pthread_exit through XLA's C++ frames, which aborts the process with "terminate
        # called after throwing an instance of '' / FATAL: exception not rethrown".
        self._thread = threading.Thread(target=self._serve, name="inference")
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

    def set_params(self, params) -> None:
        self._params = params  # An atomic reference swap; the next batch uses it.

    def shm_address(self) -> str | None:
        """Where workers on this host connect their shared slots; None: use `step`."""
        return None if self._hub is None else self._hub.address

    def step(
        self,
        worker_id: int,
        run_id: int,
        obs: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        first: np.ndarray,
        episodes: Episodes = (),
    ) -> np.ndarray | None:
        """Called by env worker `worker_id` (any thread); blocks until its actions are ready.

        Returns:
          actions [K, ...], or None once the server is stopping.

        Raises:
          ValueError: worker_id out of range or arrays of the wrong shape (nothing recorded).
        """
        if not 0 <= worker_id < self._num_workers:
            raise ValueError(f"worker_id {worker_id} not in [0, {self._num_workers})")
        data = {"obs": obs, "reward": reward, "terminated": terminated,
                "truncated": truncated, "first": first}
        for name, value in data.items():
            expected = (self._k,) + self._specs[name].shape
            if np.shape(value) != expected:
                raise ValueError(
                    f"worker {worker_id}: {name} has shape {np.shape(value)}, expected {expected}"
                )
        self._on_steps(self._k, episodes)
        done = threading.Event()
        request = _Request(worker_id, run_id, data, done=done)
        self._requests.put(request)
        if self._hub is not None:
            self._hub.wake()
        while not done.wait(0.1):
            if self._stop.is_set():
                return None
        if request.error is not None:
            raise RuntimeError("inference failed") from request.error
        return request.actions

    def _gather(self) -> list[_Request]:
        batch = self._pending or self._ready(0.05)
        deadline = time.monotonic() + self._timeout_s
        limit = -(-self._max_batch // self._k)  # Requests per batch.
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
        request = _Request(worker_id, run_id, {name: channel.arrays[name] for name in _INPUTS},
                           channel)
        if not 0 <= worker_id < self._num_workers:  # The RPC path raises ValueError here.
            request.error = ValueError(f"worker_id {worker_id} not in [0, {self._num_workers})")
            request.finish()
            return None
        slots = channel.arrays
        self._on_steps(self._k, [(r, int(n)) for r, n in
                                 slots["episodes"][:int(slots["num_episodes"])].tolist()])
        return request

    def _serve(self) -> None:
        try:
            self._compile_batch_sizes()
            self._serve_until_stopped()
        finally:
            if self._hub is not None:
                self._hub.close()  # Workers still waiting see EOF.

    def _compile_batch_sizes(self) -> None:
        """Compiles the policy for every padded batch size it can be called with, up front.

        Which sizes a run meets depends on how the workers' requests happen to meet, so
        compiling on first use would make a run's set of programs a matter of timing: a second
        run of the same config could still compile one (a miss in the persistent compilation
        cache). All rows are padding (slot out of range), so no slot's state changes, and the
        key is not advanced.
        """
        first = self._specs["first"]
        obs = self._specs["obs"]
        requests = -(-self._max_batch // self._k)
        for n in sorted({_bucket(i * self._k) for i in range(1, requests + 1)}):
            args = (self._params, self._key, obs.zeros((n,)), first.zeros((n,)))
            if self._state:
                slots = np.full(n, self._num_workers * self._k, np.int32)
                self._state = self._act(*args, slots, self._state)[3]
            else:
                self._act(*args)

    def _serve_until_stopped(self) -> None:
        while not self._stop.is_set():
            batch = self._gather()
            if not batch:
                continue
            try:
                self._infer(batch)
            except BaseException as e:
                # A peer that stopped first (a replay node taking unrolls) is part of stopping,
                # not an error: the workers get the stop answer (None) and the thread ends.
                stopping = self._stop.is_set() and isinstance(e, ConnectionError | EOFError)
                for request in batch:  # Wake the workers, then let the node fail.
                    request.error = None if stopping else e
                    request.finish()
                if stopping:
                    return
                raise

    def _infer(self, batch: list[_Request]) -> None:
        n, padded_n = len(batch) * self._k, _bucket(len(batch) * self._k)
        obs = _padded(np.concatenate([r.data["obs"] for r in batch]), padded_n)
        first = _padded(np.concatenate([r.data["first"] for r in batch]), padded_n)
        state_rows = None
        if self._state:
            slots = np.full(padded_n, self._num_workers * self._k, np.int32)
            for i, request in enumerate(batch):
                worker_slots = np.arange(self._k) + request.worker_id * self._k
                slots[i * self._k:(i + 1) * self._k] = worker_slots
                if self._recorder.is_new_run(request.worker_id, request.run_id):
                    self._state = self._reset(self._state, self._initial, worker_slots)
            key, actions, extras, self._state, state_rows = self._act(
                self._params, self._key, obs, first, slots, self._state)
        else:
            key, actions, extras = self._act(self._params, self._key, obs, first)
        # One transfer for all of them.
        self._key, actions, extras = jax.device_get((key, actions, extras))
        actions = actions[:n]
        extras = {name: v[:n] for name, v in extras.items()}
        host_rows = functools.cache(lambda: jax.device_get(state_rows))
        for i, request in enumerate(batch):
            rows = slice(i * self._k, (i + 1) * self._k)
            request.actions = actions[rows]
            step = dict(request.data, action=request.actions)
            step.update({name: v[rows] for name, v in extras.items()})
            self._recorder.record(
                request.worker_id, request.run_id, step,
                state=lambda rows=rows: {k: v[rows] for k, v in host_rows().items()})
            request.finish()
        self.batches += 1
        self.steps += n
