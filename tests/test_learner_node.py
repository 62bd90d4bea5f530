"""The learner node: its parts (feed, update, stats), and end to end on threads: budget stop,
stats, resume."""

import dataclasses
import threading
import time
import types

import jax
import numpy as np
import pytest

from trellis.agents.common import DataParallelLearner
from trellis.agents.dqn import DQNBuilder, DQNConfig
from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.agents.r2d2 import R2D2Builder, R2D2Config
from trellis.agents.sac import SACBuilder, SACConfig
from trellis.builders.contract.agent import QueueSpec
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.checkpointing import (
    Checkpoints,
    checkpoint_dir,
    latest_checkpoint,
)
from trellis.builders.experiments.counter import Counter
from trellis.builders.experiments.feeds import (
    POLICY_VERSION,
    Prefetch,
    UnrollFeed,
    batch_sizes,
    max_unrolls,
)
from trellis.builders.experiments.learner_node import LearnerNode
from trellis.builders.experiments.learner_stats import (
    LearnerStats,
    PolicyLag,
    inference_batch_mean,
)
from trellis.builders.experiments.learner_update import (
    CompileAhead,
    LearnerUpdate,
    out_of_memory_message,
)
from trellis.builders.experiments.program import make_program
from trellis.builders.experiments.unroll_queue import LocalUnrollQueue
from trellis.envs import GymnasiumFactory
from trellis.launch import runtime

# Every key of `stats()` besides the learner's metrics: run directories depend on them.
STATS_KEYS = {
    "env_steps", "learner_steps", "episodes", "mean_return", "min_return", "max_return",
    "returns_in_window", "mean_episode_length", "evaluation", "elapsed_s", "resumes",
    "env_steps_per_s", "inference_batches", "slot_resets", "queue_size",
}
PROGRESS_KEYS = {"env_steps", "learner_steps", "episodes", "returns", "lengths", "elapsed_s",
                 "resumes"}
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # JAX's event per XLA compile.


def _run(config, checkpoints):
    """Runs IMPALA on CartPole on threads until it stops by itself; its LaunchResult."""
    builder = ImpalaBuilder(ImpalaConfig(batch_size=8, unroll_length=10))
    program = make_program(builder, GymnasiumFactory("CartPole-v1"), config, name="learner_node",
                           checkpoints=checkpoints)
    running = runtime.launch(program, platform="local_mt", block=False)
    try:
        result = running.wait(timeout=120)
    finally:
        running.stop()
    assert result is not None, "the run did not stop by itself"
    return result


def test_budget_stop_reports_every_stat_and_checkpoints_the_same_counts(tmp_path):
    config = ExperimentConfig(num_actors=1, envs_per_actor=8, total_env_steps=3_000,
                              return_window=5, log_every_s=0.1, eval_every=0)
    result = _run(config, Checkpoints(checkpoint_dir(str(tmp_path))))

    assert (result.stopped_by, result.reason) == ("requested", "budget"), result
    stats = result.info
    assert STATS_KEYS <= set(stats), STATS_KEYS - set(stats)
    assert {"loss", "entropy"} <= set(stats), "the learner's metrics are reported too"
    assert stats["env_steps"] >= config.total_env_steps and stats["learner_steps"] > 0
    assert 0 < stats["returns_in_window"] <= config.return_window
    assert stats["resumes"] == 0 and stats["evaluation"] is None
    # The last checkpoint is written before the stop request, so it holds the same counts.
    step, progress = latest_checkpoint(str(tmp_path))
    assert set(progress) == PROGRESS_KEYS
    assert step == progress["env_steps"] == stats["env_steps"]
    assert progress["learner_steps"] == stats["learner_steps"]
    assert progress["episodes"] == stats["episodes"]
    assert len(progress["returns"]) == stats["returns_in_window"]

    # Resumed with a larger budget, the counters go on from the checkpoint.
    more = dataclasses.replace(config, total_env_steps=step + 2_000)
    resumed = _run(more, Checkpoints(checkpoint_dir(str(tmp_path)), resume_step=step)).info
    assert resumed["resumes"] == 1
    assert resumed["env_steps"] >= step + 2_000
    assert resumed["learner_steps"] > progress["learner_steps"]
    assert resumed["episodes"] > progress["episodes"]
    assert resumed["elapsed_s"] > progress["elapsed_s"]


