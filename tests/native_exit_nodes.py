"""Nodes for tests/test_native_abort.py: threads left inside XLA as a node process exits.

A module of its own (it imports JAX) so that tests/launch_nodes.py stays stdlib-only; spawned
node processes import it by name.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp

from trellis.launch import runtime


@jax.jit
def _busy(x: jax.Array) -> jax.Array:
    # Tens of milliseconds of XLA per call on a CPU core, with the GIL released: a thread
    # that calls it in a loop is inside XLA's C++ nearly all the time.
    return jax.lax.fori_loop(0, 50, lambda i, y: jnp.tanh(y @ y), x)


def _spin(seconds: float) -> int:
    """Calls the jitted function for `seconds`, whatever the program does; returns the calls."""
    x = jnp.ones((256, 256)) / 256
    calls, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        jax.device_get(_busy(x))
        calls += 1
    return calls


class JaxSpinner:
    """A service node that leaves a thread inside XLA as its process exits.

    `spin(seconds)` (an RPC) runs the jitted function for `seconds`: called for longer than
    `rpc.TcpServer.close` waits for calls in progress, its thread is still inside XLA at exit.
    With `daemon_s`, `run()` starts a daemon thread that spins that long (as a library's
    background thread might), then asks the program to stop; otherwise it waits for the stop.
    """

    def __init__(self, daemon_s: float = 0.0):
        self._daemon_s = daemon_s
        self._spinning = 0
        jax.device_get(_busy(jnp.ones((256, 256))))  # Compiled before anything calls it.

    def spin(self, seconds: float) -> int:
        self._spinning += 1
        return _spin(seconds)

    def spinning(self) -> int:
        """How many `spin` calls have begun."""
        return self._spinning

    def run(self) -> None:
        if self._daemon_s <= 0:
            runtime.stop_event().wait()
            return
        threading.Thread(target=_spin, args=(self._daemon_s,), name="spinner",
                         daemon=True).start()
        time.sleep(0.2)  # Inside its first call by then.
        runtime.request_stop("spinning")
