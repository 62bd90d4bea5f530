"""The env contract (envs/contract.py) and the registry of env ids (envs/registry.py): every
factory declares what it is, `register` and the `trellis.envs` entry points add families, a
multi-agent env of one's own gets an id, and the experiment layer reads declarations instead
of probing factories."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import subprocess
import sys
import textwrap

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trellis.agents.ppo import PPOBuilder, PPOConfig
from trellis.agents.ppo.multi_agent import IPPOBuilder, IPPOConfig
from trellis.builders.experiments.session import UnsupportedError, check_supported
from trellis.envs import (
    EnvFactory,
    EnvRegistryError,
    EnvSpec,
    GymnasiumFactory,
    GymnaxFactory,
    HostEnvFactory,
    JaxEnvFactory,
    Players,
    make_env_factory,
    register,
    register_jax_multi_agent,
    registry,
)
from trellis.envs.atari import AleVectorFactory
from trellis.envs.brax_envs import BraxFactory
from trellis.envs.contract import is_host, is_jax
from trellis.envs.envpool_envs import EnvpoolFactory
from trellis.envs.jaxmarl_envs import JaxMARLFactory
from trellis.envs.minatar_envs import MinatarFactory
from trellis.envs.multi_agent import MultiAgentSpec
from trellis.envs.pettingzoo_envs import PettingZooFactory
from trellis.envs.pgx_envs import PgxFactory
from trellis.envs.playground_envs import PlaygroundFactory
from trellis.envs.sleep_env import SleepFactory
from trellis.launch import run

ROOT = pathlib.Path(__file__).resolve().parents[1]
SINGLE, MULTI, GAME = Players.SINGLE_AGENT, Players.MULTI_AGENT, Players.TWO_PLAYER_GAME

# Trellis's eleven factories (made without their libraries: a factory imports them when it
# builds), with what each declares: (factory, jax_native, players).
BUILTINS = [
    (GymnasiumFactory("CartPole-v1"), False, SINGLE),
    (GymnaxFactory("gymnax:CartPole-v1"), True, SINGLE),
    (BraxFactory("brax:inverted_pendulum"), True, SINGLE),
    (PlaygroundFactory("playground:CartpoleBalance"), True, SINGLE),
    (EnvpoolFactory("envpool:Pong-v5"), False, SINGLE),
    (MinatarFactory("minatar:Breakout"), False, SINGLE),
    (PettingZooFactory("pettingzoo:mpe2/simple_spread_v3"), False, MULTI),
    (JaxMARLFactory("jaxmarl:MPE_simple_spread_v3"), True, MULTI),
    (PgxFactory("pgx:tic_tac_toe"), True, GAME),
    (SleepFactory("sleep:1"), False, SINGLE),
    (AleVectorFactory("ALE/Pong-v5"), False, SINGLE),
]


@pytest.fixture
def fresh_registry(monkeypatch):
    """The process's registry as it starts (Trellis's families only), undone afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", registry._Registry())


@pytest.mark.parametrize("factory,jax_native,players", BUILTINS,
                         ids=[type(f).__name__ for f, _, _ in BUILTINS])
def test_every_builtin_factory_declares_what_it_is(factory, jax_native, players):
    assert isinstance(factory, EnvFactory)
    assert (factory.jax_native, factory.players) == (jax_native, players)
    # The declaration narrows it to its kind, which has that kind's member.
    assert is_jax(factory) == jax_native and is_host(factory) == (not jax_native)
    assert isinstance(factory, JaxEnvFactory if jax_native else HostEnvFactory)
    # `--env=ID` finds the same family (ALE's ids go to envpool where it is installed).
    if not isinstance(factory, AleVectorFactory):
        assert type(make_env_factory(factory.env_id)) is type(factory)


def test_specs_follow_the_declared_players():
    assert isinstance(make_env_factory("CartPole-v1").spec(), EnvSpec)
    assert isinstance(make_env_factory("sleep:0").spec(), EnvSpec)
    warehouses = make_env_factory("warehouses")
    assert warehouses.players is MULTI and warehouses.jax_native
    assert warehouses.spec().num_agents == 3


