"""Central inference: dynamic batching matches unbatched calls; unrolls are recorded right."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.feeds import UnrollBatcher
from trellis.builders.experiments.inference import (
    InferenceServer,
    InferenceSettings,
    ServedPolicy,
)
from trellis.builders.experiments.inference_batching import Batching, gather
from trellis.builders.experiments.inference_slots import Request
from trellis.builders.experiments.unroll_recorder import UnrollRecorder
from trellis.envs import EnvSpec

SPEC = EnvSpec((3,), "float32", 4, (), "int32")
W = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)


def policy(params, key, obs, state, first):
    del key, first
    logits = obs @ params
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), {"logits": logits}, state


def keep(unrolls):
    """An `on_unroll` that keeps the unrolls and drops their params versions."""
    return lambda unroll, versions: unrolls.append(unroll)


def make_server(on_unroll, num_workers=3, k=4, unroll_length=5, timeout_s=0.05, act=policy):
    stop = threading.Event()
    server = InferenceServer(
        ServedPolicy(jax.jit(act), W, jax.random.PRNGKey(0), SPEC,
                     {"logits": ArraySpec((4,), "float32")}),
        InferenceSettings(num_workers, k, unroll_length, timeout_s=timeout_s), on_unroll, stop)
    return server, stop


def run_workers(server, stop, work, num_workers=3, timeout_s=30):
    """Runs `work(worker_id)` in a thread per worker, then stops the server."""
    threads = [threading.Thread(target=work, args=(w,)) for w in range(num_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    stop.set()
    server.join(5)


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
    server, stop = make_server(keep(unrolls))
    server.start()
    num_workers, k, steps = 3, 4, 12
    sent = {w: [] for w in range(num_workers)}
    got = {w: [] for w in range(num_workers)}

    def worker(w):
        rng = np.random.default_rng(100 + w)
        for _ in range(steps):
            inputs = worker_inputs(rng, k)
            sent[w].append(inputs)
            got[w].append(server.step(w, 7, inputs))

    run_workers(server, stop, worker, num_workers)

    for w in range(num_workers):
        for inputs, actions in zip(sent[w], got[w], strict=True):
            expected = np.argmax(inputs["obs"] @ W, axis=-1)  # One call per worker, unbatched.
            np.testing.assert_array_equal(actions, expected)
    # Requests were actually batched across workers.
    assert server.batches < num_workers * steps
    assert server.steps == num_workers * steps * k

    # Each worker produced 2 unrolls of T + 1 = 6 steps from its 12 steps (overlap of 1),
    # holding exactly what it sent at steps 0-5 and 5-10.
    assert len(unrolls) == num_workers * 2
    expected = [{name: np.stack([x[name] for x in sent[w][start:start + 6]]) for name in sent[w][0]}
                for w in range(num_workers) for start in (0, 5)]
    for chunk in unrolls:
        assert chunk["obs"].shape == (6, k, 3) and chunk["logits"].shape == (6, k, 4)
        np.testing.assert_allclose(chunk["logits"], chunk["obs"] @ W, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(chunk["action"], np.argmax(chunk["obs"] @ W, axis=-1))
        matches = [e for e in expected if np.array_equal(e["obs"], chunk["obs"])]
        assert len(matches) == 1
        for name, value in matches[0].items():
            np.testing.assert_array_equal(chunk[name], value)


def test_a_worker_gets_the_actions_of_the_step_that_fills_an_unroll_while_the_learner_waits():
    """Answers go out before recording: a full unroll queue holds the worker's next step,
    not the one whose unroll is waiting to be taken."""
    taken, release = threading.Event(), threading.Event()

    def on_unroll(chunk, versions):
        taken.set()
        release.wait(60)

    server, stop = make_server(on_unroll, num_workers=1, unroll_length=5)
    server.start()
    rng = np.random.default_rng(0)
    answered = []

    def worker():
        for _ in range(7):
            answered.append(server.step(0, 1, worker_inputs(rng, 4)))

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert taken.wait(30), "no unroll after 6 steps"
        deadline = time.monotonic() + 30
        while len(answered) < 6:  # The 6th step filled the unroll that on_unroll holds.
            assert time.monotonic() < deadline, f"{len(answered)} steps answered, expected 6"
            time.sleep(0.01)
        assert len(answered) == 6  # The 7th waits for the learner: the back-pressure.
    finally:
        release.set()
        thread.join(30)
        stop.set()
        server.join(5)
    assert len(answered) == 7 and all(a is not None for a in answered)


def _sampling_server(key, unrolls):
    def policy(params, key, obs, state, first):
        del params, first
        u = jax.random.uniform(key, (obs.shape[0],))
        return jnp.zeros(obs.shape[0], jnp.int32), {"u": u}, state

    stop = threading.Event()
    server = InferenceServer(
        ServedPolicy(policy, W, key, SPEC, {"u": ArraySpec((), "float32")}),
        InferenceSettings(1, 4, 5), lambda unroll, versions: unrolls.append(unroll), stop)
    server.start()
    rng = np.random.default_rng(0)
    for _ in range(6):
        server.step(0, 1, worker_inputs(rng, 4))
    stop.set()
    server.join(5)
    return unrolls[0]["u"]  # [6 batches, 4 envs]


def test_every_batch_draws_from_a_fresh_key_that_the_seed_fixes():
    u = _sampling_server(jax.random.PRNGKey(3), [])
    assert len(np.unique(u)) == u.size  # No batch reuses a key.
    np.testing.assert_array_equal(_sampling_server(jax.random.PRNGKey(3), []), u)
    assert not np.array_equal(_sampling_server(jax.random.PRNGKey(4), []), u)


def test_bad_shapes_are_refused_with_a_clear_error():
    server, stop = make_server(lambda chunk, versions: None)
    inputs = worker_inputs(np.random.default_rng(0), 4)
    inputs["obs"] = inputs["obs"][:, :2]
    try:
        server.step(0, 1, inputs)
    except ValueError as e:
        assert "obs has shape (4, 2), expected (4, 3)" in str(e)
    else:
        raise AssertionError("expected ValueError")
    stop.set()


def _steps(n, k=2, offset=0):
    return [{"x": np.full(k, offset + i, np.float32)} for i in range(n)]


def record_alone(rec, worker_id, run_id, step, state=None, version=0):
    """`rec.record` of one worker's step {field: [K, ...]}, a batch of one."""
    rec.record([(worker_id, run_id)], {name: v[None] for name, v in step.items()},
               state=state and (lambda: {name: v[None] for name, v in state().items()}),
               version=version)


