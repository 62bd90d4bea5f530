"""R2D2's sequences through central inference into its prioritized table: episode
boundaries are marked, no sequence spans a worker restart, each carries its slot's epsilon;
the learner writes the priorities it computed back; data-parallel updates match on 1, 2 and
4 devices."""

import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from tests.multidevice import assert_devices_match, run_with_cpu_devices
from trellis import reverb_tables as rt
from trellis.agents.common import make_optimizer
from trellis.agents.r2d2 import R2D2Builder, R2D2Config
from trellis.agents.r2d2.builder import epsilon_ladder
from trellis.agents.r2d2.learner import make_update
from trellis.builders.contract.agent import REPLAY_KEY
from trellis.builders.experiments.feeds import ReplayFeed, agent_table
from trellis.builders.experiments.inference import InferenceServer, InferenceSettings, ServedPolicy
from trellis.envs.specs import EnvSpec

SPEC = EnvSpec((4,), "float32", 2, (), "int32")
WORKERS, K = 2, 3
# Small sequences; a rate limiter that never blocks the single-threaded driver below.
CONFIG = R2D2Config(burn_in=2, trace_length=4, unroll_length=3, batch_size=4, hidden_sizes=(8,),
                    lstm_size=8, n_step=2, min_replay_size=4, replay_size=10_000,
                    error_buffer=1e6, target_update_period=1000)


class SlotEnvs:
    """K fake envs of one worker run; obs = (run id, episode id, step in episode, slot).

    Episodes last 2 to 9 steps; the final observation (terminated or truncated) is followed
    by the first of the next episode, as with Gymnasium's next-step autoreset.
    """

    def __init__(self, worker, run_id, rng):
        self.worker, self.run_id, self.rng = worker, run_id, rng
        self.episode = np.arange(K) * 1000 + run_id * 100_000
        self.t = np.zeros(K, int)
        self.length = rng.integers(2, 10, K)
        self.ended = np.zeros(K, bool)
        self.started = False

    def step(self):
        first = self.ended | (not self.started)
        self.started = True
        self.episode = np.where(self.ended, self.episode + 1, self.episode)
        self.t = np.where(first, 0, self.t + 1)
        self.length = np.where(first, self.rng.integers(2, 10, K), self.length)
        ended = self.t == self.length
        truncated = ended & (self.rng.random(K) < 0.5)
        self.ended = ended
        slots = self.worker * K + np.arange(K)
        obs = np.stack([np.full(K, self.run_id), self.episode, self.t, slots], -1)
        return dict(obs=obs.astype(np.float32), reward=np.ones(K, np.float32),
                    terminated=ended & ~truncated, truncated=truncated, first=first)


@pytest.fixture(scope="module")
def filled(steps=40, restart_at=16):
    """Inference driven by two workers for 40 steps (worker 0 restarts at step 16) into
    R2D2's table."""
    builder = R2D2Builder(CONFIG)
    networks = builder.make_networks(SPEC)
    table = agent_table(builder, SPEC)
    client = rt.ReplayClient(rt.ReplayNode([table], seed=0))
    stop = threading.Event()
    feed = ReplayFeed(client, table.name, CONFIG.batch_size, stop)
    queue_spec = builder.queue_spec()
    initial_state = builder.initial_state(SPEC, WORKERS * K)
    server = InferenceServer(
        ServedPolicy(builder.make_policy(networks), networks.init(jax.random.PRNGKey(0)),
                     jax.random.PRNGKey(1), SPEC, {}, initial_state),
        InferenceSettings(WORKERS, K, queue_spec.unroll_length, overlap=queue_spec.overlap,
                          timeout_s=0.0),
        feed.put, stop)
    server.start()
    rng = np.random.default_rng(0)
    envs = [SlotEnvs(w, 1, rng) for w in range(WORKERS)]
    try:
        for i in range(steps):
            if i == restart_at:
                envs[0] = SlotEnvs(0, 2, rng)  # A new process: new run id, every env first.
            for w, env in enumerate(envs):
                assert server.step(w, env.run_id, env.step()) is not None
    finally:
        stop.set()
        server.join(timeout=10)
        feed.close()  # Inserts are streamed: wait until the table has them all.
    return builder, networks, client, table, feed


