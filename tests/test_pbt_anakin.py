"""Population-based training on the device (`--platform=anakin --pbt`): the exploit copies
the donor exactly, explore stays within the documented factors and ranges, PBT rounds compile
nothing new, and the events reach stdout and metrics.jsonl."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest

pytest.importorskip("gymnax", reason="gymnax is an optional extra (pip install -e '.[gymnax]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from tests.test_anakin import CARTPOLE, small_ppo_anakin  # noqa: E402
from trellis.agents.common import STATE_HPARAMS, get_hparams, set_hparams  # noqa: E402
from trellis.builders.experiments import anakin as anakin_module  # noqa: E402
from trellis.builders.experiments.device_episodes import (  # noqa: E402
    Episodes,
    track_episodes,
    window_in_order,
)
from trellis.builders.experiments.device_pbt import (  # noqa: E402
    exploit_and_explore,
    explore,
    window_means,
)
from trellis.builders.experiments.pbt import Dimension, PBTConfig, PopulationPBT, quantile_size  # noqa: E402
from trellis.launch import run  # noqa: E402

LR_RANGE = Dimension("loguniform", (1e-4, 1e-1))


@pytest.fixture(scope="module")
def ppo():
    return small_ppo_anakin(return_window=4)


def _pbt(**settings) -> PopulationPBT:
    return PopulationPBT(PBTConfig(**settings), {"learning_rate": LR_RANGE})


def _distinct_population(anakin, num_members: int):
    """Members whose every training-state leaf and return window differ, with known ranks:
    member m's window mean is 10 * (m + 1) except member 2's, the worst (1.0); learning rates
    (m + 1) * 1e-3."""
    keys = jax.random.split(jax.random.key(7), num_members)
    lrs = jnp.arange(1, num_members + 1, dtype=jnp.float32) * 1e-3
    population = jax.jit(jax.vmap(anakin.init_member))(keys, {"learning_rate": lrs})
    noise = iter(jax.random.split(jax.random.key(8), 1000))
    # Every leaf but the hyper-parameters gets member-specific values (adam's moments start
    # at zero, which a wrong gather would copy too).
    hparams = get_hparams(population.train)
    train = jax.tree.map(
        lambda x: x + jax.random.normal(next(noise), x.shape).astype(x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating) else x, population.train)
    train = set_hparams(train, hparams).replace(
        step=jnp.arange(num_members, dtype=jnp.int32) + 5)
    scores = np.array([10.0 * (m + 1) for m in range(num_members)], np.float32)
    scores[2] = 1.0
    window = population.episodes.returns.shape[1]
    episodes = population.episodes.replace(
        returns=jnp.asarray(np.repeat(scores[:, None], window, 1)),
        lengths=jnp.asarray(np.arange(num_members * window).reshape(num_members, window)),
        count=jnp.full(num_members, window + 3, jnp.int32))
    return population.replace(train=train, episodes=episodes)


def _member(tree, m):
    """Member m's leaves, as host arrays (keys as their data)."""
    return jax.tree.map(lambda x: np.asarray(jax.random.key_data(x) if jnp.issubdtype(
        x.dtype, jax.dtypes.prng_key) else x)[m], tree)


def _leaves_equal(a, b) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _without_hparams(train):
    return set_hparams(train, {name: jnp.zeros_like(v) for name, v in get_hparams(train).items()})


@pytest.fixture(scope="module")
def population4(ppo):
    return _distinct_population(ppo[0], 4)


