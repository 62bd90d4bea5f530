"""PPO losses: GAE against a float64 numpy recursion over episodes and against rlax; the
clipped surrogate and value loss against hand-computed numbers; distributions vs distrax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from trellis.agents.ppo.losses import (
    clipped_surrogate_loss,
    generalized_advantage_estimation,
    ppo_loss,
    transition_discounts,
    value_loss,
)
from trellis.agents.ppo.networks import Categorical, DiagonalGaussian


def random_unroll(seed, T=40, p_end=0.12):
    """One unroll of T + 1 recorded steps with Gymnasium next-step autoreset episodes.

    Each step says how its observation was reached: after a terminated or truncated step,
    the next one is the first of a new episode (reward 0, the action before it ignored).
    """
    rng = np.random.default_rng(seed)
    first = np.zeros(T + 1, bool)
    terminated = np.zeros(T + 1, bool)
    truncated = np.zeros(T + 1, bool)
    first[0] = rng.random() < 0.5
    for t in range(1, T + 1):
        if terminated[t - 1] or truncated[t - 1]:
            first[t] = True
        else:
            u = rng.random()
            terminated[t] = u < p_end
            truncated[t] = p_end <= u < 2 * p_end
    reward = np.where(first, 0.0, rng.normal(size=T + 1))
    values = rng.normal(size=T + 1)
    return first, terminated, truncated, reward, values


def numpy_gae(first, terminated, truncated, reward, values, gamma, lam):
    """GAE (Schulman et al., 2016) in float64, episode by episode, from the raw fields.

    Transition s (x_s -> x_{s+1}) is fake when x_{s+1} is `first`; it ends the episode
    without bootstrap when x_{s+1} is terminal, and with a bootstrap from V(x_{s+1}) when
    the episode was truncated there. Advantages never look past the end of an episode.
    """
    T = len(reward) - 1
    adv = np.zeros(T)
    for s in reversed(range(T)):
        if first[s + 1]:
            adv[s] = 0.0
        elif terminated[s + 1]:
            adv[s] = reward[s + 1] - values[s]
        elif truncated[s + 1]:
            adv[s] = reward[s + 1] + gamma * values[s + 1] - values[s]
        else:
            later = adv[s + 1] if s + 1 < T else 0.0
            adv[s] = reward[s + 1] + gamma * values[s + 1] - values[s] + gamma * lam * later
    return adv


def ours(first, terminated, truncated, reward, values, gamma, lam):
    discount_t, lambda_t, mask_t = transition_discounts(
        first[1:], terminated[1:], truncated[1:], gamma, lam)
    reward, values = jnp.asarray(reward, jnp.float32), jnp.asarray(values, jnp.float32)
    adv = generalized_advantage_estimation(reward[1:], discount_t, lambda_t, values)
    return adv * mask_t


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)])
def test_gae_matches_float64_recursion_over_episodes(seed, jit, gamma, lam):
    data = random_unroll(seed)
    first, terminated, truncated = data[:3]
    assert first[1:].any() and terminated.any() and truncated.any()  # All cases present.
    fn = jax.jit(ours, static_argnums=(5, 6)) if jit else ours
    np.testing.assert_allclose(fn(*data, gamma, lam), numpy_gae(*data, gamma, lam),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_rlax(seed):
    rng = np.random.default_rng(seed)
    T = 23
    r = rng.normal(size=T).astype(np.float32)
    discount = (0.99 * (rng.random(T) > 0.2)).astype(np.float32)
    lambda_t = (0.95 * (rng.random(T) > 0.2)).astype(np.float32)
    values = rng.normal(size=T + 1).astype(np.float32)
    for lam in (lambda_t, 0.9):
        np.testing.assert_allclose(
            generalized_advantage_estimation(r, discount, lam, values),
            rlax.truncated_generalized_advantage_estimation(r, discount, lam, values),
            rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_flags", [True, False])
def test_nothing_after_a_first_observation_reaches_earlier_advantages(seed, with_flags):
    """Rewards and values of the next episode (and of the fake transition into it) never
    change the advantages before it; without the terminated/truncated flags too, so the
    boundary holds from `first` alone."""
    first, terminated, truncated, reward, values = random_unroll(seed)
    if not with_flags:
        terminated, truncated = np.zeros_like(first), np.zeros_like(first)
    a = np.asarray(ours(first, terminated, truncated, reward, values, 0.99, 0.95))
    for b in np.flatnonzero(first[1:]) + 1:
        r2, v2 = reward.copy(), values.copy()
        r2[b:] += 100.0
        v2[b:] -= 50.0
        a2 = np.asarray(ours(first, terminated, truncated, r2, v2, 0.99, 0.95))
        np.testing.assert_allclose(a2[: b - 1], a[: b - 1], rtol=1e-6)
        assert a2[b - 1] == 0.0  # The fake transition itself is masked.


def test_truncation_bootstraps_and_termination_does_not():
    # Observations:      x0    x1 trunc  x2 first  x3     x4 term  x5 first
    first = np.array([True, False, True, False, False, True])
    terminated = np.array([False, False, False, False, True, False])
    truncated = np.array([False, True, False, False, False, False])
    reward = np.array([0.0, 1.0, 0.0, 2.0, 3.0, 0.0])
    values = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    adv = np.asarray(ours(first, terminated, truncated, reward, values, 0.5, 1.0))
    a3 = 3.0 - 40.0  # Terminated at x4: no bootstrap from V(x4) = 50.
    np.testing.assert_allclose(adv, [
        1.0 + 0.5 * 20.0 - 10.0,  # Truncated at x1: bootstrap from V(x1), nothing beyond.
        0.0,  # x1 -> x2, the fake autoreset transition.
        2.0 + 0.5 * 40.0 - 30.0 + 0.5 * 1.0 * a3,
        a3,
        0.0,
    ], rtol=1e-6)


def test_clipped_surrogate_hand_computed():
    ratio = np.array([0.5, 1.0, 1.5, 1.1, 0.7], np.float32)
    adv = np.array([1.0, -2.0, 3.0, -1.0, -0.5], np.float32)
    ones = np.ones(5, np.float32)
    # min(rA, clip(r)A) per sample: 0.5, -2, 3.6 (clipped at 1.2), -1.1, -0.4 (clipped at 0.8).
    np.testing.assert_allclose(clipped_surrogate_loss(ratio, adv, 0.2, ones), -0.12, rtol=1e-6)
    mask = np.array([1, 1, 0, 1, 1], np.float32)
    np.testing.assert_allclose(clipped_surrogate_loss(ratio, adv, 0.2, mask), 0.75, rtol=1e-6)
    # Clipped samples carry no gradient; the others -A / N.
    grad = jax.grad(clipped_surrogate_loss)(ratio, adv, 0.2, ones)
    np.testing.assert_allclose(grad, [-0.2, 0.4, 0.0, 0.2, 0.0], atol=1e-7)
    np.testing.assert_allclose(clipped_surrogate_loss(ratio, adv, 0.2, ones),
                               rlax.clipped_surrogate_pg_loss(ratio, adv, 0.2), rtol=1e-6)


def test_value_loss_hand_computed():
    v, v_old = np.array([1.0, 2.0]), np.array([0.5, 2.0])
    returns, mask = np.array([3.0, 1.0]), np.ones(2)
    np.testing.assert_allclose(value_loss(v, v_old, returns, mask), 0.5 * (4 + 1) / 2)
    # Clipped: V_old + clip(0.5, +-0.2) = 0.7 -> (0.7 - 3)^2 = 5.29 beats 4.
    np.testing.assert_allclose(value_loss(v, v_old, returns, mask, 0.2), 0.5 * (5.29 + 1) / 2,
                               rtol=1e-6)


def _ppo_inputs(seed, n=32):
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    return dict(log_prob_t=f(n) - 1, behaviour_log_prob_t=f(n) - 1, entropy_t=np.abs(f(n)),
                v_t=f(n), behaviour_v_t=f(n), adv_t=f(n), returns_t=f(n),
                mask_t=np.float32(rng.random(n) > 0.2))


def test_ppo_loss_terms_and_rlax():
    x = _ppo_inputs(0)
    x["mask_t"] = np.ones_like(x["mask_t"])
    kw = dict(clip_epsilon=0.2, value_cost=0.5, entropy_cost=0.01)
    loss, m = ppo_loss(**x, **kw, normalize_advantages=False)
    ratio = jnp.exp(x["log_prob_t"] - x["behaviour_log_prob_t"])
    np.testing.assert_allclose(m["pg_loss"], rlax.clipped_surrogate_pg_loss(
        ratio, x["adv_t"], 0.2), rtol=1e-5)
    np.testing.assert_allclose(m["value_loss"],
                               0.5 * np.mean((x["v_t"] - x["returns_t"]) ** 2), rtol=1e-5)
    np.testing.assert_allclose(m["entropy"], np.mean(x["entropy_t"]), rtol=1e-5)
    np.testing.assert_allclose(loss, m["pg_loss"] + 0.5 * m["value_loss"] - 0.01 * m["entropy"],
                               rtol=1e-5)
    # Normalised advantages: zero mean, unit std, so the surrogate at ratio 1 is 0.
    y = dict(x, log_prob_t=x["behaviour_log_prob_t"])
    _, m = ppo_loss(**y, **kw)
    np.testing.assert_allclose(m["pg_loss"], 0.0, atol=1e-6)
    assert m["approx_kl"] == 0.0 and m["clip_fraction"] == 0.0


def test_masked_transitions_contribute_nothing():
    x = _ppo_inputs(1)
    kw = dict(clip_epsilon=0.2, value_cost=0.5, entropy_cost=0.01, value_clip_epsilon=0.3)
    base, _ = ppo_loss(**x, **kw)
    masked = np.flatnonzero(x["mask_t"] == 0)
    assert len(masked)
    changed = {k: v.copy() for k, v in x.items()}
    for k in changed:
        if k != "mask_t":
            changed[k][masked] = 1e3
    np.testing.assert_allclose(ppo_loss(**changed, **kw)[0], base, rtol=1e-6)


def test_distributions_match_distrax():
    distrax = pytest.importorskip("distrax")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 3)).astype(np.float32)
    actions = rng.integers(0, 3, size=5)
    ref = distrax.Categorical(logits=logits)
    np.testing.assert_allclose(Categorical().log_prob(logits, actions), ref.log_prob(actions),
                               rtol=1e-5)
    np.testing.assert_allclose(Categorical().entropy(logits), ref.entropy(), rtol=1e-5)
    mean, log_std = rng.normal(size=(2, 5, 2)).astype(np.float32)
    x = rng.normal(size=(5, 2)).astype(np.float32)
    ref = distrax.MultivariateNormalDiag(mean, np.exp(log_std))
    g = DiagonalGaussian(low=(-1.0, -2.0), high=(1.0, 2.0))
    np.testing.assert_allclose(g.log_prob((mean, log_std), x), ref.log_prob(x), rtol=1e-5)
    np.testing.assert_allclose(g.entropy((mean, log_std)), ref.entropy(), rtol=1e-5)
    action, raw = g.sample(jax.random.PRNGKey(0), (mean * 10, log_std))
    assert np.all(np.abs(action) <= np.array([1.0, 2.0])) and not np.allclose(action, raw)
