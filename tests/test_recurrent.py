"""Stateful policies: the learner's LSTM unroll from a recorded state reproduces what the
actor computed; the inference server resets the state at `first` and for a restarted worker's
slots (only those); unrolls never span a restart or hide an episode start."""

import threading

import jax
import numpy as np
import pytest

from tests.test_run import run, summary
from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
from trellis.builders.contract.agent import STATE_PREFIX, QueueSpec, recorded_state
from trellis.builders.experiments.inference import InferenceServer, InferenceSettings, ServedPolicy
from trellis.builders.experiments.step_format import step_specs
from trellis.builders.experiments.unroll_recorder import UnrollRecorder
from trellis.envs import EnvSpec
from trellis.launch import run as launch_run

SPEC = EnvSpec((2,), "float32", 3, (), "int32")  # Two observed numbers, three actions.
K, T = 4, 6


def lstm_impala(**overrides):
    builder = ImpalaBuilder(ImpalaConfig(core="lstm", lstm_size=8, hidden_sizes=(16,),
                                         **overrides))
    networks = builder.make_networks(SPEC)
    # Scaled-up params, so the recurrence matters beyond float32 noise.
    params = jax.tree.map(lambda x: 3.0 * x, networks.init(jax.random.PRNGKey(0)))
    # Observation moments far from the identity, so actor and learner must both apply them.
    params["obs_norm"]["normalizer"] = {"count": np.float32(100.0),
                                        "mean": np.array([0.5, -0.3], np.float32),
                                        "var": np.array([4.0, 0.25], np.float32)}
    return builder, networks, params


def serve(builder, networks, params, num_workers, steps, overlap=1, rng_seed=0,
          run_ids=None):
    """Feeds `steps` random steps per worker through an InferenceServer; returns its unrolls,
    the inputs and the server."""
    unrolls = []
    initial_state = builder.initial_state(SPEC, num_workers * K)
    server = InferenceServer(
        ServedPolicy(builder.make_policy(networks), params, jax.random.PRNGKey(1), SPEC,
                     builder.extras_spec(SPEC), initial_state),
        InferenceSettings(num_workers, K, T, overlap=overlap, timeout_s=0.0),
        lambda unroll, versions: unrolls.append(unroll), threading.Event())
    server.start()
    rng = np.random.default_rng(rng_seed)
    inputs = []
    try:
        for i in range(steps):
            for w in range(num_workers):
                step = dict(obs=rng.normal(size=(K, 2)).astype(np.float32),
                            reward=np.zeros(K, np.float32),
                            terminated=np.zeros(K, bool), truncated=np.zeros(K, bool),
                            first=(rng.random(K) < 0.15) | (i == 0))
                run_id = 1 if run_ids is None else run_ids(w, i)
                inputs.append((w, run_id, step))
                server.step(w, run_id, step)
    finally:
        server._stop.set()
        server.join(5)
    return unrolls, inputs, server


def learner_logits(networks, params, unroll):
    """What the learner computes: the network unrolled over [T + 1, K] from the recorded state."""
    logits, _, _ = jax.jit(networks.apply)(params, unroll["obs"], unroll["first"],
                                           recorded_state(unroll))
    return np.asarray(logits)


