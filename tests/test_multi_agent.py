"""The multi-agent convention: specs, the policy mapping, masks for agents that finish early,
each agent's observation reaching its policy, and PPO's loss ignoring masked steps."""

from __future__ import annotations

import dataclasses
import json

import gymnasium
import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest

from trellis.agents.ppo.learner import make_transitions
from trellis.agents.ppo.multi_agent import (
    IPPOConfig,
    group_batch,
    make_multi_agent_networks,
    make_policy,
    make_training,
)
from trellis.builders.contract.policy_mapping import (
    PolicyMapping,
    PolicyMappingError,
    add_agent_ids,
)
from trellis.builders.experiments.curves import plot_run
from trellis.envs.jax_multi_agent import MultiAgentJaxEnv, TeamEnv
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentSpecError, episode_done
from trellis.envs.specs import EnvSpec

SMALL = EnvSpec((2,), "float32", 3, (), "int32")
LARGE = EnvSpec((4,), "float32", 3, (), "int32")


def _spec(**specs: EnvSpec) -> MultiAgentSpec:
    return MultiAgentSpec(tuple(specs), specs, (6,))


def test_spec_checks_its_agents():
    with pytest.raises(MultiAgentSpecError, match="unique"):
        MultiAgentSpec(("a", "a"), {"a": SMALL})
    with pytest.raises(MultiAgentSpecError, match="keyed by the agents"):
        MultiAgentSpec(("a", "b"), {"a": SMALL})


def test_mapping_groups_agents_by_pattern_in_agent_order():
    spec = _spec(adversary_0=LARGE, agent_0=SMALL, agent_1=SMALL)
    groups = PolicyMapping.parse("agent_*=good, adversary_*=adv").groups(spec)
    assert [(g.policy, g.agents) for g in groups] == [
        ("adv", ("adversary_0",)), ("good", ("agent_0", "agent_1"))]
    # One agent: its own spec; two: the observation gains their one-hot id.
    assert groups[0].spec == LARGE and not groups[0].agent_ids
    assert groups[1].spec.observation_shape == (4,) and groups[1].agent_ids
    per_agent = PolicyMapping.parse("per_agent").groups(spec)
    assert [g.policy for g in per_agent] == ["adversary_0", "agent_0", "agent_1"]
    # The first matching rule wins.
    groups = PolicyMapping.parse("agent_0=x,agent_*=y,*=z").groups(spec)
    assert [(g.policy, g.agents) for g in groups] == [
        ("z", ("adversary_0",)), ("x", ("agent_0",)), ("y", ("agent_1",))]


@pytest.mark.parametrize("text, policies, message", [
    ("shared", "", "serves agents with different spaces: adversary_0 has observations (4,)"),
    ("agent_*=good", "", "agent 'adversary_0' matches no pattern"),
    ("adversary_*=adv,agent_*=good,other_*=x", "", "pattern 'other_*' matches no agent"),
    ("adversary_*=adv,agent_*=good,", "adv,good,spare", "policies ['spare'] are declared"),
])
def test_mappings_that_do_not_fit_the_agents_say_so(text, policies, message):
    spec = _spec(adversary_0=LARGE, agent_0=SMALL, agent_1=SMALL)
    with pytest.raises(PolicyMappingError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace("*", r"\*")):
        PolicyMapping.parse(text, policies).groups(spec)


@pytest.mark.parametrize("text, policies, message", [
    ("agent_*", "", "'agent_*' is not PATTERN=POLICY"),
    ("", "", "is empty"),
    ("agent_*=goood", "good,adv", "Did you mean: good"),
])
def test_malformed_mappings_are_refused(text, policies, message):
    with pytest.raises(PolicyMappingError, match=message.replace("*", r"\*")):
        PolicyMapping.parse(text, policies)


def test_agent_ids_are_one_hot_after_the_observation():
    group = PolicyMapping().groups(_spec(a=SMALL, b=SMALL, c=SMALL))[0]
    obs = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)  # [N, n, d]
    x = add_agent_ids(group, obs)
    np.testing.assert_array_equal(x[..., :2], obs)
    np.testing.assert_array_equal(x[1, :, 2:], np.eye(3))