def test_batches_pad_to_powers_of_two_up_to_every_workers_envs_and_no_further():
    traced = []

    def tracing(params, key, obs, state, first):
        traced.append(obs.shape[0])  # Once per compiled batch size.
        return policy(params, key, obs, state, first)

    server, stop = make_server(lambda unroll, versions: None, act=tracing)
    server.start()
    rng = np.random.default_rng(0)
    run_workers(server, stop, lambda w: server.step(w, 7, worker_inputs(rng, 4)))
    assert server.steps == 12
    assert sorted(traced) == [4, 8, 12]  # 3 workers x 4 envs: 12, not 16.


def test_serving_starts_with_the_largest_size_and_pads_to_smaller_ones_once_compiled():
    release = threading.Event()
    traced = []

    def sized(params, key, obs, state, first):
        n = obs.shape[0]  # The padded batch size, at trace time.
        traced.append(n)
        if n < 12:
            release.wait(30)  # The smaller sizes compile only once released.
        actions, extras, state = policy(params, key, obs, state, first)
        return jnp.full_like(actions, n), extras, state

    server, stop = make_server(lambda unroll, versions: None, act=sized)
    server.start()
    rng = np.random.default_rng(0)
    try:
        # One worker's 4 envs, served while only the largest size (3 workers x 4) is compiled.
        assert server.step(0, 7, worker_inputs(rng, 4)).tolist() == [12] * 4
        release.set()
        deadline = time.monotonic() + 30
        while server.step(0, 7, worker_inputs(rng, 4)).tolist() != [4] * 4:
            assert time.monotonic() < deadline, "never padded to the size of 4"
    finally:
        release.set()
        stop.set()
        server.join(5)
    assert sorted(traced) == [4, 8, 12]  # Each size traced once: calls run what compiled.