@pytest.mark.parametrize("overlap", [1, 3])
def test_learner_unroll_from_recorded_state_gives_the_actors_logits(overlap):
    builder, networks, params = lstm_impala()
    unrolls, _, _ = serve(builder, networks, params, num_workers=2, steps=25, overlap=overlap)
    # 25 steps per worker: the first unroll takes T + 1, each next one T + 1 - overlap more.
    assert len(unrolls) == 2 * (1 + (25 - (T + 1)) // (T + 1 - overlap))
    for unroll in unrolls:
        assert unroll["state/c"].shape == (1, K, 8) and unroll["obs"].shape == (T + 1, K, 2)
        # The actor's logits, recorded step by step with the state carried on the device.
        np.testing.assert_allclose(learner_logits(networks, params, unroll), unroll["logits"],
                                   rtol=1e-5, atol=1e-5)
    # The state is not trivially zero (else the test would not check the carry).
    assert any(np.abs(u["state/h"]).max() > 0.1 for u in unrolls)


def test_logits_differ_without_the_recorded_state():
    """The check above can fail: starting from zeros instead gives other logits."""
    builder, networks, params = lstm_impala()
    unrolls, _, _ = serve(builder, networks, params, num_workers=1, steps=20)
    unroll = next(u for u in unrolls[1:] if not u["first"][0].all())
    zeros = {name: np.zeros_like(v) for name, v in unroll.items()
             if name.startswith(STATE_PREFIX)}
    wrong = learner_logits(networks, params, dict(unroll, **zeros))
    assert np.abs(wrong - unroll["logits"]).max() > 1e-3


def step_once(networks, params, policy, obs, state, first):
    return policy(params, jax.random.PRNGKey(0), obs, state, first)


def test_policy_resets_exactly_the_rows_where_first_is_set():
    builder, networks, params = lstm_impala()
    policy = jax.jit(builder.make_policy(networks))
    obs = np.random.default_rng(0).normal(size=(K, 2)).astype(np.float32)
    state = {name: np.full((K, 8), 0.7, np.float32) for name in ("c", "h")}
    first = np.array([True, False, True, False])
    _, extras, new = step_once(networks, params, policy, obs, state, first)
    _, fresh, fresh_state = step_once(networks, params, policy, obs,
                                      builder.initial_state(SPEC, K), np.ones(K, bool))
    _, kept, _ = step_once(networks, params, policy, obs, state, np.zeros(K, bool))
    np.testing.assert_allclose(extras["logits"][first], fresh["logits"][first], atol=1e-6)
    np.testing.assert_allclose(extras["logits"][~first], kept["logits"][~first], atol=1e-6)
    assert np.abs(extras["logits"][~first] - fresh["logits"][~first]).max() > 1e-3
    np.testing.assert_allclose(new["h"][first], fresh_state["h"][first], atol=1e-6)


def test_restarted_worker_slots_restart_from_the_initial_state_and_only_those():
    """Worker 1 comes back with a new run id at step 9, its envs not marked first (a restart
    the policy cannot see): its slots restart from the initial state, worker 0's keep theirs."""
    builder, networks, params = lstm_impala()
    restart_at = 9

    def run_ids(w, i):
        return 2 if (w == 1 and i >= restart_at) else 1

    unrolls, inputs, server = serve(builder, networks, params, num_workers=2, steps=20,
                                    run_ids=run_ids, rng_seed=3)
    assert server.slot_resets == 1
    # Replays each worker's steps through the policy by hand, resetting at the restart.
    policy = jax.jit(builder.make_policy(networks))
    states = {w: builder.initial_state(SPEC, K) for w in (0, 1)}
    last_run = {}
    expected = {0: [], 1: []}
    for w, run_id, step in inputs:
        if last_run.get(w, run_id) != run_id:
            states[w] = builder.initial_state(SPEC, K)
        last_run[w] = run_id
        _, extras, states[w] = step_once(networks, params, policy, step["obs"], states[w],
                                         step["first"])
        expected[w].append(np.asarray(extras["logits"]))
    # Every recorded logit matches the replay: the restarted slots were reset at the restart
    # (and no other time), worker 0's carried on.
    recorded = {0: [], 1: []}
    for w, _, step in inputs:
        recorded[w].append(step["obs"])
    for unroll in unrolls:
        w = next(w for w in (0, 1)
                 if any(np.array_equal(unroll["obs"][0], o) for o in recorded[w]))
        i = next(i for i, o in enumerate(recorded[w]) if np.array_equal(unroll["obs"][0], o))
        np.testing.assert_allclose(unroll["logits"], np.stack(expected[w][i:i + T + 1]),
                                   rtol=1e-5, atol=1e-5)
        # No unroll of worker 1 spans the restart.
        if w == 1:
            assert i + T < restart_at or i >= restart_at
    # Without the reset, worker 1's first step after the restart would differ.
    stale = step_once(networks, params, policy, inputs[2 * restart_at + 1][2]["obs"],
                      _replay_state(builder, networks, params, policy, inputs, 1, restart_at),
                      inputs[2 * restart_at + 1][2]["first"])[1]["logits"]
    assert np.abs(np.asarray(stale) - expected[1][restart_at]).max() > 1e-3


def _replay_state(builder, networks, params, policy, inputs, worker, steps):
    """Worker `worker`'s state after its first `steps` steps, as if never restarted."""
    state = builder.initial_state(SPEC, K)
    for _, _, step in [x for x in inputs if x[0] == worker][:steps]:
        state = step_once(networks, params, policy, step["obs"], state, step["first"])[2]
    return state


def test_recorder_captures_state_where_each_unroll_begins_with_overlap():
    out = []
    specs = {"x": step_specs(SPEC, {})["reward"], "state/s": step_specs(SPEC, {})["reward"]}
    rec = UnrollRecorder(specs, 1, 1, 4, lambda unroll, versions: out.append(unroll),
                         overlap=2)
    for i in range(12):  # State at step i is 100 + i.
        rec.record([(0, 1)], {"x": np.full((1, 1), i, np.float32)},
                   state=lambda i=i: {"s": np.full((1, 1), 100 + i, np.float32)})
    # Unrolls of 5 steps, each next one repeating the last 2 of the previous.
    assert [u["x"][:, 0].tolist() for u in out] == [[0, 1, 2, 3, 4], [3, 4, 5, 6, 7],
                                                   [6, 7, 8, 9, 10]]
    assert [u["state/s"][0, 0] for u in out] == [100, 103, 106]


def test_queue_spec_rejects_an_overlap_outside_the_unroll():
    with pytest.raises(ValueError, match=r"overlap=6 must be in \[1, unroll_length=5\]"):
        QueueSpec(5, 8, 2, overlap=6)


@pytest.mark.slow
@pytest.mark.parametrize("platform,flags", [
    ("local_mt", []),
    ("local_mp", ["--unroll_queue=replay"]),  # The state fields go through a Queue table too.
    ("ray", []),
])
def test_lstm_impala_runs_and_stops_on_every_platform(platform, flags, tmp_path):
    out = run(["--agent=impala", "--core=lstm", "--env=CartPoleNoVel-v1",
               f"--platform={platform}", "--total_env_steps=20000", "--stop_at_return=none",
               "--eval_every=10000", "--eval_episodes=2", f"--logdir={tmp_path}", *flags])
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["stopped_by"] == "budget" and s["env_steps"] >= 20000 and s["learner_steps"] > 0


@pytest.mark.slow
def test_conv_lstm_impala_trains_on_pong(tmp_path):
    """Smoke: the IMPALA-paper conv torso and the LSTM on ALE frames (pip install -e '.[atari]')."""
    pytest.importorskip("ale_py", reason="ALE needs the atari extra: pip install -e '.[atari]'")
    out = run(["--agent=impala", "--core=lstm", "--env=ALE/Pong-v5", "--platform=local_mt",
               "--num_actors=1", "--envs_per_actor=4", "--batch_size=4",
               "--total_env_steps=3000", "--stop_at_return=none", f"--logdir={tmp_path}"],
              timeout=600)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path)
    assert s["stopped_by"] == "budget" and s["learner_steps"] > 0