def test_exploit_copies_the_donors_state_exactly(population4):
    """4 members, quantile 0.25: the worst (member 2) copies the best (member 3): params,
    optimizer state, RNG key and step counter equal the donor's, its return window is empty
    (its score counts only its own episodes from then on); its learning rate is the donor's
    times 0.8 or 1.2; the other members are unchanged."""
    population = population4
    pbt = _pbt(pbt_quantile=0.25, pbt_resample_probability=0.0)
    train, episodes, event = jax.jit(functools.partial(exploit_and_explore, pbt=pbt,
                                                       hparams=STATE_HPARAMS))(
        population.train, population.episodes, jax.random.key(1))
    np.testing.assert_array_equal(event.donor, [0, 1, 3, 3])
    np.testing.assert_allclose(event.score, [10.0, 20.0, 1.0, 40.0])
    assert bool(event.round)
    donor_train = _member(_without_hparams(population.train), 3)
    got_train = _member(_without_hparams(train), 2)
    for name in ("params", "opt_state", "key", "step"):
        assert _leaves_equal(getattr(got_train, name), getattr(donor_train, name)), name
    assert int(train.step[2]) == int(population.train.step[3]) == 8
    count = int(population.episodes.count[2])
    assert count > 0 and int(episodes.count[2]) == count  # Its episodes stay counted.
    assert int(episodes.window_start[2]) == count  # Its window starts empty.
    assert np.isneginf(np.asarray(window_means(episodes))[2])  # Ranks last until it plays.
    # The episodes under way in its envs stay its own.
    np.testing.assert_array_equal(episodes.episode_return[2],
                                  population.episodes.episode_return[2])
    for m in (0, 1, 3):
        assert _leaves_equal(_member(train, m), _member(population.train, m))
        assert _leaves_equal(_member(episodes, m), _member(population.episodes, m))
    lr = np.asarray(get_hparams(train)["learning_rate"])
    ratio = lr[2] / 4e-3
    assert math.isclose(ratio, 0.8, rel_tol=1e-6) or math.isclose(ratio, 1.2, rel_tol=1e-6)
    np.testing.assert_allclose(lr[[0, 1, 3]], [1e-3, 2e-3, 4e-3], rtol=1e-6)
    np.testing.assert_allclose(event.before["learning_rate"], [1e-3, 2e-3, 3e-3, 4e-3],
                               rtol=1e-6)
    np.testing.assert_array_equal(event.after["learning_rate"], lr)


def test_explore_multiplies_by_the_factors_or_resamples_in_the_range():
    n = 4000
    values = {"learning_rate": jnp.full(n, 1e-2, jnp.float32),
              "entropy_cost": jnp.full(n, 0.01, jnp.float32)}
    factors = np.asarray(explore(values, jax.random.key(0), _pbt(
        pbt_resample_probability=0.0))["learning_rate"], np.float64) / 1e-2
    assert set(np.round(factors, 5).tolist()) == {0.8, 1.2}
    assert 0.45 < np.mean(np.isclose(factors, 0.8)) < 0.55  # Each with probability 1/2.
    drawn = np.asarray(explore(values, jax.random.key(1), _pbt(
        pbt_resample_probability=1.0))["learning_rate"], np.float64)
    assert drawn.min() >= 1e-4 * (1 - 1e-6) and drawn.max() <= 1e-1 * (1 + 1e-6)
    # Log-uniform: a quarter of the log-range per quarter (binomial, 5 sigma).
    quarters = np.histogram(np.log10(drawn), bins=4, range=(-4, -1))[0] / n
    np.testing.assert_allclose(quarters, 0.25, atol=5 * math.sqrt(0.25 * 0.75 / n))
    mixed = np.asarray(explore(values, jax.random.key(2), _pbt())["learning_rate"]) / 1e-2
    multiplied = np.isclose(mixed, 0.8) | np.isclose(mixed, 1.2)
    assert abs(1 - np.mean(multiplied) - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n)
    out = explore(values, jax.random.key(3), _pbt())
    np.testing.assert_array_equal(out["entropy_cost"], values["entropy_cost"])  # Not searched.
    choice = PopulationPBT(PBTConfig(pbt_resample_probability=1.0),
                           {"learning_rate": Dimension("choice", (1e-3, 5e-3))})
    assert set(np.round(np.asarray(explore(values, jax.random.key(4), choice)[
        "learning_rate"], np.float64), 6).tolist()) == {1e-3, 5e-3}


@pytest.mark.parametrize("members, fraction, size", [
    (4, 0.25, 1), (64, 0.25, 16), (5, 0.25, 2), (3, 0.5, 1), (2, 0.5, 1), (10, 0.34, 4)])
def test_quantiles_are_counted_as_tune_counts_them(members, fraction, size):
    assert quantile_size(members, fraction) == size


def test_window_means_rank_members_without_episodes_last(population4):
    episodes = population4.episodes.replace(count=jnp.asarray([0, 2, 9, 4], jnp.int32))
    np.testing.assert_array_equal(window_means(episodes), [-np.inf, 20.0, 1.0, 40.0])


def test_a_restarted_window_holds_only_the_episodes_after_it():
    """One env ends 7 episodes of returns 1..7 in a window of 4; the window restarted after
    the 5th: it holds 6 and 7, in the ring buffer's slots 1 and 2, and the count stays 7."""
    episodes = Episodes.zeros(1, 4)
    for i in range(7):
        if i == 5:
            episodes = episodes.replace(window_start=episodes.count)
        no, yes = jnp.asarray([False]), jnp.asarray([True])
        episodes = track_episodes(episodes, jnp.zeros(1), no, yes)  # First step: return 0.
        episodes = track_episodes(episodes, jnp.asarray([float(i + 1)]), yes, no)
    assert int(episodes.count) == 7
    np.testing.assert_array_equal(
        window_in_order(np.asarray(episodes.returns), 7, int(episodes.window_start)), [6, 7])
    np.testing.assert_array_equal(window_in_order(np.asarray(episodes.returns), 7), [4, 5, 6, 7])
    assert float(window_means(episodes)) == 6.5