@pytest.fixture
def compiles_in_updates(monkeypatch):
    """{"compiles", "updates"}: XLA's backend compiles made inside `DataParallelLearner.step`
    (the learner's update call, on any thread), and the calls, during the test."""
    counts = {"compiles": 0, "updates": 0}
    inside = threading.local()
    step = DataParallelLearner.step

    def counted_step(learner, batch):
        inside.on = True
        try:
            return step(learner, batch)
        finally:
            inside.on = False
            counts["updates"] += 1

    def listen(event, duration_s, **kwargs):
        if event == BACKEND_COMPILE and getattr(inside, "on", False):
            counts["compiles"] += 1

    monkeypatch.setattr(DataParallelLearner, "step", counted_step)
    jax.monitoring.register_event_duration_secs_listener(listen)
    yield counts
    jax.monitoring.unregister_event_duration_listener(listen)


@pytest.mark.parametrize("builder, env_id", [
    (ImpalaBuilder(ImpalaConfig(batch_size=8, unroll_length=10)), "CartPole-v1"),
    (DQNBuilder(DQNConfig(min_replay_size=200, updates_per_step=2, sample_batch_size=32)),
     "CartPole-v1"),
    (SACBuilder(SACConfig(min_replay_size=200, updates_per_step=2, sample_batch_size=32)),
     "Pendulum-v1"),
    (R2D2Builder(R2D2Config(burn_in=2, trace_length=4, unroll_length=4, batch_size=8,
                            min_replay_size=16, replay_size=256)), "CartPole-v1"),
], ids=["impala", "dqn", "sac", "r2d2"])
def test_the_learners_first_update_is_compiled_before_its_batch_comes(builder, env_id,
                                                                      compiles_in_updates):
    """The learner node compiles the update beside the start (`CompileAhead`), also where it
    takes other batches than the unrolls (a replay learner's sampled minibatches, R2D2's
    sampled sequences): no update waits for its compile, and the stop rule is not kept
    waiting by one."""
    config = ExperimentConfig(num_actors=1, envs_per_actor=8, total_env_steps=4_000,
                              log_every_s=0.1, eval_every=0)
    program = make_program(builder, GymnasiumFactory(env_id), config, name="compile_ahead")
    running = runtime.launch(program, platform="local_mt", block=False)
    try:
        result = running.wait(timeout=120)
    finally:
        running.stop()
    assert result is not None and result.reason == "budget", result
    counts = compiles_in_updates
    assert result.info["learner_steps"] > 0 and counts["updates"] > 0
    assert counts["compiles"] == 0, counts


def chunk(first_column, columns, t=3):
    """An unroll chunk [T + 1, K] whose column j holds the number first_column + j."""
    return {"x": np.tile(np.arange(first_column, first_column + columns), (t + 1, 1))}