@pytest.mark.slow  # The residual torso on 84x84 frames compiles for a while on the CPU.
def test_pixel_observations_go_through_the_impala_resnet_torso_then_the_lstm():
    spec = EnvSpec((4, 84, 84), "uint8", 6, (), "int32")  # ALE's stacked frames.
    networks = ImpalaBuilder(ImpalaConfig(core="lstm", lstm_size=32)).make_networks(spec)
    params = networks.init(jax.random.PRNGKey(0))["params"]
    torso = params["torso"]
    # Three sections of conv + two residual blocks (two convs each), 16/32/32 channels.
    assert [torso[f"Conv_{i}"]["kernel"].shape[-1] for i in range(3)] == [16, 32, 32]
    assert len([k for k in torso if k.startswith("ResidualBlock")]) == 6
    assert torso["Dense_0"]["kernel"].shape == (11 * 11 * 32, 256)  # 84 -> 42 -> 21 -> 11.
    obs = np.random.default_rng(0).integers(0, 255, size=(3, 2, 4, 84, 84), dtype=np.uint8)
    logits, values, state = jax.jit(networks.apply)(
        {"params": params}, obs, np.ones((3, 2), bool), networks.initial_state(2))
    assert logits.shape == (3, 2, 6) and values.shape == (3, 2)
    assert state["h"].shape == (2, 32) and np.abs(np.asarray(state["h"])).max() > 0


@pytest.mark.parametrize("argv,expected", [
    (["--agent=ppo", "--core=lstm"], "--core is a setting of iimpala, impala, not of ppo"),
    (["--agent=impala", "--core=gru"], "--core must be one of 'none', 'lstm', got 'gru'"),
])
def test_core_flag_errors_are_one_line_and_exit_2(argv, expected, capsys):
    assert launch_run.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("run.py: error: ") and expected in err, err


@pytest.mark.parametrize("settings,residual", [
    ({}, False),  # Feed-forward: the DQN paper's conv torso, cheap on CPUs.
    ({"pixel_torso": "resnet"}, True),  # Feed-forward on the IMPALA paper's torso (cleanba's).
    ({"core": "lstm"}, True),
    ({"core": "lstm", "pixel_torso": "nature"}, False),
])
def test_pixel_torso_follows_the_core_unless_set(settings, residual):
    spec = EnvSpec((4, 84, 84), "uint8", 6, (), "int32")
    config = ImpalaConfig(**settings)
    assert config.pixel_torso == ("resnet" if residual else "nature")
    params = jax.eval_shape(ImpalaBuilder(config).make_networks(spec).init,
                            jax.random.PRNGKey(0))["params"]
    assert any(k.startswith("ResidualBlock") for k in params["torso"]) == residual