def test_importing_and_looking_up_load_no_jax():
    """Env workers import trellis.envs and run.py looks ids up in every node process: neither
    may load JAX (a factory loads its library when it builds)."""
    ids = ["CartPole-v1", "gymnax:CartPole-v1", "brax:ant", "playground:CartpoleBalance",
           "pgx:go_9x9", "jaxmarl:MPE_simple_spread_v3", "warehouses", "sleep:1",
           "minatar:Breakout", "pettingzoo:mpe2/simple_spread_v3"]
    code = ("import sys; from trellis.envs import make_env_factory; "
            f"[make_env_factory(i) for i in {ids!r}]; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


@dataclasses.dataclass(frozen=True)
class CoinFactory:
    """A host factory of one's own: no base class, only the contract's members."""

    env_id: str

    jax_native = False
    players = Players.SINGLE_AGENT

    def validate(self) -> None:
        pass

    def spec(self) -> EnvSpec:
        return EnvSpec((1,), "float32", 2, (), "int32")

    def reward_threshold(self) -> float | None:
        return None

    def make_vector(self, num_envs: int, seed: int) -> gymnasium.vector.VectorEnv:
        return gymnasium.make_vec("CartPole-v1", num_envs=num_envs)


def test_register_an_id_and_a_prefix(fresh_registry):
    register("coin-v0", CoinFactory)
    register("coin:", CoinFactory, prefix=True)
    register("coin:big:", lambda env_id: CoinFactory(env_id.upper()), prefix=True)
    assert make_env_factory("coin-v0") == CoinFactory("coin-v0")
    assert make_env_factory("coin:small") == CoinFactory("coin:small")
    assert make_env_factory("coin:big:one") == CoinFactory("COIN:BIG:ONE")  # Longest prefix.
    register("coin:odd", lambda env_id: CoinFactory("odd"))
    assert make_env_factory("coin:odd") == CoinFactory("odd")  # A whole id before a prefix.
    # What nothing claims is a Gymnasium id, as before the registry; a built-in family can
    # be replaced.
    assert make_env_factory("Acrobot-v1") == GymnasiumFactory("Acrobot-v1")
    register("sleep:", CoinFactory, prefix=True)
    assert make_env_factory("sleep:3") == CoinFactory("sleep:3")


def test_bad_registrations_and_families_say_so(fresh_registry):
    with pytest.raises(EnvRegistryError, match="non-empty string"):
        register("", CoinFactory)
    with pytest.raises(EnvRegistryError, match="takes a function from an env id"):
        register("coin-v0", "CoinFactory")
    register("nothing-v0", lambda env_id: object())
    with pytest.raises(EnvRegistryError, match="'nothing-v0' made <object .*not an env factory"):
        make_env_factory("nothing-v0")


def _install(site: pathlib.Path, module: str, source: str, entry_point: str) -> None:
    """A distribution in `site` as pip leaves it: a module, and a dist-info directory whose
    entry_points.txt names `entry_point` in the trellis.envs group."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[trellis.envs]\n{entry_point}\n")


def test_an_installed_package_adds_a_family_through_its_entry_point(
        tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path, "trellis_plugin_sleepy", """
        from trellis.envs import register
        from trellis.envs.sleep_env import SleepFactory

        def sleepy(env_id):
            return SleepFactory("sleep:" + env_id.split(":", 1)[1])

        def register_all():
            register("sleepy:", sleepy, prefix=True)
    """, "sleepy = trellis_plugin_sleepy:register_all")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_env_factory("sleepy:7") == SleepFactory("sleep:7")
    # The process's own registrations come after the entry points', so they win.
    register("sleepy:", CoinFactory, prefix=True)
    assert make_env_factory("sleepy:7") == CoinFactory("sleepy:7")


def test_a_failing_entry_point_is_named(tmp_path, monkeypatch, fresh_registry):
    _install(tmp_path, "trellis_plugin_broken", """
        def register_all():
            raise RuntimeError("no licence for the simulator")
    """, "broken = trellis_plugin_broken:register_all")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvRegistryError, match=r"entry point 'broken' \(trellis_plugin_broken:"
                       r"register_all\) failed: RuntimeError: no licence"):
        make_env_factory("CartPole-v1")


class Signals:
    """A multi-agent env with JaxMARL's API, defined here, not in Trellis: each of two agents
    sees a number in [-1, 1) and earns 1 for saying whether it is positive (action 1) or not
    (0); an episode lasts `length` steps (a time limit). A random team's return is `length`,
    the best team's 2 * `length`."""

    agents = ["left", "right"]
    time_limit_only = True

    def __init__(self, length: int = 8):
        self.length = length

    def observation_space(self, agent):
        return gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(2)

    def _observe(self, key):
        numbers = jax.random.uniform(key, (2, 1), minval=-1.0, maxval=1.0)
        return {agent: numbers[i] for i, agent in enumerate(self.agents)}

    def reset(self, key):
        obs = self._observe(key)
        return obs, (obs, jnp.zeros((), jnp.int32))

    def step_env(self, key, state, actions):
        seen, t = state
        rewards = {a: (actions[a] == (seen[a][0] > 0)).astype(jnp.float32) for a in self.agents}
        t = t + 1
        done = t >= self.length
        obs = self._observe(key)
        return obs, (obs, t), rewards, {"left": done, "right": done, "__all__": done}, {}


def test_a_jax_multi_agent_env_of_ones_own_gets_an_id(fresh_registry):
    register_jax_multi_agent("signals", Signals)
    factory = make_env_factory("signals")
    assert isinstance(factory, JaxEnvFactory) and factory.players is MULTI
    spec = factory.spec()
    assert isinstance(spec, MultiAgentSpec) and spec.agents == ("left", "right")
    assert spec.specs["left"] == EnvSpec((1,), "float32", 2, (), "int32")
    check_supported(IPPOBuilder(IPPOConfig()), "anakin", factory)  # A multi-agent agent fits.
    # Its keyword arguments reach the env: episodes of 2 steps, truncated (a time limit).
    env = dataclasses.replace(factory, kwargs=(("length", 2),)).make()
    state, step = env.reset(jax.random.key(0))
    right = {a: (step.obs[a][0] > 0).astype(jnp.int32) for a in spec.agents}
    state, step = env.step(jax.random.key(1), state, right)
    assert float(step.reward["left"]) == 1.0 and not bool(step.truncated["left"])
    state, step = env.step(jax.random.key(2), state, right)
    assert bool(step.truncated["left"]) and not bool(step.terminated["left"])


def test_a_single_agent_agent_is_refused_on_it_in_one_line(fresh_registry):
    register_jax_multi_agent("signals", Signals)
    with pytest.raises(UnsupportedError, match="signals is a multi-agent env and PPOBuilder"):
        check_supported(PPOBuilder(PPOConfig()), "anakin", make_env_factory("signals"))


def test_ippo_learns_a_multi_agent_env_defined_outside_trellis(tmp_path, fresh_registry):
    """`--env=signals` after `register_jax_multi_agent` in this process: IPPO on anakin gets
    the team well above a random one's return (8 of 16; 15.5 with seeds 1-3, in seconds)."""
    register_jax_multi_agent("signals", Signals)
    assert run.main(["--agent=ippo", "--platform=anakin", "--env=signals", "--quiet",
                     "--batch_size=16", "--unroll_length=16", "--hidden_sizes=16",
                     "--learning_rate=3e-3", "--total_env_steps=16000",
                     "--no_compile_cache", f"--logdir={tmp_path}"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mean_return"] > 13, summary


def _getattr_probes(source: str, name: str) -> list[str]:
    """The `getattr(<something naming a factory>, ...)` calls in a module's source."""
    return [f"{name}:{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and node.args
            and "factory" in ast.unparse(node.args[0])]


def test_the_experiment_layer_reads_declarations_and_never_probes_factories():
    sources = sorted([*ROOT.glob("builders/**/*.py"), *ROOT.glob("launch/**/*.py")])
    assert len(sources) > 20  # The scan sees the layers it guards.
    probes = [probe for path in sources
              for probe in _getattr_probes(path.read_text(), str(path.relative_to(ROOT)))]
    assert probes == []
    # What the scan finds: the probes the experiment layer had.
    assert len(_getattr_probes('if getattr(env_factory, "jax_native", False): '
                               'name = getattr(self._factory, "env_id", "env")', "old")) == 2