def test_sequences_mark_episode_boundaries_and_never_span_a_restart(filled):
    _, _, client, table, _ = filled
    size = client.info(table.name)["size"]
    # Per slot, a sequence starts every 3 steps once 2 + 4 + 1 = 7 are recorded: 12 in 40
    # steps; worker 0's first run is cut after 16 steps (4 each), its second has 24 (6 each).
    assert size == 3 * 12 + 3 * (4 + 6), size
    sample = client.sample(table.name, 2000)
    assert len(np.unique(sample.keys)) == size  # Every sequence was drawn: all are checked.
    data = sample.data
    obs = data["obs"]  # [N, 7, 4]
    run, episode, t, slot = (obs[..., i] for i in range(4))
    assert data["obs"].shape[1] == CONFIG.sequence_length
    assert np.all(run == run[:, :1]), "a sequence spans a worker restart"
    assert np.all(slot == slot[:, :1]), "a sequence mixes env slots"
    assert set(np.unique(run[slot[:, 0] < K])) == {1.0, 2.0}  # Both runs of worker 0 are in.
    new_episode = episode[:, 1:] != episode[:, :-1]
    np.testing.assert_array_equal(new_episode, data["first"][:, 1:])
    # Within an episode, consecutive steps; a new episode starts at its step 0.
    np.testing.assert_array_equal(t[:, 1:][~new_episode], t[:, :-1][~new_episode] + 1)
    assert np.all(t[:, 1:][new_episode] == 0)
    assert new_episode.any()  # The check above saw boundaries inside sequences.
    # Each sequence carries its slot's epsilon (fixed per slot) and an LSTM state.
    ladder = epsilon_ladder(WORKERS * K, CONFIG.epsilon, CONFIG.epsilon_alpha)
    np.testing.assert_allclose(data["state/epsilon"][:, 0], ladder[slot[:, 0].astype(int)])
    assert data["state/c"].shape == (2000, 1, CONFIG.lstm_size)


class CountingInfo:
    """A replay client that counts `info` calls: the feed makes one when it starts and one
    each time it finds where a broken insert stream must resume."""

    def __init__(self, client):
        self.client, self.infos = client, 0

    def info(self, table):
        self.infos += 1
        return self.client.info(table)

    def __getattr__(self, name):
        return getattr(self.client, name)


def wait_for(condition, deadline_s=30.0):
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_feed_streams_every_item_once_in_order_when_the_rate_limiter_holds_inserts_back():
    # A queue of 4 items: once it is full every insert waits at the rate limiter, times out
    # after 20 ms, and the writer drops what queued behind it; the feed must resend exactly
    # those.
    replay = CountingInfo(rt.ReplayClient(rt.ReplayNode([rt.TableSpec.queue("q", 4)])))
    stop = threading.Event()
    feed = ReplayFeed(replay, "q", 1, stop, max_in_flight=8, insert_timeout_s=0.02)
    chunks, k = 40, 3
    producer = threading.Thread(target=lambda: [
        feed.put({"x": np.tile(np.arange(c * k, (c + 1) * k), (2, 1))},  # [T + 1 = 2, K]
                 np.zeros(2, np.int64))
        for c in range(chunks)])
    producer.start()
    received = []
    try:
        for _ in range(3):  # Let the stream break and resume three times, then drain a bit.
            resumed = replay.infos
            wait_for(lambda: replay.infos > resumed)  # noqa: B023
            for _ in range(10):
                received.append(replay.sample("q", 1, timeout_s=30).data["x"][0, 0])
        while len(received) < chunks * k:
            received.append(replay.sample("q", 1, timeout_s=30).data["x"][0, 0])
        producer.join(timeout=30)
        assert not producer.is_alive()
    finally:
        stop.set()
        producer.join(timeout=30)
        feed.close()
    np.testing.assert_array_equal(np.asarray(received), np.arange(chunks * k))
    assert replay.info("q")["num_inserts"] == chunks * k  # Nothing was inserted twice.


class RecordingReplay:
    """A replay client that also keeps the priority updates it forwards."""

    def __init__(self, client):
        self.client, self.updates = client, []

    def update_priorities(self, table, updates):
        self.updates.append(dict(updates))
        return self.client.update_priorities(table, updates)


