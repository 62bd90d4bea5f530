"""POPGym's ids through the env factory (pip install -e '.[popgym]'): specs, one-hot card
observations, the env worker's episodes over a vector env, and one-line errors for the ids and
the install it cannot serve."""

import sys
from importlib.util import find_spec

import numpy as np
import pytest

from tests.test_envs import RecordingInference
from tests.test_run import run, summary
from trellis.builders.experiments.env_worker import EnvWorker
from trellis.envs import UnknownEnvError, make_env_factory

needs_popgym = pytest.mark.skipif(
    find_spec("popgym") is None, reason="POPGym needs the popgym extra: pip install -e '.[popgym]'")

REPEAT_PREVIOUS = "popgym-RepeatPreviousEasy-v0"
CARTPOLE = "popgym-PositionOnlyCartPoleEasy-v0"


@needs_popgym
@pytest.mark.parametrize("env_id,obs_shape,num_actions", [
    (REPEAT_PREVIOUS, (4,), 4),  # A card's suit, one-hot; the action names a suit.
    (CARTPOLE, (2,), 2),  # Cart position and pole angle.
])
def test_specs(env_id, obs_shape, num_actions):
    spec = make_env_factory(env_id).spec()
    assert spec.observation_shape == obs_shape and spec.observation_dtype == "float32"
    assert spec.num_actions == num_actions and not spec.pixels


@needs_popgym
def test_card_observations_are_one_hot_suits():
    envs = make_env_factory(REPEAT_PREVIOUS).make_vector(8, seed=0)
    obs, _ = envs.reset(seed=0)
    for _ in range(60):  # Past the end of a 51-step episode.
        assert obs.dtype == np.float32 and set(np.unique(obs)) <= {0.0, 1.0}
        np.testing.assert_array_equal(obs.sum(axis=1), 1)
        obs, *_ = envs.step(envs.action_space.sample())


@needs_popgym
@pytest.mark.parametrize("env_id", [REPEAT_PREVIOUS, CARTPOLE])
def test_worker_episodes(env_id):
    """EnvWorker over 4 envs with random actions: `first` marks exactly the step after an
    episode's end, which has reward 0, and the episodes it reports are POPGym's: RepeatPrevious
    deals 51 cards and scores +-1/48 for each of the last 48; the cartpole pays 1/200 a step."""
    inference = RecordingInference(steps=400)
    EnvWorker(make_env_factory(env_id), inference, worker_id=0, num_envs=4, seed=1).run()
    calls = inference.calls
    assert calls[0]["first"].all()
    episodes = []
    for prev, cur in zip(calls, calls[1:], strict=False):
        done = prev["terminated"] | prev["truncated"]
        np.testing.assert_array_equal(cur["first"], done)
        assert (cur["reward"][done] == 0).all() and not cur["terminated"][done].any()
        episodes += cur["episodes"]
    assert len(episodes) >= 8
    for ret, length in episodes:
        if env_id == REPEAT_PREVIOUS:
            assert length == 51 and abs(ret) <= 1 and ret * 48 == pytest.approx(round(ret * 48))
        else:
            assert 0 < length <= 200 and ret == pytest.approx(length / 200)


@needs_popgym
def test_ids_with_multidiscrete_actions_are_refused_in_one_line():
    with pytest.raises(UnknownEnvError, match=r"MultiDiscrete\(\[8 8\]\) actions") as e:
        make_env_factory("popgym-BattleshipEasy-v0").validate()
    assert "\n" not in str(e.value)


@needs_popgym
def test_stateless_cartpole_of_older_popgym_names_its_new_id():
    """popgym 1.0 calls StatelessCartPole PositionOnlyCartPole."""
    with pytest.raises(UnknownEnvError, match=CARTPOLE):
        make_env_factory("popgym-StatelessCartPoleEasy-v0").validate()


def test_without_popgym_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "popgym", None)  # `import popgym` raises ImportError.
    with pytest.raises(UnknownEnvError, match=r"needs the 'popgym' package: "
                                              r"pip install -e '\.\[popgym\]'"):
        make_env_factory(REPEAT_PREVIOUS).validate()


@needs_popgym
@pytest.mark.slow  # About 50 s on a loaded 2-core machine.
def test_lstm_impala_runs_on_repeat_previous(tmp_path):
    out = run(["--agent=impala", "--core=lstm", f"--env={REPEAT_PREVIOUS}",
               "--platform=local_mt", "--total_env_steps=20000", "--quiet",
               f"--logdir={tmp_path}"])
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["stopped_by"] == "budget" and s["env_steps"] >= 20000 and s["learner_steps"] > 0
    assert s["episodes"] > 300  # 51 steps each.