def test_feed_batches_unrolls_in_order_across_chunk_boundaries():
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=4), sizes=(3,), stop=threading.Event())
    for first in (0, 2, 4):  # Three chunks of two columns: 0..5.
        feed.put(chunk(first, 2), np.arange(4) + first)
    assert feed.size() == 3
    batches = [feed.next_batch(), feed.next_batch()]
    assert [b["x"][0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    # Each column keeps its chunk's versions (chunk c's step t: t + 2c).
    assert [b[POLICY_VERSION].T.tolist() for b in batches] == [
        [[0, 1, 2, 3], [0, 1, 2, 3], [2, 3, 4, 5]], [[2, 3, 4, 5], [4, 5, 6, 7], [4, 5, 6, 7]]]
    assert all(b["x"].shape == (4, 3) for b in batches)
    assert feed.next_batch() is None  # Dry: no partial batch.


def test_auto_batch_sizes_double_from_a_quarter_of_the_envs_unrolls_up_to_all_of_them():
    spec = QueueSpec(unroll_length=5, batch_size=32, max_batches=8)
    config = ExperimentConfig(num_actors=14, envs_per_actor=32)  # 448 envs.
    assert batch_sizes(spec, config) == (128, 256)  # 448 / 4 = 112 <= 128; 512 > 448.
    assert batch_sizes(spec, dataclasses.replace(config, num_actors=32)) == (256, 512, 1024)
    assert batch_sizes(spec, dataclasses.replace(config, num_actors=2)) == (32, 64)
    assert batch_sizes(spec, dataclasses.replace(config, num_actors=1)) == (32,)
    assert batch_sizes(spec, dataclasses.replace(config, envs_per_actor=2)) == (32,)  # 28.
    assert batch_sizes(spec, dataclasses.replace(config, learner_batch="fixed")) == (32,)
    # 8 of the smallest batches (32 unrolls of 32 envs), but no more than two of the largest.
    assert max_unrolls(spec, config) == 16
    assert max_unrolls(spec, config, largest=128) == 8  # While the update takes 128 at most.
    assert max_unrolls(dataclasses.replace(spec, max_batches=1), config) == 4
    assert max_unrolls(spec, dataclasses.replace(config, learner_batch="fixed")) == 8


def test_auto_batch_takes_what_waits_up_to_the_largest_size_allowed():
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=8), sizes=(2, 4, 8), stop=threading.Event())
    feed.put(chunk(0, 2), np.zeros(4, np.int64))
    assert feed.next_batch()["x"][0].tolist() == [0, 1]  # Nothing more waits: the smallest.
    for first in range(2, 14, 2):  # Six chunks, 12 columns: 2..13.
        feed.put(chunk(first, 2), np.zeros(4, np.int64))
    # Until `allow` (the learner's update compiled for larger sizes), the smallest only.
    assert feed.next_batch()["x"][0].tolist() == [2, 3]
    feed.allow(4)
    feed.allow(8)
    assert feed.next_batch()["x"][0].tolist() == list(range(4, 12))  # 8 of 10.
    assert feed.next_batch()["x"][0].tolist() == [12, 13]  # The 2 left.
    assert feed.next_batch() is None


def test_the_feed_asks_for_a_larger_size_after_three_capped_batches_in_a_row():
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=16), sizes=(2, 4), stop=threading.Event())
    for first in range(0, 8, 2):  # 8 columns: batches of 2 with more waiting behind each.
        feed.put(chunk(first, 2), np.zeros(4, np.int64))
    for _ in range(2):
        feed.next_batch()
    assert not feed.backlog.is_set()  # Two capped batches may be a burst.
    feed.next_batch()
    assert feed.backlog.is_set()
    feed.allow(4)  # Compiled: the next size waits for batches this one caps.
    assert not feed.backlog.is_set()
    feed.next_batch()  # The last 2 columns, nothing behind them: not capped.
    for first in range(8, 32, 2):  # 24 columns: three batches of 4, each with more behind...
        feed.put(chunk(first, 2), np.zeros(4, np.int64))
    for _ in range(3):
        feed.next_batch()
    assert feed.backlog.is_set()
    # ...while a queue that a batch empties is not a backlog.
    drained = UnrollFeed(LocalUnrollQueue(max_unrolls=16), sizes=(2, 4), stop=threading.Event())
    for _ in range(4):
        drained.put(chunk(0, 2), np.zeros(4, np.int64))
        drained.next_batch()
    assert not drained.backlog.is_set()


