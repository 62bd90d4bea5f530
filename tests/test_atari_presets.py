"""--preset=atari and the Atari env settings: each preset resolves to the values docs/atari.md
documents, flags and files override it, bad presets and env families are one line (exit 2),
the learners clip rewards (hand-computed returns), and episodic life ends an episode at each
lost life without joining two games (a hand-written pool, then envpool's Breakout)."""

import os
import re
import subprocess
import sys

import gymnasium as gym
import jax
import numpy as np
import pytest

from trellis.agents.registry import AGENTS, agent_module
from trellis.builders.contract.config import ExperimentConfig, settings
from trellis.builders.experiments.env_worker import _GymnasiumEnvs
from trellis.envs import UnknownEnvError, make_env_factory
from trellis.envs import atari as atari_envs
from trellis.envs.atari import AleVectorFactory, atari_factory, with_settings
from trellis.envs.envpool_envs import EnvpoolFactory, EnvpoolVector
from trellis.envs.specs import EnvSpec
from trellis.launch import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "atari.md")
PONG = "--env=envpool:Pong-v5"


def documented_presets() -> dict[str, dict[str, str]]:
    """docs/atari.md's preset table: {agent: {setting: value as written}}, '.' cells left out."""
    with open(DOC) as f:
        text = f.read()
    table = re.search(r"<!-- preset table: start -->\n(.*?)<!-- preset table: end -->", text,
                      re.S).group(1)
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines()]
    header, body = rows[0], rows[2:]
    return {agent: {row[0]: row[i] for row in body if row[i] != "."}
            for i, agent in enumerate(header) if i}


def _setting(agent: str, name: str):
    return next(s for cls in (agent_module(agent).Config, flags.AtariConfig, ExperimentConfig)
                for s in settings(cls) if s.name == name)


def _resolved(run: flags.RunSettings, name: str):
    return getattr(next(c for c in (run.atari, run.experiment, run.agent) if hasattr(c, name)),
                   name)


def test_the_table_documents_every_preset_and_no_other():
    documented = documented_presets()
    having = {a for a in AGENTS if "atari" in getattr(agent_module(a), "PRESETS", {})}
    assert set(documented) == having == {"impala", "appo", "ppo", "r2d2"}
    for agent, values in documented.items():
        assert set(values) == set(agent_module(agent).PRESETS["atari"]), agent


@pytest.mark.parametrize("agent", sorted(documented_presets()))
def test_preset_resolves_to_the_documented_settings(agent):
    pytest.importorskip("envpool")
    run = flags.parse([f"--agent={agent}", "--preset=atari", PONG])
    assert run.options.preset == "atari"
    for name, text in documented_presets()[agent].items():
        expected = flags.from_text(_setting(agent, name), text)
        assert _resolved(run, name) == pytest.approx(expected), (agent, name)


def test_flags_and_a_settings_file_override_the_preset(tmp_path):
    pytest.importorskip("envpool")
    path = tmp_path / "mine.yaml"
    path.write_text("entropy_cost: 0.02\n")
    run = flags.parse(["--agent=impala", "--preset=atari", PONG, f"--config={path}",
                       "--learning_rate=0.001", "--episodic_life=false"])
    assert run.agent.learning_rate == 0.001 and run.agent.entropy_cost == 0.02
    assert run.atari.episodic_life is False
    assert run.agent.max_grad_norm == 40.0 and run.atari.noop_max == 30  # The preset's.
    # The preset can be named in the file too; config.json records the resolved values.
    path.write_text("preset: atari\nagent: ppo\n")
    run = flags.parse([f"--config={path}", PONG])
    assert run.agent.clip_epsilon == 0.1 and run.saved_options()["episodic_life"] is True


def test_atari_settings_reach_the_env_factory():
    pytest.importorskip("envpool")
    run = flags.parse(["--agent=ppo", "--preset=atari", PONG, "--frame_stack=2",
                       "--frame_size=64"])
    _, factory = run.build()
    assert isinstance(factory, EnvpoolFactory)
    options = dict(factory.options)
    assert options["episodic_life"] is True and options["noop_max"] == 30
    assert factory.spec().observation_shape == (2, 64, 64)


def test_atari_setting_names_are_no_agents():
    names = {s.name for s in settings(flags.AtariConfig)}
    assert names == set(atari_envs.SETTINGS)
    for agent in AGENTS:
        assert not names & {s.name for s in settings(agent_module(agent).Config)}, agent


def test_a_bad_preset_through_run_py_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "run.py"),
                          "--preset=atary"], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "run.py: error: --preset must be one of auto, atari, mujoco, minatar, dmc, classic, "
        "tic_tac_toe, connect_four or none, got 'atary'"]


