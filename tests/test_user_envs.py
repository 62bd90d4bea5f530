"""Envs users bring: Gymnasium's MODULE:ID from a package outside the tree, --env_kwargs and
--env_wrappers in env worker processes, an id registered in the launching process only, and
env objects from Python (a gymnax env with PPO, a JaxMARL-API env of one's own with IPPO)."""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
import threading

import cloudpickle
import flax.struct
import gymnasium as gym
import jax
import jax.numpy as jnp
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from trellis.agents.registry import agent_module
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.platforms import PopulationSettings
from trellis.builders.experiments.session import run_experiment
from trellis.envs import GymnasiumFactory, as_env_factory, gymnasium_factory
from trellis.launch import run
from trellis.launch.flags import UsageError, env_kwargs, parse

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [sys.executable, os.path.join(REPO, "launch", "run.py")]
RANDOM_CARTPOLE_RETURN = 22.0  # A uniform random policy's mean return on CartPole.
# The easy CartPole's: solved at a mean return of 60 (random: 22), episodes of at most 100 steps.
EASY_THRESHOLD, EASY_STEPS = 60.0, 100

# A package that registers an env when imported, as a user's would; on PYTHONPATH only. Its env
# and its wrapper write, into $USERCART_RECORD, which process made them with what.
PACKAGE = '''
import json
import os

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


def record(kind, **fields):
    directory = os.environ.get("USERCART_RECORD")
    if directory:
        path = os.path.join(directory, f"{kind}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"label": os.environ.get("TRELLIS_NODE_LABEL"), **fields}, f)


class EasyCart(CartPoleEnv):
    def __init__(self, **kwargs):
        known = {k: v for k, v in kwargs.items() if k == "render_mode"}
        super().__init__(**known)
        record("env", kwargs=kwargs)


gym.register("EasyCart-v0", entry_point=EasyCart, max_episode_steps=100,
             reward_threshold=60.0)
'''
WRAPPERS = '''
import gymnasium as gym

from usercart import record


class Marked(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        record("wrapper")

    def observation(self, observation):
        return observation


def mark(env):
    return Marked(env)
'''


@pytest.fixture
def package(tmp_path):
    """(PYTHONPATH holding the `usercart` package, the directory its records go to)."""
    site, records = tmp_path / "site", tmp_path / "records"
    (site / "usercart").mkdir(parents=True)
    (site / "usercart" / "__init__.py").write_text(PACKAGE)
    (site / "usercart" / "wrappers.py").write_text(WRAPPERS)
    records.mkdir()
    return str(site), records


def run_py(args, site, records, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [site, *filter(None, [os.environ.get("PYTHONPATH")])]), "USERCART_RECORD": str(records)}
    return subprocess.run(RUN + args, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=env)


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def records(directory, kind):
    return [json.loads(p.read_text()) for p in directory.glob(f"{kind}-*.json")]


@pytest.mark.parametrize("platform", ["local_mp", "local_mt"])
def test_module_id_from_a_package_trains_to_its_threshold(platform, package, tmp_path):
    """--env=usercart:EasyCart-v0 imports usercart (in the launcher and in every node
    process) and stops at the id's reward_threshold (--stop_at_return's default, auto)."""
    site, recorded = package
    out = run_py([f"--platform={platform}", "--env=usercart:EasyCart-v0", "--quiet",
                  "--total_env_steps=400000", f"--logdir={tmp_path / 'run'}"], site, recorded)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path / "run")
    assert s["stopped_by"] == "return_target", s
    assert s["stop_at_return"] == EASY_THRESHOLD and s["mean_return"] >= EASY_THRESHOLD, s
    with open(tmp_path / "run" / "config.json") as f:
        assert json.load(f)["command_line"]["env"] == "usercart:EasyCart-v0"