def test_a_larger_size_is_compiled_only_once_the_feed_wants_it():
    compiled, stop = [], threading.Event()
    learner = types.SimpleNamespace(compile=lambda batch: compiled.append(batch["n"]))
    policy_compiled, wanted = threading.Event(), threading.Event()
    ahead = CompileAhead(learner, {2: {"n": 2}, 4: {"n": 4}}, policy_compiled, wanted, stop,
                         on_compiled=lambda size: wanted.clear())
    assert ahead.first.wait(10) and compiled == [2]
    first_at = ahead.compiled_at
    assert first_at is not None
    policy_compiled.set()
    time.sleep(0.3)
    assert compiled == [2]  # Serving started, but no batch waits for a larger size.
    assert ahead.compiled_at == first_at
    wanted.set()
    deadline = time.monotonic() + 10
    while compiled != [2, 4] and time.monotonic() < deadline:
        time.sleep(0.01)
    ahead.close()
    # The larger size's compile is when a run's rate settles (throughput.py's steady window).
    assert compiled == [2, 4] and ahead.compiled_at >= first_at + 0.3
    # A learner that ends before the program's stop (its loop raised) ends the wait for a
    # size nobody wanted: its node then fails at once instead of waiting for the stop.
    ahead = CompileAhead(learner, {2: {"n": 2}, 4: {"n": 4}}, policy_compiled, threading.Event(),
                         stop, on_compiled=lambda size: None)
    closing = threading.Thread(target=ahead.close)
    closing.start()
    closing.join(10)
    assert not closing.is_alive() and compiled == [2, 4, 2]
    # So does a stop.
    ahead = CompileAhead(learner, {2: {"n": 2}, 4: {"n": 4}}, policy_compiled, threading.Event(),
                         stop, on_compiled=lambda size: None)
    stop.set()
    ahead.close()
    assert compiled == [2, 4, 2, 2]


def test_fewer_unrolls_wait_until_the_larger_sizes_are_allowed():
    # Issue 21's 32 workers with a cold compile cache: the update compiled for the smallest
    # size only, the queue sized for the largest filled with unrolls that the smallest
    # batches drained over many updates (a policy lag of 14-15 updates).
    stop = threading.Event()
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=8), sizes=(2, 4), stop=stop,
                      max_waiting={2: 2, 4: 4})
    puts = [threading.Thread(target=feed.put, args=(chunk(2 * i, 2), np.zeros(4, np.int64)))
            for i in range(5)]
    try:
        for put in puts[:2]:
            put.start()
            put.join(timeout=10)
        puts[2].start()
        puts[2].join(timeout=0.3)
        assert puts[2].is_alive(), "two unrolls wait for batches of 2: the third must wait"
        assert feed.next_batch()["x"][0].tolist() == [0, 1]  # Room for one more.
        puts[2].join(timeout=10)
        assert not puts[2].is_alive()
        assert feed.size() == 2
        puts[3].start()
        puts[3].join(timeout=0.3)
        assert puts[3].is_alive()
        feed.allow(4)  # Batches of 4 from now on: four may wait.
        puts[3].join(timeout=10)
        assert not puts[3].is_alive()
        puts[4].start()
        puts[4].join(timeout=10)
        assert feed.size() == 4
        assert feed.next_batch()["x"][0].tolist() == [2, 3, 4, 5]
    finally:
        stop.set()
        for put in puts:
            if put.ident is not None:  # Started.
                put.join(timeout=10)
    assert not any(put.is_alive() for put in puts)


def test_prefetch_prepares_the_next_batch_once_the_learner_took_the_one_before():
    stop = threading.Event()
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=8), sizes=(2,), stop=stop)
    for first in (0, 2, 4):
        feed.put(chunk(first, 2), np.arange(4) + first)
    prepared = []

    def prepare(batch):
        prepared.append(batch["x"][0].tolist())
        return {"x": batch["x"] * 10}

    prefetch = Prefetch(feed, prepare, stop)
    try:
        wait_for(lambda: prepared == [[0, 1]])
        time.sleep(0.2)
        assert prepared == [[0, 1]], "one batch ahead, no more"
        batch, versions = prefetch.next_batch()
        assert batch["x"][0].tolist() == [0, 10]
        assert versions.T.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]  # Split off, not prepared.
        wait_for(lambda: prepared == [[0, 1], [2, 3]])  # Made ready while the update runs.
        assert prefetch.next_batch()[0]["x"][0].tolist() == [20, 30]
        assert prefetch.next_batch()[0]["x"][0].tolist() == [40, 50]
        assert prefetch.next_batch() is None  # The feed ran dry.
    finally:
        stop.set()
        prefetch.join(timeout_s=5)
    assert not prefetch._thread.is_alive()