def test_learner_writes_the_priorities_it_computed_back(filled):
    builder, networks, client, table, feed = filled
    replay = RecordingReplay(client)
    learner = builder.make_learner(networks, SPEC, jax.random.PRNGKey(3), replay=replay)
    batch = feed.next_batch()
    assert batch["obs"].shape == (CONFIG.sequence_length, CONFIG.batch_size, 4)
    assert batch["state/c"].shape == (1, CONFIG.batch_size, CONFIG.lstm_size)
    # What the pure update gives from the same state (the learner runs the same function).
    update = jax.jit(make_update(networks, make_optimizer(CONFIG), CONFIG))
    _, expected = update(learner.state, {k: v for k, v in batch.items() if k != REPLAY_KEY})
    metrics = learner.step(batch)
    assert "priorities" not in metrics and np.isfinite(float(metrics["loss"]))
    (written,) = replay.updates
    assert set(written) == set(batch[REPLAY_KEY].tolist())
    by_key = dict(zip(batch[REPLAY_KEY].tolist(), np.asarray(expected["priorities"]).tolist(),
                      strict=True))
    np.testing.assert_allclose([written[k] for k in by_key], list(by_key.values()), rtol=1e-6)
    # The table holds them: a large sample of it shows each written priority.
    sample = client.sample(table.name, 3000)
    held = dict(zip(sample.keys.tolist(), sample.priorities.tolist(), strict=True))
    for key, priority in by_key.items():
        if key in held:
            np.testing.assert_allclose(held[key], priority, rtol=1e-6)
    assert sum(key in held for key in by_key) >= 2


SCRIPT = textwrap.dedent("""
    import json
    import jax, numpy as np
    from trellis.agents.r2d2 import R2D2Builder, R2D2Config
    from trellis.agents.r2d2.learner import Learner
    from trellis.builders.contract.agent import REPLAY_KEY, REPLAY_PROBABILITY, REPLAY_TABLE_SIZE
    from trellis.envs.specs import EnvSpec

    config = R2D2Config(burn_in=2, trace_length=4, unroll_length=3, batch_size=8,
                        hidden_sizes=(8,), lstm_size=8, n_step=2, min_replay_size=4)
    builder = R2D2Builder(config)
    spec = EnvSpec((4,), "float32", 2, (), "int32")
    networks = builder.make_networks(spec)
    rng = np.random.default_rng(0)
    L, B, H = config.sequence_length, 8, 8
    first = rng.random((L, B)) < 0.15
    terminated = np.zeros((L, B), bool)
    terminated[:-1] = first[1:]
    batch = {
        "obs": rng.normal(size=(L, B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (L, B)).astype(np.int32),
        "reward": rng.normal(size=(L, B)).astype(np.float32),
        "terminated": terminated, "truncated": np.zeros((L, B), bool), "first": first,
        "state/c": rng.normal(size=(1, B, H)).astype(np.float32),
        "state/h": rng.normal(size=(1, B, H)).astype(np.float32),
        "state/epsilon": np.full((1, B), 0.1, np.float32),
        REPLAY_PROBABILITY: rng.uniform(0.01, 0.2, (1, B)).astype(np.float32),
        REPLAY_TABLE_SIZE: np.full((1, B), 50.0, np.float32),
        REPLAY_KEY: np.arange(B, dtype=np.uint64),
    }

    class Sink:
        def update_priorities(self, table, updates):
            self.last = updates

    out = {}
    for n in (1, 2, 4):
        sink = Sink()
        learner = Learner(networks, config, jax.random.PRNGKey(0), sink, "sequences",
                          jax.devices()[:n])
        for _ in range(3):
            metrics = learner.step(batch)
        leaves = jax.tree.leaves(jax.device_get(learner.params))
        out[n] = {"params": [np.asarray(x).ravel().tolist() for x in leaves]
                  + [sorted(sink.last.values())],
                  "loss": float(metrics["loss"]),
                  "shards": len(jax.tree.leaves(learner.params)[0].sharding.device_set)}
    print(json.dumps(out))
""")


@pytest.mark.slow  # 14 s; DataParallelLearner's sharding is checked in the default suite by
# test_impala_learner's and test_ppo_learner's versions of this test.
def test_two_and_four_devices_match_one_device():
    result = run_with_cpu_devices(SCRIPT, num_devices=4, timeout=240)
    assert set(result) == {"1", "2", "4"}
    assert_devices_match(result)