def test_recorder_hands_over_the_params_version_of_each_step():
    out = []
    rec = UnrollRecorder({"x": ArraySpec((), "float32")}, 1, 2, 3,
                         lambda unroll, versions: out.append(versions.tolist()))
    for i, step in enumerate(_steps(7)):
        record_alone(rec, 0, 1, step, version=10 + i // 2)
    # Versions 10 10 11 11 12 12 13; the overlapping step keeps its version.
    assert out == [[10, 10, 11, 11], [11, 12, 12, 13]]


def test_recorder_overlaps_unrolls_by_one_step():
    out = []
    rec = UnrollRecorder({"x": ArraySpec((), "float32")}, 1, 2, 3, keep(out))
    for step in _steps(7):
        record_alone(rec, 0, 1, step)
    assert [c["x"][:, 0].tolist() for c in out] == [[0, 1, 2, 3], [3, 4, 5, 6]]


def test_recorder_drops_partial_unroll_of_a_restarted_worker():
    out = []
    rec = UnrollRecorder({"x": ArraySpec((), "float32")}, 2, 2, 3, keep(out))
    for step in _steps(2):
        record_alone(rec, 1, 1, step)
    for step in _steps(4, offset=100):  # The worker came back with a new run id.
        record_alone(rec, 1, 2, step)
    assert rec.resets == 1
    assert [c["x"][:, 0].tolist() for c in out] == [[100, 101, 102, 103]]


def test_recorder_keeps_each_unrolls_state_when_the_overlap_exceeds_half_the_unroll():
    """R2D2's case: 7 steps, a new unroll every 3 (overlap 4), so three have begun at once."""
    out = []
    specs = {"x": ArraySpec((), "float32"), "state/s": ArraySpec((), "float32")}
    rec = UnrollRecorder(specs, 1, 1, 6, keep(out), overlap=4)
    for i in range(16):  # The state at step i is 100 + i.
        record_alone(rec, 0, 1, {"x": np.full(1, i, np.float32)},
                     state=lambda i=i: {"s": np.full(1, 100 + i, np.float32)})
    assert [u["x"][:, 0].tolist() for u in out] == [list(range(s, s + 7)) for s in (0, 3, 6, 9)]
    assert [u["state/s"][0, 0] for u in out] == [100, 103, 106, 109]


@pytest.mark.parametrize("overlap", [1, 4])
def test_recorder_writes_every_row_of_the_buffers_it_hands_over(monkeypatch, overlap):
    """Its buffers are not zeroed (`UnrollRecorder._empty`): poisoned here, and no poison may
    come out, through overlaps, a restart in the middle of an unroll and state fields."""
    fresh = UnrollRecorder._empty

    def poisoned(self):
        buffers = fresh(self)
        for buffer in buffers.values():
            buffer.fill(-1)
        return buffers

    monkeypatch.setattr(UnrollRecorder, "_empty", poisoned)
    out = []
    specs = {"x": ArraySpec((3,), "float32"), "state/s": ArraySpec((), "float32")}
    rec = UnrollRecorder(specs, 2, 2, 6, keep(out), overlap=overlap)
    for i in range(40):  # Both workers in each batch; worker 1 restarts at step 9.
        rec.record([(0, 1), (1, 2 if i >= 9 else 1)], {"x": np.full((2, 2, 3), i, np.float32)},
                   state=lambda i=i: {"s": np.full((2, 2), i, np.float32)})
    assert len(out) >= 10 and rec.resets == 1
    assert all((unroll[name] != -1).all() for unroll in out for name in unroll)


def test_recorder_writes_each_worker_of_a_batch_at_its_own_step():
    """Worker 1 joins two steps after worker 0, so their unrolls end on different batches;
    the state is fetched once per batch, and only where an unroll begins."""
    out, fetched = [], []
    specs = {"x": ArraySpec((), "float32"), "state/s": ArraySpec((), "float32")}
    rec = UnrollRecorder(specs, 2, 1, 2, lambda unroll, versions: out.append(
        (unroll["x"][:, 0].tolist(), unroll["state/s"][0, 0], versions.tolist())))

    def state(i, workers):
        fetched.append(i)
        return {"s": np.array([[100 * w + i] for w in workers], np.float32)}

    for i in range(6):
        workers = [0] if i < 2 else [1, 0]  # A batch's rows in any order of workers.
        rec.record([(w, 1) for w in workers],
                   {"x": np.array([[10 * w + i] for w in workers], np.float32)},
                   state=lambda i=i, workers=workers: state(i, workers), version=i)
    # Unrolls of 3 steps overlapping by 1: worker 0's begin at steps 0, 2 and 4, worker 1's
    # (from step 2) at 2 and 4.
    assert out == [([0, 1, 2], 0, [0, 1, 2]), ([12, 13, 14], 102, [2, 3, 4]),
                   ([2, 3, 4], 2, [2, 3, 4])]
    assert fetched == [0, 2, 4]


def test_gather_copies_the_workers_rows_in_the_order_given():
    rows = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)  # [W, K, ...]
    out = np.full((8, 2), -1, np.float32)  # A padded batch: two workers fill 6 rows.
    gather(rows, np.array([4, 0]), out[:6])
    assert out[:6].tolist() == rows[[4, 0]].reshape(6, 2).tolist()
    assert (out[6:] == -1).all()