def test_env_kwargs_and_wrappers_reach_the_env_workers(package, tmp_path):
    """On local_mp, the envs of each env worker process get --env_kwargs (values read as JSON
    where they parse) and are wrapped by --env_wrappers; config.json keeps both for a resume."""
    site, recorded = package
    out = run_py(["--platform=local_mp", "--env=usercart:EasyCart-v0", "--quiet",
                  "--env_kwargs=tag=blue,sizes=[64,64],scale=0.5",
                  "--env_wrappers=usercart.wrappers:mark", "--num_actors=2",
                  "--envs_per_actor=4", "--total_env_steps=2000", "--stop_at_return=none",
                  f"--logdir={tmp_path / 'run'}"], site, recorded)
    assert out.returncode == 0, out.stderr
    envs = records(recorded, "env")
    workers = [r for r in envs if (r["label"] or "").startswith("actor")]
    assert len(workers) == 2, envs  # One record per env worker process.
    assert all(r["kwargs"] == {"tag": "blue", "sizes": [64, 64], "scale": 0.5}
               for r in workers), workers
    wrapped = [r["label"] for r in records(recorded, "wrapper")]
    assert sorted(label for label in wrapped if (label or "").startswith("actor")) == sorted(
        r["label"] for r in workers)
    with open(tmp_path / "run" / "config.json") as f:
        saved = json.load(f)["command_line"]
    assert saved["env_kwargs"] == "tag=blue,sizes=[64,64],scale=0.5"
    assert saved["env_wrappers"] == ["usercart.wrappers:mark"]


def test_an_id_registered_in_the_launching_process_only_trains_on_local_mp(tmp_path):
    """An env class defined in a function (so no worker can import it by name, as one defined
    in a notebook cell or a script's __main__) and registered here reaches local_mp's env
    workers, by value with the factory, and trains to its threshold."""

    class LocalCart(CartPoleEnv):
        pass

    assert "<locals>" in LocalCart.__qualname__
    env_id = "LocalCart-v0"
    gym.register(env_id, entry_point=LocalCart, max_episode_steps=EASY_STEPS,
                 reward_threshold=EASY_THRESHOLD)
    try:
        code = run.main(["--platform=local_mp", f"--env={env_id}", "--quiet",
                         "--total_env_steps=400000", f"--logdir={tmp_path / 'run'}"])
    finally:
        gym.registry.pop(env_id)
    assert code == 0
    s = summary(tmp_path / "run")
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= EASY_THRESHOLD, s


def test_a_pickled_factory_carries_its_registration():
    """What a worker process gets: a factory unpickled where its id is not registered builds
    its envs from the registration it carried."""

    def make_env(**kwargs):
        return gym.wrappers.TimeLimit(CartPoleEnv(**kwargs), 7)

    factory = gymnasium_factory(make_env)
    assert factory.env_id.startswith("python/make_env-v")
    payload = cloudpickle.dumps(factory)
    gym.registry.pop(factory.env_id)
    envs = pickle.loads(payload).make_vector(3, seed=0)
    envs.reset(seed=0)
    steps = 0
    while True:  # The constructor's own time limit ends the first episode.
        steps += 1
        *_, truncated, _ = envs.step(envs.action_space.sample() * 0)
        if truncated.any():
            break
    assert steps == 7
    with pytest.raises(Exception, match="not a registered Gymnasium id"):
        factory.validate()  # Not here any more: only the pickled copy carried it.


def test_a_registration_that_cannot_be_pickled_says_so_in_one_line():
    class Locked(CartPoleEnv):
        lock = threading.Lock()

    gym.register("LockedCart-v0", entry_point=Locked)
    try:
        with pytest.raises(TypeError, match="cannot be pickled to the env workers") as e:
            cloudpickle.dumps(GymnasiumFactory("LockedCart-v0"))
    finally:
        gym.registry.pop("LockedCart-v0")
    assert len(str(e.value).splitlines()) == 1


@pytest.mark.parametrize("text, expected", [
    ("tag=blue,sizes=[64,64],scale=0.5,on=true",
     {"tag": "blue", "sizes": [64, 64], "scale": 0.5, "on": True}),
    ('{"a": {"b": 1}, "c": "x, y"}', {"a": {"b": 1}, "c": "x, y"}),
    ('name="a=b"', {"name": "a=b"}),
    (None, {}),
])
def test_env_kwargs_are_json_objects_or_key_values(text, expected):
    assert env_kwargs(text) == expected