class Finishing:
    """Two agents with JaxMARL's API: "a" is done after 2 steps, "b" (and the episode) after
    4; a's reward is its action, b's 10; observations hold the step and the agent."""

    agents = ["a", "b"]

    def observation_space(self, agent):
        return gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(3)

    def _obs(self, t):
        return {"a": jnp.stack([t, 1.0]), "b": jnp.stack([t, 2.0])}

    def reset(self, key):
        return self._obs(jnp.zeros(())), jnp.zeros((), jnp.int32)

    def step_env(self, key, t, actions):
        t = t + 1
        done = {"a": t >= 2, "b": t >= 4, "__all__": t >= 4}
        rewards = {"a": actions["a"].astype(jnp.float32), "b": jnp.asarray(10.0)}
        return self._obs(t.astype(jnp.float32)), t, rewards, done, {}


def _steps(env, actions, length):
    """[length + 1] steps of one env from reset, fields stacked on a leading time axis."""
    state, step = env.reset(jax.random.key(0))
    out = [step]
    for t in range(length):
        state, step = env.step(jax.random.key(t + 1), state, actions)
        out.append(step)
    return jax.tree.map(lambda *x: jnp.stack(x), *out)


def test_agents_that_finish_early_are_masked_until_the_episode_ends():
    env = MultiAgentJaxEnv(Finishing())
    steps = _steps(env, {"a": jnp.asarray(2), "b": jnp.asarray(1)}, 6)
    alive = {a: np.asarray(steps.alive[a]) for a in "ab"}
    # Step 2: a finishes (its last reward, its terminal observation); then masked, reward 0,
    # zeros; step 4: b and the episode end; step 5: the reset, both act again.
    np.testing.assert_array_equal(alive["a"], [1, 1, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(alive["b"], [1, 1, 1, 1, 0, 1, 1])
    np.testing.assert_array_equal(steps.terminated["a"], [0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(steps.terminated["b"], [0, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(steps.reward["a"], [0, 2, 2, 0, 0, 0, 2])
    np.testing.assert_array_equal(steps.reward["b"], [0, 10, 10, 10, 10, 0, 10])
    np.testing.assert_array_equal(steps.obs["a"][:, 0], [0, 1, 2, 0, 0, 0, 1])
    np.testing.assert_array_equal(steps.first, [1, 0, 0, 0, 0, 1, 0])
    np.testing.assert_array_equal(jax.vmap(lambda s: episode_done(s, ("a", "b")))(steps),
                                  [0, 0, 0, 0, 1, 0, 0])
    # The global state: the observations concatenated (the env has none of its own).
    np.testing.assert_array_equal(steps.global_state[1], [1, 1, 1, 2])
    # Seen as one env: the team's reward, the episode's end.
    team = TeamEnv(env)
    state, timestep = team.reset(jax.random.key(0))
    rewards, ends = [], []
    for t in range(5):
        state, timestep = team.step(jax.random.key(t + 1), state,
                                    {"a": jnp.asarray(2), "b": jnp.asarray(1)})
        rewards.append(float(timestep.reward))
        ends.append(bool(timestep.terminated))
    assert rewards == [12, 12, 10, 10, 0] and ends == [False, False, False, True, False]


def _config(mapping: str, **kwargs) -> IPPOConfig:
    return IPPOConfig(policy_mapping=mapping, hidden_sizes=(8,), unroll_length=6, batch_size=1,
                      num_minibatches=1, num_epochs=2, **kwargs)


def test_each_agents_observation_reaches_its_policy():
    """Per agent: agent a's action and value are policy a's network on a's observation, b's
    are policy b's on b's, and the two policies answer differently. Shared: each agent's
    observation with its own one-hot id goes through the one network."""
    spec = MultiAgentJaxEnv(Finishing()).spec()
    steps = _steps(MultiAgentJaxEnv(Finishing()), {"a": jnp.asarray(0), "b": jnp.asarray(0)}, 2)
    step = jax.tree.map(lambda x: x[1:3], steps)  # Two envs' steps, [N=2, ...].
    for mapping in ("per_agent", "a=first,b=second"):
        networks = make_multi_agent_networks(spec, _config(mapping))
        policies = [g.policy for g in networks.groups]
        params = make_training(networks, _config(mapping)).init(jax.random.key(1)).params
        actions, extras, _ = make_policy(networks, evaluation=True)(
            params, jax.random.key(2), step, {}, step.first)
        for agent, policy in zip("ab", policies, strict=True):
            logits, value = networks.policies[policy].apply(params[policy], step.obs[agent])
            np.testing.assert_allclose(extras["value"][agent], value, rtol=1e-6)
            np.testing.assert_array_equal(actions[agent], jnp.argmax(logits, -1))
        other = networks.policies[policies[1]].apply(params[policies[1]], step.obs["a"])[1]
        assert not np.allclose(other, extras["value"]["a"])
    networks = make_multi_agent_networks(spec, _config("shared"))
    params = make_training(networks, _config("shared")).init(jax.random.key(1)).params
    _, extras, _ = make_policy(networks)(params, jax.random.key(2), step, {}, step.first)
    for i, agent in enumerate("ab"):
        x = jnp.concatenate([step.obs[agent], jnp.tile(jnp.eye(2)[i], (2, 1))], axis=-1)
        _, value = networks.policies["shared"].apply(params["shared"], x)
        np.testing.assert_allclose(extras["value"][agent], value, rtol=1e-6)


def _batch(networks, params, corrupt: bool):
    """A recorded unroll [T + 1 = 7, B = 1] of Finishing; with `corrupt`, agent a's
    observation, action and extras at the steps it is masked hold random values."""
    steps = _steps(MultiAgentJaxEnv(Finishing()), {"a": jnp.asarray(2), "b": jnp.asarray(1)}, 6)
    steps = jax.tree.map(lambda x: x[:, None], steps)  # [T + 1, B = 1, ...]
    _, extras, _ = jax.vmap(make_policy(networks), in_axes=(None, 0, 0, None, 0))(
        params, jax.random.split(jax.random.key(3), 7), steps, {}, steps.first)
    actions = {"a": jnp.full((7, 1), 2), "b": jnp.full((7, 1), 1)}
    batch = {"obs": steps, "action": actions, **extras}
    if corrupt:
        dead = ~steps.alive["a"]
        noise = jax.random.normal(jax.random.key(4), steps.obs["a"].shape)
        steps = steps._replace(obs={**steps.obs, "a": jnp.where(dead[..., None], noise,
                                                                 steps.obs["a"])})
        batch = {"obs": steps,
                 "action": {**actions, "a": jnp.where(dead, 0, actions["a"])},
                 "log_prob": {**extras["log_prob"], "a": jnp.where(dead, -5.0,
                                                                   extras["log_prob"]["a"])},
                 "value": {**extras["value"], "a": jnp.where(dead, 3.0, extras["value"]["a"])}}
    return batch


def test_ppo_ignores_the_steps_of_agents_that_no_longer_act():
    """Agent a is masked at steps 2-4: PPO's mask drops its transitions from them (the one into
    its terminal observation stays), and garbage there leaves the update unchanged."""
    spec = MultiAgentJaxEnv(Finishing()).spec()
    config = _config("per_agent")
    networks = make_multi_agent_networks(spec, config)
    training = make_training(networks, config)
    state = training.init(jax.random.key(0))
    clean = _batch(networks, state.params, corrupt=False)
    group = networks.groups[0]
    assert group.agents == ("a",)
    transitions = make_transitions(networks.policies["a"], dataclasses.replace(
        config, batch_size=1), group_batch(networks, group, clean))
    # Transition s goes from step s to s + 1: a acts at steps 0, 1 (into its end at 2); the
    # transition into the reset (4 -> 5) is PPO's usual autoreset mask; a acts again at 5.
    np.testing.assert_array_equal(transitions["mask"], [1, 1, 0, 0, 0, 1])
    update = jax.jit(training.make_update(None))
    after_clean, _ = update(state, clean)
    after_corrupt, _ = update(state, _batch(networks, state.params, corrupt=True))
    for policy in ("a", "b"):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7),
                     after_clean.policies[policy].params, after_corrupt.policies[policy].params)
    changed = jax.tree.leaves(jax.tree.map(lambda x, y: bool(jnp.any(x != y)),
                                           state.policies["a"].params,
                                           after_clean.policies["a"].params))
    assert any(changed)  # The update did learn from a's real steps.


def test_the_learning_curve_draws_each_agents_reward(tmp_path):
    """A multi-agent run's curve gets a third panel, one line per agent's reward per step."""

    def write(run_dir, agents):
        run_dir.mkdir()
        with open(run_dir / "metrics.jsonl", "w") as f:
            for i in range(1, 4):
                record = {"env_steps": 1000 * i, "wall_time_s": float(i), "return_mean": -i}
                record.update({f"learner/agent/{a}/reward_mean": 0.1 * i for a in agents})
                f.write(json.dumps(record) + "\n")
        return matplotlib.image.imread(plot_run(str(run_dir)))

    single = write(tmp_path / "single", [])
    multi = write(tmp_path / "multi", ["a", "b"])
    assert multi.shape[1] == single.shape[1] * 3 // 2  # 15 inches wide instead of 10.
