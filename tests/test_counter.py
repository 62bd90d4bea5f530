"""The run's counter: counts, the return window, time across sessions, the checkpoint form."""

import json
import subprocess
import sys
import threading

import pytest

from trellis.builders.experiments.counter import (
    Counter,
    CounterSnapshot,
    ReturnWindow,
    StepRate,
    combined_stats,
)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


def test_counts_steps_episodes_and_learner_steps():
    counter = Counter(return_window=3)
    counter.add_env_steps(8)
    counter.add_env_steps(8, [(10.0, 4), (20.0, 6)])
    counter.add_learner_step()
    snap = counter.snapshot()
    assert (snap.env_steps, snap.episodes, snap.learner_steps) == (16, 2, 1)
    assert counter.env_steps() == 16
    assert snap.returns == (10.0, 20.0) and snap.lengths == (4, 6)


def test_window_keeps_exactly_the_last_return_window_episodes():
    counter = Counter(return_window=3)
    counter.add_env_steps(4, [(1.0, 1), (2.0, 2), (3.0, 3), (4.0, 4)])
    counter.add_env_steps(1, [(8.0, 8)])
    stats = counter.snapshot().stats()
    # Window: returns 3, 4, 8 (1 and 2 fell out); episodes still counts all five.
    assert stats["episodes"] == 5
    assert stats["returns_in_window"] == 3
    assert stats["mean_return"] == pytest.approx(5.0)
    assert (stats["min_return"], stats["max_return"]) == (3.0, 8.0)
    assert stats["mean_episode_length"] == pytest.approx(5.0)


def test_stats_before_any_episode_have_no_return():
    stats = Counter(return_window=5).snapshot().stats()
    assert stats["returns_in_window"] == 0
    assert stats["mean_return"] is None and stats["min_return"] is None
    assert stats["max_return"] is None and stats["mean_episode_length"] is None
    assert stats["resumes"] == 0


def test_elapsed_counts_from_session_start():
    clock = FakeClock(100.0)
    counter = Counter(return_window=2, clock=clock)
    clock.now = 130.0  # Set-up time: not training.
    counter.start_session()
    clock.now = 142.5
    assert counter.snapshot().elapsed_s == pytest.approx(12.5)


def test_checkpoint_form_round_trips_through_json_and_continues():
    clock = FakeClock(0.0)
    counter = Counter(return_window=3, clock=clock)
    counter.add_env_steps(40, [(1.0, 10), (2.0, 20), (3.0, 30), (4.0, 40)])
    for _ in range(5):
        counter.add_learner_step()
    clock.now = 7.0
    progress = json.loads(json.dumps(counter.snapshot().progress()))  # As orbax's JsonSave.
    assert progress == {
        "env_steps": 40, "learner_steps": 5, "episodes": 4, "returns": [2.0, 3.0, 4.0],
        "lengths": [20, 30, 40], "elapsed_s": 7.0, "resumes": 0,
    }

    later = FakeClock(1000.0)
    resumed = Counter.restore(progress, return_window=3, clock=later)
    later.now = 1003.0
    snap = resumed.snapshot()
    assert (snap.env_steps, snap.learner_steps, snap.episodes) == (40, 5, 4)
    assert snap.returns == (2.0, 3.0, 4.0) and snap.lengths == (20, 30, 40)
    assert snap.elapsed_s == pytest.approx(7.0 + 3.0)  # Time goes on across sessions.
    assert snap.resumes == 1
    resumed.add_env_steps(2, [(9.0, 2)])
    assert resumed.snapshot().returns == (3.0, 4.0, 9.0)
    again = Counter.restore(resumed.snapshot().progress(), return_window=3)
    assert again.snapshot().resumes == 2


def test_restore_into_a_smaller_window_keeps_the_newest_returns():
    progress = {"env_steps": 5, "learner_steps": 0, "episodes": 3, "returns": [1.0, 2.0, 3.0],
                "lengths": [1, 2, 3], "elapsed_s": 0.0, "resumes": 0}
    assert Counter.restore(progress, return_window=2).snapshot().returns == (2.0, 3.0)


def test_restore_requires_the_step_counts():
    with pytest.raises(KeyError, match="learner_steps"):
        Counter.restore({"env_steps": 3}, return_window=2)