def test_prefetch_raises_what_preparing_raised_on_the_learners_thread():
    stop = threading.Event()
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=2), sizes=(2,), stop=stop)
    feed.put(chunk(0, 2), np.zeros(4, np.int64))
    prefetch = Prefetch(feed, lambda batch: 1 / 0, stop)
    try:
        with pytest.raises(ZeroDivisionError):
            wait_for(lambda: prefetch.next_batch() is not None)
    finally:
        stop.set()
        prefetch.join(timeout_s=5)


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_policy_lag_is_updates_between_acting_and_learning_over_the_interval():
    lag = PolicyLag()
    assert lag.take() == {}
    lag.add(np.array([[3, 3], [4, 4], [5, 5]]), learner_steps=5)  # Lags 2 2 1 1 0 0.
    lag.add(np.array([[0], [6]]), learner_steps=7)  # Lags 7 1.
    assert lag.take() == {"policy_lag_mean": 14 / 8, "policy_lag_max": 7.0}
    assert lag.take() == {}  # Taken: the next interval starts empty.


def test_inference_batch_mean_is_env_steps_per_policy_call_over_the_interval():
    # 3 calls since the last log: 96 env steps (say 2 + 1 + 3 workers of 16 envs).
    assert inference_batch_mean((1096, 53), (1000, 50)) == {"inference_batch_mean": 32.0}
    assert inference_batch_mean((1000, 50), (1000, 50)) == {}  # No call: nothing to report.


def test_feed_put_on_a_full_queue_gives_up_at_the_stop():
    stop = threading.Event()
    feed = UnrollFeed(LocalUnrollQueue(max_unrolls=1), sizes=(2,), stop=stop)
    feed.put(chunk(0, 2), np.zeros(4, np.int64))
    blocked = threading.Thread(target=feed.put, args=(chunk(2, 2), np.zeros(4, np.int64)))
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive(), "put must wait while the queue is full"
    stop.set()
    blocked.join(timeout=10)
    assert not blocked.is_alive(), "put must return once the program stops"
    assert feed.size() == 1


def test_out_of_memory_names_the_setting_that_made_the_update_large():
    # An H100 run (issue 21) stopped on XLA's line alone: --learner_batch=auto had grown the
    # IMPALA resnet's update to 256 unrolls.
    oom = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6.54GiB.\nmore detail")
    auto, fixed = ExperimentConfig(), ExperimentConfig(learner_batch="fixed")
    assert out_of_memory_message(oom, 256, auto, 32) == (
        "the learner's update on a batch of 256 unrolls ran out of device memory "
        "(RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6.54GiB.): "
        "--learner_batch=auto grew it to 256 unrolls; --learner_batch=fixed keeps it at "
        "--batch_size=32")
    for config, unrolls in ((auto, 32), (fixed, 32)):  # Already the smallest batch.
        assert out_of_memory_message(oom, unrolls, config, 32).endswith(
            "lower --batch_size or --unroll_length")
    assert out_of_memory_message(oom, None, auto, 32).startswith(
        "the learner's update ran out of device memory (")
    assert out_of_memory_message(jax.errors.JaxRuntimeError("INTERNAL: boom"), 256, auto,
                                 32) is None


class _CountingLearner:
    """A stand-in for an agent's learner: its params are the number of updates it made."""

    def __init__(self):
        self.params = self.state = 0

    def step(self, batch):
        self.params = self.state = self.params + 1
        return {"loss": np.float32(batch["x"].mean())}

    def compile(self, batch):
        del batch

    def place(self, batch):
        return batch

    def restore(self, state):
        self.params = self.state = state


