"""The stop rule: the env-step budget, and the mean return over a full window."""

import pytest

from trellis.builders.experiments.counter import CounterSnapshot
from trellis.builders.experiments.stop import StopRule


def snapshot(env_steps=0, returns=()):
    return CounterSnapshot(env_steps=env_steps, learner_steps=0, episodes=len(returns),
                           returns=tuple(returns), lengths=tuple(1 for _ in returns),
                           elapsed_s=0.0, resumes=0)


def test_budget_is_hit_exactly_at_total_env_steps():
    rule = StopRule(total_env_steps=1_000)
    assert rule(snapshot(env_steps=999)) is None
    assert rule(snapshot(env_steps=1_000)) == "budget"
    assert rule(snapshot(env_steps=1_032)) == "budget"


def test_target_is_not_checked_until_the_window_is_full():
    rule = StopRule(total_env_steps=10**6, stop_at_return=100.0, return_window=4)
    assert rule(snapshot(returns=[500.0, 500.0, 500.0])) is None
    assert rule(snapshot(returns=[500.0, 500.0, 500.0, 500.0])) == "return_target"


def test_target_is_the_mean_over_exactly_the_last_return_window_returns():
    rule = StopRule(total_env_steps=10**6, stop_at_return=100.0, return_window=3)
    # Last three: 90, 100, 110 -> mean 100, reached (>=); the older 0 is not in it.
    assert rule(snapshot(returns=[0.0, 90.0, 100.0, 110.0])) == "return_target"
    # Last three: 0, 100, 110 -> mean 70; the older 500 must not lift it.
    assert rule(snapshot(returns=[500.0, 0.0, 100.0, 110.0])) is None
    # Mean 99.99...: just short.
    assert rule(snapshot(returns=[99.0, 100.0, 100.96])) is None


def test_no_target_never_stops_on_returns():
    rule = StopRule(total_env_steps=50, stop_at_return=None, return_window=2)
    assert rule(snapshot(env_steps=49, returns=[1e9, 1e9, 1e9])) is None
    assert rule(snapshot(env_steps=50, returns=[1e9, 1e9])) == "budget"


def test_budget_wins_when_both_are_reached():
    rule = StopRule(total_env_steps=10, stop_at_return=1.0, return_window=1)
    assert rule(snapshot(env_steps=10, returns=[5.0])) == "budget"


@pytest.mark.parametrize("kwargs, message", [
    ({"total_env_steps": 0}, "total_env_steps must be >= 1, got 0"),
    ({"total_env_steps": 5, "return_window": 0}, "return_window must be >= 1, got 0"),
])
def test_bad_settings_say_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StopRule(**kwargs)


def test_a_population_stops_at_any_members_budget():
    rule = StopRule(total_env_steps=100, stop_at_return=1e9, return_window=2)
    assert rule.decide([snapshot(env_steps=99), snapshot(env_steps=99)]) is None
    assert rule.decide([snapshot(env_steps=100), snapshot(env_steps=100)]) == "budget"


def test_seeds_stop_when_every_member_reached_the_target_pbt_when_any_did():
    """PBT's exploits restart the windows of the members they replace, so some member's window
    is always filling: `every_member` would never fire there (issue 20)."""
    solved, restarted = snapshot(returns=[100.0, 100.0]), snapshot(returns=[])
    seeds = StopRule(total_env_steps=10**6, stop_at_return=50.0, return_window=2)
    pbt = StopRule(total_env_steps=10**6, stop_at_return=50.0, return_window=2,
                   every_member=False)
    assert seeds.decide([solved, restarted]) is None
    assert seeds.decide([solved, solved]) == "return_target"
    assert pbt.decide([solved, restarted]) == "return_target"
    assert pbt.decide([restarted, snapshot(returns=[10.0, 10.0])]) is None
