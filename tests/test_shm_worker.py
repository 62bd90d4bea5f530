"""An env worker and the inference server through shared slots, and the worker's fallback."""

import functools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.env_worker import EnvWorker
from trellis.builders.experiments.inference import InferenceServer, InferenceSettings, ServedPolicy
from trellis.envs import GymnasiumFactory
from trellis.launch.runtime import node_context, shm

K = 4
W = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)


def policy(params, key, obs, state, first):
    del key, first
    logits = obs @ params
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), {"logits": logits}, state


class Inference:
    """What the worker holds: the learner node's two RPCs, here calls on a local server."""

    def __init__(self, server, address):
        self._server = server
        self._address = address
        self.rpc_steps = 0

    def shm_address(self):
        return self._address

    def step(self, worker_id, run_id, inputs, episodes):
        self.rpc_steps += 1
        return self._server.step(worker_id, run_id, inputs, episodes)


def _run_worker(server, address, stop: threading.Event, until) -> Inference:
    """Runs an EnvWorker (CartPole, K envs) in a thread bound to `stop` until `until()`."""
    inference = Inference(server, address)
    worker = EnvWorker(GymnasiumFactory("CartPole-v1"), inference, 0, K, seed=1)
    context = node_context.NodeContext("actor/0", stop, lambda status: None)

    def run():
        node_context.bind_thread(context)
        worker.run()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not until():
            assert time.monotonic() < deadline, "the worker did not get there within 60 s"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    return inference


def _server(unrolls, episodes, stop, shared_memory, act=policy):
    spec = GymnasiumFactory("CartPole-v1").spec()
    return InferenceServer(
        ServedPolicy(jax.jit(act), W, jax.random.PRNGKey(0), spec,
                     {"logits": ArraySpec((2,), "float32")}),
        InferenceSettings(1, K, 10, shared_memory=shared_memory),
        lambda unroll, versions: unrolls.append(unroll), stop,
        on_steps=lambda n, done: episodes.extend(done))


@pytest.mark.skipif(not shm.available(), reason="needs Linux memfd")
def test_a_worker_steps_through_shared_slots_and_its_data_arrives_intact():
    unrolls, episodes, stop = [], [], threading.Event()
    server = _server(unrolls, episodes, stop, shared_memory=True)
    server.start()
    inference = _run_worker(server, server.shm_address(), stop,
                            lambda: len(unrolls) >= 20 and len(episodes) >= 5)
    server.join(30)
    assert inference.rpc_steps == 0  # Every step came through the shared slots.
    for unroll in unrolls:
        # What the policy saw is what it acted on: its actions and logits match the obs.
        np.testing.assert_allclose(unroll["logits"], unroll["obs"] @ W, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(unroll["action"], np.argmax(unroll["obs"] @ W, axis=-1))
        # CartPole's flags and rewards arrived as the env gave them: a reset step after
        # every episode end, with reward 0; reward 1 on every other step.
        done = unroll["terminated"][:-1] | unroll["truncated"][:-1]
        np.testing.assert_array_equal(unroll["first"][1:], done)
        np.testing.assert_array_equal(unroll["reward"], np.where(unroll["first"], 0.0, 1.0))
        assert (np.abs(unroll["obs"]) < 5).all() and unroll["obs"].any()
    # Finished episodes reached the counter: CartPole's return is its length.
    assert all(ret == length > 0 for ret, length in episodes)


def test_a_worker_that_cannot_reach_the_hub_says_so_once_and_uses_the_socket(capfd):
    unrolls, episodes, stop = [], [], threading.Event()
    server = _server(unrolls, episodes, stop, shared_memory=False)
    server.start()
    # What a worker on another host gets: an address that does not exist where it runs.
    inference = _run_worker(server, "\0trellis-shm-not-on-this-host", stop,
                            lambda: len(unrolls) >= 3)
    server.join(30)
    assert inference.rpc_steps >= 30
    lines = [line for line in capfd.readouterr().err.splitlines() if line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("env worker 0: no shared memory with the inference server (")
    assert lines[0].endswith("); stepping over the socket")


def test_a_worker_whose_hub_is_gone_as_the_program_stops_says_nothing(capfd):
    # A learner that reached its budget before every worker connected has closed its hub.
    unrolls, episodes, stop = [], [], threading.Event()
    server = _server(unrolls, episodes, stop, shared_memory=False)
    stop.set()
    _run_worker(server, "\0trellis-shm-closed", stop, lambda: True)
    assert capfd.readouterr().err == ""


@pytest.mark.skipif(not shm.available(), reason="needs Linux memfd")
def test_a_worker_that_connects_while_the_policy_compiles_keeps_shared_memory(monkeypatch):
    # On a GPU, Pong's policy compiled for longer than a worker waits for the hub's answer.
    monkeypatch.setattr(shm, "connect", functools.partial(shm.connect, timeout_s=0.5))

    def slow_policy(params, key, obs, state, first):
        time.sleep(1.5)  # While tracing: each batch size compiles for longer than 0.5 s.
        return policy(params, key, obs, state, first)

    unrolls, episodes, stop = [], [], threading.Event()
    server = _server(unrolls, episodes, stop, shared_memory=True, act=slow_policy)
    server.start()
    inference = _run_worker(server, server.shm_address(), stop, lambda: len(unrolls) >= 3)
    server.join(30)
    assert inference.rpc_steps == 0