def test_run_py_pbt_compiles_nothing_per_round_and_logs_exploits(tmp_path, capsys,
                                                                   monkeypatch):
    """run.py --pbt: the backend compilations counted after each compiled call stay those of
    the first while rounds exploit and change learning rates; every exploit is a line on
    stdout and an entry of metrics.jsonl, and summary.json counts them."""
    compiles, per_call = [], []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    step = anakin_module.Population.step

    def counted_step(self):
        out = step(self)
        per_call.append((len(compiles), len(out[1])))
        return out

    monkeypatch.setattr(anakin_module.Population, "step", counted_step)
    run_dir = tmp_path / "run"
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        code = run.main(["--agent=ppo", "--platform=anakin", f"--env={CARTPOLE}",
                         "--batch_size=8", "--unroll_length=8", "--num_minibatches=2",
                         "--hidden_sizes=16", "--updates_per_call=4", "--num_seeds=4",
                         "--stop_at_return=none", "--total_env_steps=2048", "--pbt",
                         "--pbt_interval=500", "--member_hparams=learning_rate=1e-4:1e-1",
                         "--no_compile_cache", f"--logdir={run_dir}"])
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert code == 0
    # 8 calls of 4 updates; a round every 8 updates (500 env steps / 64 per update).
    assert [n for _, n in per_call] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert compiles and {c for c, _ in per_call} == {per_call[0][0]}
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("pbt at")]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    exploits = [e for r in records for e in r.get("pbt_exploits", [])]
    # 500 env steps: every 8th update (64 env steps each), one of 4 members each time.
    assert [e["env_steps"] for e in exploits] == [512, 1024, 1536, 2048]
    assert len(lines) == 4 and f"member {exploits[0]['member']} (return" in lines[0]
    for e in exploits:
        assert e["donor"] != e["member"] and e["donor_return"] >= e["member_return"]
        assert set(e["before"]) == set(e["after"]) == {"learning_rate", "entropy_cost"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["pbt_exploits"] == 4
    final = [m["hparams"]["learning_rate"] for m in summary["members"]]
    assert exploits[-1]["after"]["learning_rate"] == pytest.approx(final[exploits[-1]["member"]])
    config = json.loads((run_dir / "config.json").read_text())["command_line"]
    assert config["pbt"] is True and config["pbt_interval"] == 500


@pytest.mark.parametrize("argv, message", [
    (["--pbt"], "--pbt must be false unless --platform=anakin"),
    (["--platform=anakin", f"--env={CARTPOLE}", "--pbt",
      "--member_hparams=learning_rate=1e-4:1e-1"],
     "num_seeds must be at least 2 with --pbt, got 1"),
    (["--platform=anakin", f"--env={CARTPOLE}", "--pbt", "--num_seeds=4"],
     "member_hparams must be the hyper-parameters that --pbt perturbs"),
    (["--platform=anakin", f"--env={CARTPOLE}", "--pbt", "--num_seeds=4",
      "--member_hparams=learning_rate=1e-4:1e-1", "--pbt_quantile=0.6"],
     "--pbt_quantile must be in (0, 0.5], got 0.6"),
])
def test_bad_pbt_command_lines_are_one_line_and_exit_2(argv, message, capsys, tmp_path):
    assert run.main(["--agent=ppo", f"--logdir={tmp_path}", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_stop_at_return_fires_with_pbt(tmp_path):
    """An exploit every compiled call restarts one member's window each time, so "every member
    at the target" never holds; with --pbt the target is the best member's (issue 20)."""
    run_dir = tmp_path / "run"
    code = run.main(["--agent=ppo", "--platform=anakin", f"--env={CARTPOLE}",
                     "--batch_size=8", "--unroll_length=8", "--num_minibatches=2",
                     "--hidden_sizes=16", "--updates_per_call=1", "--num_seeds=4",
                     "--pbt", "--pbt_interval=64", "--member_hparams=learning_rate=1e-4:1e-1",
                     "--stop_at_return=5", "--return_window=5", "--total_env_steps=8192",
                     "--quiet", "--no_compile_cache", f"--logdir={run_dir}"])
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "return_target", summary
    assert summary["env_steps"] < 8192 and summary["pbt_exploits"] >= 1
    assert max(m["mean_return"] or 0 for m in summary["members"]) >= 5