@pytest.mark.parametrize("argv,line", [
    (["--agent=dqn", "--preset=atari", PONG],
     "--agent=dqn has no --preset=atari; the agents that have it: appo, impala, ppo, r2d2"),
    (["--preset=atari"],
     "--preset=atari is for Atari envs (ALE/NAME-v5, envpool:NAME-v5), not --env=CartPole-v1"),
    (["--frame_skip=2", "--noop_max=0"],
     "the Atari settings (frame_skip, noop_max) are for Atari envs (ALE/NAME-v5, "
     "envpool:NAME-v5), not --env=CartPole-v1"),
])
def test_a_preset_or_setting_the_agent_or_env_lacks_is_one_line(argv, line):
    """The same UsageError as above, which run.py prints as one line with exit code 2."""
    with pytest.raises(flags.UsageError) as raised:
        flags.parse(argv)
    assert str(raised.value) == line


# --- Reward clipping in the learners ------------------------------------------------------


def test_ppo_clips_rewards_before_its_returns_hand_computed():
    """One unroll x0 -> x1 -> x2 (terminal), rewards 2 and -3, values 0, gamma 0.9, GAE
    lambda 1. Clipped to [-1, 1]: G1 = -1, G0 = 1 + 0.9 * -1 = 0.1; unclipped: G1 = -3,
    G0 = 2 + 0.9 * -3 = -0.7."""
    from trellis.agents.ppo import PPOBuilder, PPOConfig
    from trellis.agents.ppo.learner import make_transitions

    batch = {
        "obs": np.zeros((3, 1, 4), np.float32),
        "action": np.zeros((3, 1), np.int32),
        "log_prob": np.zeros((3, 1), np.float32),
        "value": np.zeros((3, 1), np.float32),
        "reward": np.array([[0.0], [2.0], [-3.0]], np.float32),
        "terminated": np.array([[False], [False], [True]]),
        "truncated": np.zeros((3, 1), bool),
        "first": np.array([[True], [False], [False]]),
    }
    spec = EnvSpec((4,), "float32", 2, (), "int32")
    for clip, returns in ((1.0, [0.1, -1.0]), (None, [-0.7, -3.0])):
        config = PPOConfig(discount=0.9, gae_lambda=1.0, reward_clip=clip, unroll_length=2,
                           batch_size=1, num_minibatches=1)
        networks = PPOBuilder(config).make_networks(spec)
        out = make_transitions(networks, config, batch)
        np.testing.assert_allclose(out["return"], returns, rtol=1e-6)