@pytest.mark.parametrize("argv, message", [
    (["--env=usercart_missing:EasyCart-v0"],
     "cannot import module 'usercart_missing' (No module named 'usercart_missing')"),
    (["--env=gymnasium.envs:CartPol-v1"],
     "importing 'gymnasium.envs' registered no Gymnasium id 'CartPol-v1'. Did you mean: "
     "gymnasium.envs:CartPole-v1"),
    (["--env_kwargs=blue"], "--env_kwargs must be a JSON object or KEY=VALUE,..., got 'blue'"),
    (["--env_kwargs=foo=1"], "CartPoleEnv.__init__() got an unexpected keyword argument 'foo'"),
    (["--env_wrappers=gymnasium.wrappers:Nope"], "'gymnasium.wrappers' has no 'Nope'"),
    (["--env=gymnax:CartPole-v1", "--platform=anakin", "--env_kwargs=mass=2"],
     "gymnax:CartPole-v1 has no env param mass; its params: max_steps_in_episode"),
    (["--env=gymnax:CartPole-v1", "--platform=anakin", "--env_wrappers=a:b"],
     "env wrappers apply to Gymnasium envs"),
    (["--env=sleep:1", "--env_kwargs=a=1"], "env kwargs apply to Gymnasium ids"),
])
def test_bad_env_settings_are_one_line(argv, message):
    with pytest.raises(UsageError) as e:
        parse(argv)
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)


def test_env_objects_that_cannot_run_are_refused_in_one_line():
    with pytest.raises(TypeError, match="pass the constructor of CartPoleEnv"):
        as_env_factory(CartPoleEnv())
    with pytest.raises(TypeError, match="cannot make an env of 3"):
        as_env_factory(3)


def test_a_gymnax_env_object_trains_with_ppo_on_anakin(tmp_path):
    """gymnax's (env, params) from Python, its params' time limit 100: PPO's return rises far
    above random, and never above 100."""
    gymnax = pytest.importorskip("gymnax")
    env, params = gymnax.make("CartPole-v1")
    ppo = agent_module("ppo")
    builder = ppo.Builder(ppo.Config(batch_size=16, num_epochs=1, num_minibatches=2,
                                     hidden_sizes=(32,), learning_rate=5e-3))
    s = run_experiment(builder, (env, params.replace(max_steps_in_episode=EASY_STEPS)),
                       ExperimentConfig(total_env_steps=30_000, stop_at_return=None),
                       str(tmp_path), platform=PopulationSettings(updates_per_call=8),
                       quiet=True)
    assert s["stopped_by"] == "budget", s
    assert 3 * RANDOM_CARTPOLE_RETURN < s["mean_return"] <= EASY_STEPS, s


@flax.struct.dataclass
class AgreeState:
    target: jax.Array  # The bit both agents should choose.
    step: jax.Array


def agree_env():
    """A JaxMARL-API env of one's own: two agents see one random bit each step and both earn 1
    when both choose it. A random team's return is 2 * 8 / 4 = 4; the best, 16."""
    spaces = pytest.importorskip("jaxmarl.environments.spaces")
    base = pytest.importorskip("jaxmarl.environments.multi_agent_env")

    class Agree(base.MultiAgentEnv):
        length = 8

        def __init__(self):
            super().__init__(num_agents=2)
            self.observation_spaces = {a: spaces.Box(0.0, 1.0, (3,)) for a in self.agents}
            self.action_spaces = {a: spaces.Discrete(2) for a in self.agents}

        def _observe(self, state):
            obs = jnp.concatenate([jax.nn.one_hot(state.target, 2),
                                   (state.step / self.length)[None]])
            return {a: obs for a in self.agents}

        def reset(self, key):
            state = AgreeState(jax.random.randint(key, (), 0, 2), jnp.zeros((), jnp.int32))
            return self._observe(state), state

        def step_env(self, key, state, actions):
            agreed = functools.reduce(jnp.logical_and,
                                      [actions[a] == state.target for a in self.agents])
            state = AgreeState(jax.random.randint(key, (), 0, 2), state.step + 1)
            done = state.step >= self.length
            rewards = {a: agreed.astype(jnp.float32) for a in self.agents}
            dones = {**{a: done for a in self.agents}, "__all__": done}
            return self._observe(state), state, rewards, dones, {}

    return Agree()


def test_a_jaxmarl_api_env_of_ones_own_trains_with_ippo_on_anakin(tmp_path):
    ippo = agent_module("ippo")
    builder = ippo.Builder(ippo.Config(batch_size=16, unroll_length=16, learning_rate=3e-3,
                                       hidden_sizes=(32,)))
    s = run_experiment(builder, agree_env(),
                       ExperimentConfig(total_env_steps=20_000, stop_at_return=None),
                       str(tmp_path), platform=PopulationSettings(updates_per_call=8),
                       quiet=True)
    assert s["stopped_by"] == "budget", s
    assert s["mean_return"] > 10, s  # Random: 4; the best: 16.