def test_a_batch_takes_up_to_max_batch_envs_and_leaves_the_rest_to_the_next_one():
    arrived = [[Request(w, run_id=1) for w in range(5)]]  # Five workers' steps, at once.
    batching = Batching(lambda timeout_s: arrived.pop() if arrived else [],
                        {"x": ArraySpec((), "float32")}, num_workers=5, envs_per_worker=4,
                        max_batch=8, timeout_s=0.0)
    assert batching.sizes == [4, 8]
    assert [[r.worker_id for r in batching.next_batch()] for _ in range(4)] == [
        [0, 1], [2, 3], [4], []]


def test_a_batch_runs_at_the_smallest_compiled_size_that_holds_it():
    compiled = []

    class Lowered:
        def __init__(self, n):
            self.n = n

        def compile(self):
            compiled.append(self.n)

    batching = Batching(lambda timeout_s: [], {"x": ArraySpec((), "float32")}, num_workers=5,
                        envs_per_worker=4, max_batch=None, timeout_s=0.0)
    assert not batching.compiled_all
    batching.compile(Lowered).join(30)
    assert compiled == [20, 16, 8, 4]  # The largest first: serving starts with it.
    assert batching.compiled_all  # throughput.py's steady window opens on it.
    rows = {"x": np.arange(5 * 4, dtype=np.float32).reshape(5, 4)}  # [W, K]
    assert batching.inputs(rows, np.array([3]))["x"].tolist() == rows["x"][3].tolist()
    padded = batching.inputs(rows, np.array([4, 0, 2]))["x"]
    assert padded.shape == (16,) and padded[:12].tolist() == rows["x"][[4, 0, 2]].ravel().tolist()


def test_batcher_splits_chunks_into_batches_without_losing_columns():
    batcher = UnrollBatcher(sizes=(3,))
    for i in range(4):  # 4 chunks of 2 columns = 8 columns -> 2 batches, 2 left.
        batcher.add({"x": np.full((5, 2), i)})
    first, second = batcher.pop(), batcher.pop()
    assert batcher.pop() is None
    assert first["x"][0].tolist() == [0, 0, 1] and second["x"][0].tolist() == [1, 2, 2]
    batcher.add({"x": np.full((5, 2), 9)})
    assert batcher.pop()["x"][0].tolist() == [3, 3, 9]
