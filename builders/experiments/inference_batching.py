"""Central inference's batching: which requests make a batch, and the size it runs at.

A batch takes the workers' requests (`inference_slots.WorkerSlots.ready`) until `max_batch`
envs are waiting or `timeout_s` has passed since the first one; requests beyond `max_batch`
are the next batch's. Its inputs are copied from the workers' rows into one preallocated
batch whose prefix, padded to a size the policy was compiled for, goes to the policy.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np

from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.inference_slots import Request
from trellis.launch.runtime.priority import lower_thread_priority


def gather(rows: np.ndarray, workers: np.ndarray, out: np.ndarray) -> None:
    """Copies the rows [W, K, ...] of `workers` into `out` [len(workers) * K, ...], in order.

    With its default mode ("raise"), `np.take` writes through a temporary buffer when given
    `out`: about 3x slower for Pong's observations (benchmarks/inference_copies.py); the
    worker ids are always in range, so "clip" never clips. The method, not `np.take`: the
    function's dispatch to it is half of the call (0.6 us of 1.1 on 2 cores, per field).
    """
    rows.take(workers, axis=0, out=out.reshape(len(workers), *rows.shape[1:]), mode="clip")


def _bucket(n: int, largest: int) -> int:
    """Pads batch sizes to powers of two, so the policy compiles a handful of times, and to
    no more than the largest batch (`largest`, from every worker: 448 envs for 14 x 32, not
    512)."""
    return min(1 << max(0, n - 1).bit_length(), largest)


class Batching:
    """Gathers requests into batches, and pads each to a size the policy is compiled for.

    Args:
      ready: returns the requests that came within a timeout (`WorkerSlots.ready`).
      inputs: the step's input fields (`StepFormat.inputs`).
      num_workers, envs_per_worker: the env slots served.
      max_batch: envs per policy call at most (None: all of them).
      timeout_s: how long a batch waits for more workers after its first request.
    """

    def __init__(self, ready: Callable[[float], list[Request]], inputs: Mapping[str, ArraySpec],
                 num_workers: int, envs_per_worker: int, max_batch: int | None,
                 timeout_s: float):
        self._ready = ready
        self._k = envs_per_worker
        self._timeout_s = timeout_s
        self._requests_per_batch = -(-(max_batch or num_workers * envs_per_worker)
                                     // envs_per_worker)
        largest = self._requests_per_batch * envs_per_worker
        # Every batch size a batch may pad to, ascending.
        self.sizes = sorted({_bucket(i * envs_per_worker, largest)
                             for i in range(1, self._requests_per_batch + 1)})
        # One batch of inputs, reused: each request's are copied in and a padded prefix goes
        # to the policy (a prefix of a C-contiguous array is one too). Padding rows keep what
        # an earlier batch left there; their outputs are dropped.
        self._inputs = {name: spec.zeros((self.sizes[-1],)) for name, spec in inputs.items()}
        self._compiled_sizes: tuple[int, ...] = ()  # Ascending; a batch pads to one of them.
        self._pending: list[Request] = []  # Gathered beyond `max_batch`: the next batch's.

    def next_batch(self) -> list[Request]:
        """The next batch's requests; [] when none came within 50 ms."""
        batch = self._pending or self._ready(0.05)
        deadline = time.monotonic() + self._timeout_s
        limit = self._requests_per_batch
        while batch and len(batch) < limit and (remaining := deadline - time.monotonic()) > 0:
            batch += self._ready(remaining)
        batch, self._pending = batch[:limit], batch[limit:]
        return batch

    @property
    def compiled_all(self) -> bool:
        """Whether the policy is compiled for every size (`compile`'s thread has ended)."""
        return len(self._compiled_sizes) == len(self.sizes)

    def inputs(self, rows: Mapping[str, np.ndarray], workers: np.ndarray
               ) -> dict[str, np.ndarray]:
        """The batch of `workers`' inputs from their `rows` [W, K, ...], padded to the
        smallest size compiled so far that holds them: {field: [padded, ...]}."""
        n = len(workers) * self._k
        padded = next(size for size in self._compiled_sizes if size >= n)
        inputs = {name: buffer[:padded] for name, buffer in self._inputs.items()}
        for name, batch in inputs.items():
            gather(rows[name], workers, batch[:n])
        return inputs

    def compile(self, lower: Callable[[int], jax.stages.Lowered]) -> threading.Thread:
        """Compiles `lower(n)`, the policy lowered for a batch of n envs, for the largest
        batch, which serving can start with (any batch fits once padded to it), then for the
        smaller sizes one by one in a thread; each batch is padded to the smallest size
        compiled so far. On 2 cores with 32 env workers, the six sizes compiled together took
        the learner's first 1.5 s with no env step served.

        Which sizes a run meets depends on how the workers' requests happen to meet, so
        compiling on first use would make a run's set of programs a matter of timing: a second
        run of the same config could still compile one (a miss in the persistent compilation
        cache). All of them compile; the returned thread ends once they have.
        """
        largest = self.sizes[-1]
        with concurrent.futures.ThreadPoolExecutor(1, "compile") as pool:
            compiled = pool.submit(lambda: lower(largest).compile())
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
            for n in reversed(self.sizes[:-1]):
                lower(n).compile()
                self._compiled_sizes = (n, *self._compiled_sizes)

        compiling = threading.Thread(target=compile_the_rest, name="compile", daemon=False)
        compiling.start()
        return compiling