def test_return_window_must_be_positive():
    with pytest.raises(ValueError, match="return_window must be >= 1, got 0"):
        Counter(return_window=0)


def test_return_window_counts_every_episode_keeps_the_last_and_continues_from_progress():
    window = ReturnWindow(2)
    window.add([1.0, 2.0, 3.0], [10, 20, 30])
    window.add([-1.0])  # A game's outcome: no length.
    assert (window.episodes, window.returns, window.lengths) == (4, (3.0, -1.0), (20, 30))
    snapshot = CounterSnapshot(5, 1, window.episodes, window.returns, window.lengths, 0.0, 0)
    resumed = ReturnWindow(1, json.loads(json.dumps(snapshot.progress())))
    assert (resumed.episodes, resumed.returns, resumed.lengths) == (4, (-1.0,), (30,))


def _snapshot(returns, episodes=None, env_steps=64, lengths=()):
    return CounterSnapshot(env_steps, 2, len(returns) if episodes is None else episodes,
                           tuple(returns), tuple(lengths), 1.5, 0)


def test_window_mean_is_over_the_last_window_once_it_is_full():
    snapshot = _snapshot([10.0, 1.0, 2.0, 3.0])
    assert snapshot.window_mean(3) == pytest.approx(2.0)
    assert snapshot.window_mean(4) == pytest.approx(4.0)
    assert snapshot.window_mean(5) is None


def test_combined_stats_of_one_member_are_its_own():
    snapshot = _snapshot([1.0, 5.0], episodes=7, lengths=(3, 9))
    assert combined_stats([snapshot]) == snapshot.stats()


def test_combined_stats_of_members_mean_their_means_and_sum_their_episodes():
    stats = combined_stats([_snapshot([0.0, 2.0], episodes=5, lengths=(1, 3)),
                            _snapshot([10.0], episodes=1, lengths=(8,)), _snapshot([])])
    # Members' means 1 and 10 (the third has none yet); min and max over all windows.
    assert stats["mean_return"] == pytest.approx(5.5)
    assert (stats["min_return"], stats["max_return"]) == (0.0, 10.0)
    assert stats["episodes"] == 6 and stats["returns_in_window"] == 0
    assert stats["mean_episode_length"] == pytest.approx(4.0)
    assert (stats["env_steps"], stats["learner_steps"], stats["elapsed_s"]) == (64, 2, 1.5)


def test_concurrent_updates_lose_no_counts():
    counter = Counter(return_window=10)
    threads, rounds = 8, 2_000
    start = threading.Barrier(threads)

    def work(i):
        start.wait()
        for _ in range(rounds):
            counter.add_env_steps(3, [(float(i), 1)])
            counter.add_learner_step()
            counter.snapshot()  # Readers race with the writers too.

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    snap = counter.snapshot()
    assert snap.env_steps == 3 * threads * rounds
    assert snap.episodes == snap.learner_steps == threads * rounds
    assert len(snap.returns) == len(snap.lengths) == 10


def test_step_rate_measures_over_the_last_window():
    clock = FakeClock(0.0)
    rate = StepRate(steps=100, window_s=5.0, clock=clock)
    assert rate.update(100) == 0.0  # No time yet.
    clock.now = 2.0
    assert rate.update(500) == pytest.approx(200.0)  # 400 steps in 2 s, since the start.
    # A burst of 1,000 steps at 4 s, then none: reads 0.2 s apart still count it (a rate
    # since the last read said 0).
    clock.now = 4.0
    assert rate.update(1_500) == pytest.approx(1_400 / 4.0)
    for now, expected in ((4.2, 1_400 / 4.2), (4.4, 1_400 / 4.4), (6.0, 1_400 / 6.0),
                          (8.0, 1_000 / 6.0)):  # From the sample at 2 s, the newest >= 5 s old.
        clock.now = now
        assert rate.update(1_500) == pytest.approx(expected)
    # Once no sample in the window saw a step: none counted for 5 s.
    clock.now = 9.5
    assert rate.update(1_500) == pytest.approx(0.0)


def test_counter_and_stop_rule_import_no_jax():
    code = ("import sys, trellis.builders.experiments.counter, trellis.builders.experiments.stop; "
            "assert 'jax' not in sys.modules, 'jax was imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
