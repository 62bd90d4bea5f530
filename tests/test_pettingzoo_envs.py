"""PettingZoo's parallel envs through envs/pettingzoo_envs.py: the vector adapter against mpe2
stepped by hand, masks for agents that finish early or join late, next-step autoreset, ids."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from mpe2 import simple_spread_v3
from pettingzoo import ParallelEnv

from trellis.envs import Players, make_env_factory
from trellis.envs.errors import UnknownEnvError
from trellis.envs.multi_agent import episode_done
from trellis.envs.pettingzoo_envs import PettingZooFactory, PettingZooVector, parallel_spec

SPREAD = "pettingzoo:mpe2/simple_spread_v3"


def test_simple_spread_matches_mpe2_stepped_by_hand():
    """Same seeds and actions: the same obs, rewards, ends and global state as mpe2's own envs,
    through two episodes (the step after one ends is the next one's first, actions ignored)."""
    k, cycles = 3, 4
    factory = PettingZooFactory(SPREAD, (("max_cycles", cycles),))
    spec = factory.spec()
    assert spec.agents == ("agent_0", "agent_1", "agent_2")
    assert spec.global_state_shape == (54,)
    assert spec.specs["agent_0"].observation_shape == (18,)
    assert spec.specs["agent_0"].num_actions == 5
    vector = factory.make_vector(k, seed=7)
    by_hand = [simple_spread_v3.parallel_env(max_cycles=cycles) for _ in range(k)]
    expected_obs = [env.reset(seed=7 + i)[0] for i, env in enumerate(by_hand)]
    rng = np.random.default_rng(0)
    step = vector.reset(seed=7)  # What make_vector gave: reset again with the same seeds.
    for t in range(2 * (cycles + 1)):
        for i, env in enumerate(by_hand):
            for agent in spec.agents:
                np.testing.assert_array_equal(step.obs[agent][i], expected_obs[i][agent])
            np.testing.assert_array_equal(step.global_state[i], env.state())
        assert step.first.tolist() == [t % (cycles + 1) == 0] * k
        actions = {a: rng.integers(0, 5, k).astype(np.int32) for a in spec.agents}
        step = vector.step(actions)
        for i, env in enumerate(by_hand):
            if not env.agents:  # The episode ended on the last step: next-step autoreset.
                expected_obs[i] = env.reset()[0]
                assert step.first[i]
                assert not any(step.reward[a][i] for a in spec.agents)
                continue
            obs, reward, terminated, truncated, _ = env.step(
                {a: actions[a][i] for a in env.agents})
            expected_obs[i] = obs
            for agent in spec.agents:
                assert step.reward[agent][i] == np.float32(reward[agent])
                assert step.truncated[agent][i] == truncated[agent]
                assert step.terminated[agent][i] == terminated[agent]
                assert step.alive[agent][i] == (agent in env.agents)
    vector.close()


class _FinishEarly(ParallelEnv):
    """Two agents; "a" finishes (terminated) after 2 steps, "b" after 4; "c" joins on step 1.

    Rewards: 1 per step for "a", 10 for "b", 100 for "c"; observations count the steps.
    """

    metadata = {"name": "finish_early_v0"}
    possible_agents = ["a", "b", "c"]
    ends = {"a": 2, "b": 4, "c": 3}

    def observation_space(self, agent):
        return gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = ["a", "b"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def _obs(self, agent):
        return np.array([self.t, len(agent)], np.float32)

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)  # Only who acts.
        self.t += 1
        reward = {a: {"a": 1.0, "b": 10.0, "c": 100.0}[a] for a in self.agents}
        terminated = {a: self.t >= self.ends[a] for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not terminated[a]]
        if self.t == 1:
            self.agents.append("c")
            obs["c"] = self._obs("c")
        truncated = {a: False for a in terminated}
        return obs, reward, terminated, truncated, {a: {} for a in obs}


def test_agents_that_finish_early_are_masked_not_removed():
    spec = parallel_spec(_FinishEarly())
    assert spec.agents == ("a", "b", "c") and spec.global_state_shape is None
    vector = PettingZooVector([_FinishEarly(), _FinishEarly()], spec)
    step = vector.reset(seed=0)
    actions = {a: np.zeros(2, np.int32) for a in spec.agents}
    alive, reward, terminated, obs_a = [], [], [], []
    for _ in range(7):
        alive.append([bool(step.alive[a][0]) for a in spec.agents])
        obs_a.append(step.obs["a"][1].tolist())
        reward.append([float(step.reward[a][0]) for a in spec.agents])
        terminated.append([bool(step.terminated[a][0]) for a in spec.agents])
        assert episode_done(step, spec.agents)[0] == (not any(alive[-1]))
        step = vector.step(actions)
    # t: a, b, c alive. c joins on step 1; a ends on step 2 (its last reward with it), c on 3,
    # b on 4 (the episode's end: none alive); step 5 is the next episode's first.
    assert alive == [[1, 1, 0], [1, 1, 1], [0, 1, 1], [0, 1, 0], [0, 0, 0], [1, 1, 0],
                     [1, 1, 1]]
    assert reward == [[0, 0, 0], [1, 10, 0], [1, 10, 100], [0, 10, 100], [0, 10, 0],
                      [0, 0, 0], [1, 10, 0]]
    assert terminated == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0],
                          [0, 0, 0]]
    # An agent's observation is zeros while it is out of the episode, its terminal one on the
    # step it finishes; both envs alike.
    assert obs_a == [[0, 1], [1, 1], [2, 1], [0, 0], [0, 0], [0, 1], [1, 1]]


def test_ids_resolve_and_bad_ids_name_close_matches():
    factory = make_env_factory(SPREAD)
    assert isinstance(factory, PettingZooFactory) and factory.players is Players.MULTI_AGENT
    pursuit = make_env_factory("pettingzoo:sisl/pursuit_v5").spec()
    assert pursuit.num_agents == 8 and pursuit.specs["pursuer_0"].num_actions == 5
    with pytest.raises(UnknownEnvError, match="Did you mean: pettingzoo:mpe2/simple_spread_v3"):
        make_env_factory("pettingzoo:mpe2/simple_sprad_v3").spec()
    with pytest.raises(UnknownEnvError, match="not a PettingZoo family. Did you mean: "
                                              "pettingzoo:mpe2"):
        make_env_factory("pettingzoo:mpe/simple_spread_v3").spec()
    with pytest.raises(UnknownEnvError, match="needs the 'pymunk' package"):
        make_env_factory("pettingzoo:butterfly/pistonball_v6").spec()


def test_float64_observations_come_as_float32():
    spec = make_env_factory("pettingzoo:butterfly/knights_archers_zombies_v11").spec()
    assert spec.specs["knight_0"].observation_dtype == "float32"
    assert spec.specs["knight_0"].observation_shape == (27, 5)
