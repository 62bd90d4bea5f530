"""Independent IMPALA's update: each (agent, env) column of a policy's stacked batch is the
V-trace loss of that agent's own unroll (checked against a float64 numpy V-trace run agent by
agent), and centred rewards make the update blind to a constant added to every reward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trellis.agents.impala.multi_agent import IImpalaBuilder, IImpalaConfig
from trellis.envs.multi_agent import MultiAgentSpec, MultiAgentStep
from trellis.envs.specs import EnvSpec

AGENTS = ("agent_0", "agent_1", "agent_2")
OBS = EnvSpec((4,), "float32", 5, (), "int32")
T, B, A = 6, 4, 5  # Transitions per unroll, envs, actions.


def _batch(seed: int) -> dict:
    """A nested multi-agent batch [T + 1, B] as the learner takes it: env 1's episode is
    truncated at step 2 (step 3 is its autoreset step), agent_2 stops acting in env 2 after
    step 3, and the rewards sit around -1 a step as MPE's do."""
    rng = np.random.default_rng(seed)
    first = np.zeros((T + 1, B), bool)
    first[3, 1] = True
    truncated = {a: np.zeros((T + 1, B), bool) for a in AGENTS}
    for a in AGENTS:
        truncated[a][2, 1] = True
    alive = {a: np.ones((T + 1, B), bool) for a in AGENTS}
    for a in AGENTS:  # An agent that finishes on a step no longer acts on it.
        alive[a][2, 1] = False
    alive["agent_2"][4:, 2] = False
    step = MultiAgentStep(
        obs={a: rng.normal(size=(T + 1, B, 4)).astype(np.float32) for a in AGENTS},
        reward={a: (rng.normal(size=(T + 1, B)) - 1.0).astype(np.float32) for a in AGENTS},
        terminated={a: np.zeros((T + 1, B), bool) for a in AGENTS},
        truncated=truncated, alive=alive, first=first,
        global_state=np.zeros((T + 1, B, 12), np.float32))
    return {"obs": step, "first": first,
            "action": {a: rng.integers(0, A, size=(T + 1, B)).astype(np.int32) for a in AGENTS},
            "logits": {a: rng.normal(size=(T + 1, B, A)).astype(np.float32) for a in AGENTS}}


def _setup(**config):
    builder = IImpalaBuilder(IImpalaConfig(batch_size=B, unroll_length=T, **config))
    spec = MultiAgentSpec(AGENTS, {a: OBS for a in AGENTS}, (12,))
    networks = builder.make_networks(spec)
    training = builder.make_training(networks, spec)
    state = training.init(jax.random.PRNGKey(0))
    return builder.config, networks, jax.jit(training.make_update(None)), state


def _vtrace_loss(logits, values, actions, mu_logits, rewards, discounts, mask):
    """float64 numpy reference of one unroll's IMPALA loss terms (rho clipped at 1)."""
    log_pi = logits[:-1] - np.log(np.exp(logits[:-1]).sum(-1, keepdims=True))
    log_mu = mu_logits - np.log(np.exp(mu_logits).sum(-1, keepdims=True))
    idx = np.arange(len(actions))
    rho = np.exp(log_pi[idx, actions] - log_mu[idx, actions]) * mask
    vs = values[:-1].copy()  # Backward recursion: v_s = V_s + delta_s + g_s c_s (v_s+1 - V_s+1).
    acc = 0.0
    for s in reversed(range(len(actions))):
        d = discounts[s] * mask[s]
        delta = min(1.0, rho[s]) * (rewards[s] + d * values[s + 1] - values[s])
        acc = delta + d * min(1.0, rho[s]) * acc
        vs[s] = values[s] + acc
    next_vs = np.append(vs[1:], values[-1])
    adv = np.minimum(1.0, rho) * (rewards + discounts * mask * next_vs - values[:-1])
    n = max(mask.sum(), 1.0)
    return {"pg_loss": -np.sum(log_pi[idx, actions] * adv * mask) / n,
            "baseline_loss": 0.5 * np.sum((vs - values[:-1]) ** 2 * mask) / n,
            "mean_rho": rho.sum() / n}


def test_stacked_agents_loss_is_each_agents_own_vtrace_loss():
    """The shared policy's loss terms equal the mean over (agent, env) of a numpy V-trace on
    that agent's own unroll: its observation with its one-hot id, its action, its behaviour
    logits, its rewards centred by the mean over every step learned from; the autoreset step
    and the steps after an agent stopped acting masked; a truncation bootstrapped."""
    config, networks, update, state = _setup()
    batch = _batch(0)
    _, metrics = update(state, jax.tree.map(jnp.asarray, batch))
    step, net = batch["obs"], networks.policies["shared"]
    params = state.policies["shared"].params
    columns = []
    for i, agent in enumerate(AGENTS):
        ids = np.broadcast_to(np.eye(len(AGENTS), dtype=np.float32)[i], (T + 1, B, len(AGENTS)))
        x = np.concatenate([step.obs[agent], ids], axis=-1)
        logits, values, _ = net.apply(params, x, step.first, {})
        acted_before = np.concatenate([np.ones((1, B), bool), step.alive[agent][:-1]])
        mask = 1.0 - (step.first | ~acted_before)[1:].astype(np.float64)
        columns.append((agent, np.asarray(logits, np.float64), np.asarray(values, np.float64),
                        mask))
    rewards = np.stack([step.reward[a][1:] for a in AGENTS]).astype(np.float64)
    masks = np.stack([m for *_, m in columns])
    mean_reward = np.sum(rewards * masks) / masks.sum()
    terms = []
    for k, (agent, logits, values, mask) in enumerate(columns):
        discounts = config.discount * (1.0 - step.terminated[agent][1:].astype(np.float64))
        for b in range(B):
            terms.append(_vtrace_loss(
                logits[:, b], values[:, b], batch["action"][agent][:-1, b],
                batch["logits"][agent][:-1, b].astype(np.float64),
                rewards[k, :, b] - mean_reward, discounts[:, b], mask[:, b]))
    for name in ("pg_loss", "baseline_loss", "mean_rho"):
        np.testing.assert_allclose(metrics[f"policy/shared/{name}"],
                                   np.mean([t[name] for t in terms]), rtol=2e-5, err_msg=name)


def test_centred_rewards_make_the_update_blind_to_a_constant_reward():
    """iimpala's default (`center_rewards`): the same loss terms and gradient norm whether
    every reward is shifted by -100 or not; without it they differ (the baseline would have
    to learn the shift first)."""
    shifted = _batch(1)
    shifted["obs"] = shifted["obs"]._replace(
        reward={a: r - 100.0 for a, r in shifted["obs"].reward.items()})
    names = [f"policy/shared/{n}" for n in ("pg_loss", "baseline_loss", "grad_norm")]
    for center in (True, False):
        _, _, update, state = _setup(center_rewards=center)
        base, moved = (np.array([update(state, jax.tree.map(jnp.asarray, b))[1][n]
                                 for n in names]) for b in (_batch(1), shifted))
        assert np.allclose(base, moved, rtol=1e-3) == center, (center, base, moved)