@pytest.mark.slow  # Two compilations of IMPALA's update: 7-13 s on a busy 2-core machine.
def test_impala_learns_from_clipped_rewards():
    """The same update from rewards (3, -2) clipped to [-1, 1] as from (1, -1) unclipped;
    not as from (3, -2) unclipped."""
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.agents.impala.learner import make_training

    rng = np.random.default_rng(0)
    T, B = 3, 1
    batch = {
        "obs": rng.normal(size=(T, B, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=(T, B)).astype(np.int32),
        "logits": rng.normal(size=(T, B, 2)).astype(np.float32),
        "reward": np.array([[0.0], [3.0], [-2.0]], np.float32),
        "terminated": np.zeros((T, B), bool),
        "truncated": np.zeros((T, B), bool),
        "first": np.zeros((T, B), bool),
    }
    clipped = dict(batch, reward=np.clip(batch["reward"], -1, 1))
    spec = EnvSpec((4,), "float32", 2, (), "int32")

    def loss_fn(clip):
        config = ImpalaConfig(batch_size=B, unroll_length=T - 1, reward_clip=clip,
                              hidden_sizes=(8,))
        training = make_training(ImpalaBuilder(config).make_networks(spec), config)
        update = jax.jit(training.make_update(None))
        state = training.init(jax.random.PRNGKey(0))
        return lambda data: float(update(state, data)[1]["loss"])

    clipping, plain = loss_fn(1.0), loss_fn(None)
    assert clipping(batch) == pytest.approx(plain(clipped), rel=1e-6)
    assert plain(batch) != pytest.approx(plain(clipped), rel=1e-3)


# --- Episodic life ------------------------------------------------------------------------


class _LivesPool:
    """A stand-in envpool pool of one game with 2 lives: a life is lost at step 2 (terminated,
    the game goes on), the game ends at step 4 and resets at step 5."""

    config = {"num_envs": 1}
    observation_space, action_space = None, gym.spaces.Discrete(2)

    def __init__(self):
        self.t = 0

    def reset(self):
        self.t = 0
        return np.zeros((1, 1)), {"elapsed_step": np.zeros(1, int)}

    def step(self, actions):
        self.t += 1
        elapsed = np.array([0 if self.t == 5 else self.t])
        terminated = np.array([self.t in (2, 4)])
        info = {"elapsed_step": elapsed, "terminated": np.array([self.t == 4])}
        return np.zeros((1, 1)), np.ones(1), terminated, np.zeros(1, bool), info


def test_a_lost_life_ends_an_episode_without_resetting_the_game():
    envs = EnvpoolVector(_LivesPool(), episodic_life=True)
    envs.reset()
    terminated = [bool(envs.step(np.zeros(1))[2][0]) for _ in range(6)]
    assert terminated == [False, True, False, True, False, False]
    # Without episodic life, the same pool's step after a lost life (no reset) is an error.
    envs = EnvpoolVector(_LivesPool())
    envs.reset()
    envs.step(np.zeros(1))
    envs.step(np.zeros(1))
    with pytest.raises(RuntimeError, match="an episode boundary the env worker would not see"):
        envs.step(np.zeros(1))


def _play(factory, num_envs: int, steps: int, seed: int = 3):
    """Steps random actions; per step (reward, terminated, lives, elapsed_step), [steps, N]."""
    envs = factory.make_vector(num_envs, seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        _, reward, terminated, truncated, info = envs.step(
            rng.integers(0, envs.single_action_space.n, num_envs))
        assert not truncated.any()
        out.append((reward, terminated, np.asarray(info["lives"]),
                    np.asarray(info["elapsed_step"])))
    envs.close()
    return [np.array(x) for x in zip(*out, strict=True)]


def test_breakout_with_and_without_episodic_life():
    """Breakout has 5 lives. With episodic life each lost life is a terminated step and only
    the last one's game resets; the env worker reports one episode per game, with the game's
    score and length (a tracker fed `terminated` alone would report 5, one per life). Without
    it, only the game's end is terminated."""
    pytest.importorskip("envpool")
    base = make_env_factory("envpool:Breakout-v5")
    reward, terminated, lives, elapsed = (
        x[:, 0] for x in _play(with_settings(base, {"episodic_life": True}), 1, 600))
    over = np.flatnonzero(terminated & (lives == 0))
    assert len(over) >= 2, "random play ends a game of Breakout in ~125 steps"
    game = slice(0, over[0] + 1)  # The first game: its steps up to its end.
    ends = np.flatnonzero(terminated[game])
    assert len(ends) == 5 and list(lives[ends]) == [4, 3, 2, 1, 0]
    assert all(elapsed[t + 1] > 0 for t in ends[:-1])  # The game goes on after a lost life,
    assert elapsed[ends[-1] + 1] == 0  # and resets after its last.
    # The env worker's adapter: its first episode comes with the fifth lost life.
    envs = _GymnasiumEnvs(with_settings(base, {"episodic_life": True}).make_vector(1, seed=3), 1)
    envs.reset(seed=3)
    rng = np.random.default_rng(3)
    rewards, ends, episodes = [], 0, []
    while not episodes:
        fields, episodes = envs.step(rng.integers(0, 4, 1))
        rewards.append(float(fields["reward"][0]))
        ends += int(fields["terminated"][0])
    assert ends == 5 and episodes == [(sum(rewards), len(rewards))]
    reward, terminated, lives, _ = (x[:, 0] for x in _play(base, 1, 600))
    assert terminated.any() and (lives[terminated] == 0).all()


# --- Atari ids: envpool, else ALE's own vector env ----------------------------------------


def test_ale_ids_run_on_envpool_when_installed_else_on_ale(monkeypatch):
    pytest.importorskip("envpool")
    assert atari_factory("CartPole-v1") is None
    assert atari_factory("envpool:Pong-v5") is None  # envpool's own ids stay as they are.
    assert atari_factory("ALE/Pong-v5") == EnvpoolFactory(
        "envpool:Pong-v5", (("repeat_action_probability", 0.25),))
    assert atari_factory("ALE/NoSuchGame-v5") == AleVectorFactory("ALE/NoSuchGame-v5")
    assert make_env_factory("ALE/Pong-v5") == atari_factory("ALE/Pong-v5")  # run.py's way.
    monkeypatch.setattr(atari_envs, "envpool_available", lambda: False)
    assert atari_factory("ALE/Pong-v5") == AleVectorFactory("ALE/Pong-v5")


def test_settings_by_trellis_name_become_each_backends_arguments():
    ale = with_settings(AleVectorFactory("ALE/Pong-v5"),
                        {"frame_skip": 2, "frame_size": 64, "noop_max": None})
    assert ale.options == (("frameskip", 2), ("img_height", 64), ("img_width", 64))
    pytest.importorskip("envpool")
    pong = with_settings(atari_factory("ALE/Pong-v5"), {"repeat_action_probability": 0.0})
    assert dict(pong.options) == {"repeat_action_probability": 0.0}  # The v5 id's 0.25 goes.
    with pytest.raises(UnknownEnvError, match="need an Atari env"):
        with_settings(make_env_factory("envpool:CartPole-v1"), {"frame_skip": 2})