class _Inference:
    """A stand-in for the inference server: records the params handed to it."""

    steps = batches = slot_resets = 0
    compiled_all = True

    def __init__(self):
        self.published = []

    def start(self):
        pass

    def join(self, timeout):
        del timeout

    def set_params(self, params, version):
        self.published.append((params, version))


class _Batches:
    """A stand-in for the prefetched feed: the given batches, then none."""

    def __init__(self, batches):
        self._batches = list(batches)
        self.closed = False

    def next_batch(self):
        if self._batches:
            return self._batches.pop(0)
        time.sleep(0.01)  # As the feed's short wait when nothing is ready.
        return None

    def close(self, timeout_s):
        del timeout_s
        self.closed = True


def test_a_report_never_holds_metrics_of_more_env_steps_than_its_counts():
    """The learner thread may log an update while a report is being made: the report reads
    the metrics first, so a learning-rate factor logged meanwhile (set from env steps beyond
    the report's snapshot) waits for the next report."""
    counter, inference = Counter(return_window=5), _Inference()
    stats = LearnerStats(counter, inference, lambda: 0, lambda: None, log_every_s=0.0)
    counter.add_env_steps(100)
    stats.log({}, {"learning_rate_factor": 0.9})

    def snapshot_while_the_learner_logs():
        snapshot = counter.snapshot()  # 100 env steps; then the learner goes on.
        counter.add_env_steps(100)
        stats.log({}, {"learning_rate_factor": 0.8})
        return snapshot

    report = stats.report(snapshot_while_the_learner_logs)
    assert (report["env_steps"], report["learning_rate_factor"]) == (100, 0.9)
    report = stats.report(counter.snapshot)
    assert (report["env_steps"], report["learning_rate_factor"]) == (200, 0.8)


@pytest.mark.parametrize("log_every_s", [0.0, 3600.0])
def test_the_node_trains_on_the_parts_it_is_given_and_stops_from_outside(log_every_s):
    """The node only moves batches and params between the parts `program.learner_node`
    passes in: each update's params go to inference with the next version and are counted,
    its metrics and policy lag reach `stats()`, and a stop from outside ends `run()` with
    the batches closed. Logged at every update or only at the first, the final stats have
    the last update's metrics."""
    stop = threading.Event()
    learner, inference = _CountingLearner(), _Inference()
    acted_by = np.zeros((3, 2), np.int64)  # Every batch acted by the initial params.
    batches = _Batches([({"x": np.full((3, 2), i, np.float32)}, acted_by) for i in range(3)])
    counter = Counter(return_window=5)
    update = LearnerUpdate(learner, CompileAhead(learner, {}, threading.Event(),
                                                 threading.Event(), stop, lambda size: None),
                           None, ExperimentConfig(), batch_size=2)
    node = LearnerNode(inference, batches, update, counter, lambda snapshot: None,
                       LearnerStats(counter, inference, lambda: 0, lambda: None, log_every_s),
                       checkpointer=None, stop=stop)
    running = threading.Thread(target=node.run)
    running.start()
    deadline = time.monotonic() + 30
    while counter.snapshot().learner_steps < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    running.join(timeout=30)

    assert not running.is_alive(), "run() must return once the program stops"
    assert inference.published == [(1, 1), (2, 2), (3, 3)]
    assert batches.closed
    stats = node.stats()
    assert stats["learner_steps"] == 3 and node.get_params() == 3
    assert stats["loss"] == 2.0  # The last update's metrics.
    # Over the updates since the previous log: the third alone (lag 2), or the second and
    # third (lags 1 and 2) where only the first was logged.
    lag_mean = 2.0 if log_every_s == 0 else 1.5
    assert (stats["policy_lag_mean"], stats["policy_lag_max"]) == (lag_mean, 2.0)
