"""V-trace against a float64 numpy version of the paper's recursion, and against rlax."""

import jax
import numpy as np
import pytest
import rlax

from trellis.agents.common.vtrace import vtrace


def numpy_vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, lambda_, rho_bar, pg_rho_bar):
    """Espeholt et al. (2018), Remark 1, in float64, one step at a time."""
    T = len(r_t)
    vs = np.zeros(T)
    acc = 0.0  # v_{s+1} - V(x_{s+1})
    for s in reversed(range(T)):
        delta = min(rho_bar, rho_tm1[s]) * (r_t[s] + discount_t[s] * v_t[s] - v_tm1[s])
        c = lambda_ * min(1.0, rho_tm1[s])
        acc = delta + discount_t[s] * c * acc
        vs[s] = v_tm1[s] + acc
    vs_next = np.append(vs[1:], v_t[-1])
    pg_adv = np.minimum(pg_rho_bar, rho_tm1) * (r_t + discount_t * vs_next - v_tm1)
    return vs - v_tm1, pg_adv


def random_inputs(seed, T=17):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=T + 1)
    r = rng.normal(size=T)
    discount = 0.99 * (rng.random(T) > 0.15)
    rho = np.exp(rng.normal(scale=0.7, size=T))
    return values[:-1], values[1:], r, discount, rho




@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("lambda_,rho_bar,pg_rho_bar", [(1.0, 1.0, 1.0), (0.9, 2.0, 0.5)])
def test_vtrace_matches_float64_recursion(seed, jit, lambda_, rho_bar, pg_rho_bar):
    args = random_inputs(seed)
    fn = lambda *a: vtrace(*a, lambda_=lambda_, clip_rho_threshold=rho_bar,  # noqa: E731
                           clip_pg_rho_threshold=pg_rho_bar)
    fn = jax.jit(fn) if jit else fn
    out = fn(*(np.float32(a) for a in args))
    errors, pg_adv = numpy_vtrace(*args, lambda_, rho_bar, pg_rho_bar)
    np.testing.assert_allclose(out.errors, errors, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.pg_advantage, pg_adv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lambda_", [1.0, 0.95])
def test_vtrace_matches_rlax(seed, lambda_):
    args = [np.float32(a) for a in random_inputs(seed)]
    ours = vtrace(*args, lambda_=lambda_)
    np.testing.assert_allclose(ours.errors, rlax.vtrace(*args, lambda_=lambda_),
                               rtol=1e-5, atol=1e-5)
    if lambda_ == 1.0:
        # For lambda < 1 rlax mixes V(x_{s+1}) into the policy-gradient bootstrap; we keep
        # the paper's (and scalable_agent's) v_{s+1}, so only lambda = 1 is comparable.
        adv = rlax.vtrace_td_error_and_advantage(*args, lambda_=lambda_).pg_advantage
        np.testing.assert_allclose(ours.pg_advantage, adv, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_is_n_step_return():
    """With rho = 1 and lambda = 1, v_s is the discounted return bootstrapped at the end."""
    v_tm1 = np.array([0.5, -1.0, 2.0], np.float32)
    v_t = np.array([-1.0, 2.0, 3.0], np.float32)
    r = np.array([1.0, 2.0, 3.0], np.float32)
    d = np.array([0.9, 0.9, 0.9], np.float32)
    out = vtrace(v_tm1, v_t, r, d, np.ones(3, np.float32))
    # By hand: v_2 = 3 + .9*3 = 5.7; v_1 = 2 + .9*5.7 = 7.13; v_0 = 1 + .9*7.13 = 7.417.
    np.testing.assert_allclose(out.errors + v_tm1, [7.417, 7.13, 5.7], rtol=1e-6)


def test_zero_rho_cuts_the_trace():
    """A masked transition (rho 0) adds no error and passes nothing back to earlier steps."""
    v_tm1, v_t, r, d, rho = (np.float32(a) for a in random_inputs(1, T=6))
    rho = rho.copy()
    rho[3] = 0.0
    out = vtrace(v_tm1, v_t, r, d * (rho > 0), rho)
    assert out.errors[3] == 0.0
    # Step 2 now bootstraps from V(x_3) alone: its error is one clipped TD error.
    expected = min(1.0, rho[2]) * (r[2] + d[2] * v_t[2] - v_tm1[2])
    np.testing.assert_allclose(out.errors[2], expected, rtol=1e-5)
