"""Central inference: dynamic batching matches unbatched calls; unrolls are recorded right."""

import threading

import jax
import jax.numpy as jnp
import numpy as np

from trellis.builders.base import ArraySpec
from trellis.builders.inference import InferenceServer, UnrollRecorder, step_specs
from trellis.builders.learner_node import UnrollBatcher
from trellis.envs import EnvSpec

SPEC = EnvSpec((3,), "float32", 4, (), "int32")
W = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)


def policy(params, key, obs, state, first):
    del key, first
    logits = obs @ params
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), {"logits": logits}, state


def make_server(on_unroll, num_workers=3, k=4, unroll_length=5, timeout_s=0.05):
    stop = threading.Event()
    server = InferenceServer(
        jax.jit(policy), W, jax.random.PRNGKey(0),
        step_specs(SPEC, {"logits": ArraySpec((4,), "float32")}),
        num_workers, k, unroll_length, on_unroll, stop, timeout_s=timeout_s,
    )
    return server, stop


def worker_inputs(rng, k):
    return dict(
        obs=rng.normal(size=(k, 3)).astype(np.float32),
        reward=rng.normal(size=k).astype(np.float32),
        terminated=rng.random(k) < 0.2,
        truncated=np.zeros(k, bool),
        first=rng.random(k) < 0.2,
    )


def test_batched_actions_match_unbatched_calls_per_slot():
    unrolls = []
    server, stop = make_server(unrolls.append)
    server.start()
    num_workers, k, steps = 3, 4, 12
    sent = {w: [] for w in range(num_workers)}
    got = {w: [] for w in range(num_workers)}

    def worker(w):
        rng = np.random.default_rng(100 + w)
        for _ in range(steps):
            inputs = worker_inputs(rng, k)
            sent[w].append(inputs)
            got[w].append(server.step(w, 7, **inputs))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(num_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stop.set()
    server.join(5)

    for w in range(num_workers):
        for inputs, actions in zip(sent[w], got[w], strict=True):
            expected = np.argmax(inputs["obs"] @ W, axis=-1)  # One call per worker, unbatched.
            np.testing.assert_array_equal(actions, expected)
    # Requests were actually batched across workers.
    assert server.batches < num_workers * steps
    assert server.steps == num_workers * steps * k

    # Each worker produced 2 unrolls of T + 1 = 6 steps from its 12 steps (overlap of 1).
    assert len(unrolls) == num_workers * 2
    for chunk in unrolls:
        assert chunk["obs"].shape == (6, k, 3) and chunk["logits"].shape == (6, k, 4)
        np.testing.assert_allclose(chunk["logits"], chunk["obs"] @ W, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(chunk["action"], np.argmax(chunk["obs"] @ W, axis=-1))


def test_bad_shapes_are_refused_with_a_clear_error():
    server, stop = make_server(lambda chunk: None)
    inputs = worker_inputs(np.random.default_rng(0), 4)
    inputs["obs"] = inputs["obs"][:, :2]
    try:
        server.step(0, 1, **inputs)
    except ValueError as e:
        assert "obs has shape (4, 2), expected (4, 3)" in str(e)
    else:
        raise AssertionError("expected ValueError")
    stop.set()


def _steps(n, k=2, offset=0):
    return [{"x": np.full(k, offset + i, np.float32)} for i in range(n)]


def test_recorder_overlaps_unrolls_by_one_step():
    out = []
    rec = UnrollRecorder({"x": ArraySpec((), "float32")}, 1, 2, 3, out.append)
    for step in _steps(7):
        rec.record(0, run_id=1, step=step)
    assert [c["x"][:, 0].tolist() for c in out] == [[0, 1, 2, 3], [3, 4, 5, 6]]


def test_recorder_drops_partial_unroll_of_a_restarted_worker():
    out = []
    rec = UnrollRecorder({"x": ArraySpec((), "float32")}, 2, 2, 3, out.append)
    for step in _steps(2):
        rec.record(1, run_id=1, step=step)
    for step in _steps(4, offset=100):  # The worker came back with a new run id.
        rec.record(1, run_id=2, step=step)
    assert rec.resets == 1
    assert [c["x"][:, 0].tolist() for c in out] == [[100, 101, 102, 103]]


def test_batcher_splits_chunks_into_batches_without_losing_columns():
    batcher = UnrollBatcher(batch_size=3)
    for i in range(4):  # 4 chunks of 2 columns = 8 columns -> 2 batches, 2 left.
        batcher.add({"x": np.full((5, 2), i)})
    first, second = batcher.pop(), batcher.pop()
    assert batcher.pop() is None
    assert first["x"][0].tolist() == [0, 0, 1] and second["x"][0].tolist() == [1, 2, 2]
    batcher.add({"x": np.full((5, 2), 9)})
    assert batcher.pop()["x"][0].tolist() == [3, 3, 9]
