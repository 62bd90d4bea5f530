"""Anakin on CPU devices: members split whole over the devices (population_mesh) compute what
one device computes; use_cpu_cores and the platform read before JAX starts (platform_of);
PPO's anakin preset (PLATFORM_DEFAULTS); gymnax imported without its rendering libraries;
the learner's initial state made at first use."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from tests.multidevice import run_with_cpu_devices
from tests.test_flags import save_run_config
from tests.test_ppo_learner import CARTPOLE as CARTPOLE_SPEC
from tests.test_ppo_learner import random_batch
from trellis.agents.ppo import PLATFORM_DEFAULTS, PPOBuilder, PPOConfig
from trellis.agents.registry import agent_module
from trellis.builders.experiments.anakin import population_mesh, shards_members
from trellis.builders.experiments.anakin_run import use_cpu_cores
from trellis.launch import flags, run

needs_gymnax = pytest.mark.skipif(
    importlib.util.find_spec("gymnax") is None,
    reason="gymnax is an optional extra (pip install -e '.[gymnax]')")

CARTPOLE = "gymnax:CartPole-v1"
ANAKIN_PPO = ["--agent=ppo", "--platform=anakin", f"--env={CARTPOLE}"]


# --- population_mesh: members split whole over the devices -------------------------------


class _FakeDevice:
    """What population_mesh reads of a device."""

    def __init__(self, id: int, platform: str):
        self.id, self.platform = id, platform

    def __repr__(self) -> str:
        return f"{self.platform}:{self.id}"


@pytest.mark.parametrize("platform, members, count, split", [
    ("cpu", 1, 1, False),  # A lone member stays on one CPU device.
    ("gpu", 1, 4, False),  # On accelerators its env batch spans them all.
    ("gpu", 2, 2, True), ("gpu", 6, 3, True), ("gpu", 5, 1, False), ("cpu", 8, 4, True),
])
def test_population_mesh_rule_per_platform(platform, members, count, split):
    devices = [_FakeDevice(i, platform) for i in range(4)]
    mesh = population_mesh(members, devices)
    assert list(mesh.devices.flat) == devices[:count] and mesh.axis_names == ("data",)
    assert shards_members(members, mesh) is split


# One fresh Python with 4 CPU devices (the count is fixed once JAX starts): the meshes of
# populations of several sizes, then a population of 4 PPO members on gymnax CartPole split
# over the 4 devices, against the same members (same keys) on one device.
_DEVICES_SCRIPT = textwrap.dedent("""
    import importlib.util, json
    import jax, numpy as np
    from trellis.builders.experiments.anakin import population_mesh, shards_members

    devices = jax.devices()
    out = {"devices": [d.platform for d in devices], "meshes": {}}
    for m in (1, 2, 3, 4, 5, 6, 8):
        mesh = population_mesh(m, devices)
        out["meshes"][str(m)] = {"devices": [d.id for d in mesh.devices.flat],
                                 "shards_members": shards_members(m, mesh)}
    out["population"] = None
    if importlib.util.find_spec("gymnax") is not None:
        from trellis.agents.ppo import Builder, Config
        from trellis.builders.experiments import anakin_run
        from trellis.builders.experiments.anakin import Population
        from trellis.builders.experiments.anakin_run import (
            PopulationSettings,
            make_anakin,
            make_population,
        )
        from trellis.envs import make_env_factory

        M, SEED, WINDOW, CALLS = 4, 0, 10, 2
        config = Config(batch_size=8, unroll_length=8, num_minibatches=2, hidden_sizes=(16,))
        factory = make_env_factory("gymnax:CartPole-v1")
        learners = []

        class Recording(Builder):
            def make_learner(self, *args, **kwargs):
                learners.append(super().make_learner(*args, **kwargs))
                return learners[-1]

        split = make_population(Recording(config), factory, SEED, WINDOW,
                                PopulationSettings(num_seeds=M, updates_per_call=2))
        # The same members on one device: a lone member's mesh and update.
        anakin1, mesh1 = make_anakin(Builder(config), factory, SEED, WINDOW, (), num_members=1)
        one = Population(anakin1, mesh1, anakin_run._member_keys(SEED, M), {},
                         updates_per_call=2)
        # Anakin builds from the contract's pure pieces: no learner host shell is made.
        pop = {"learners_made": len(learners), "mesh1": mesh1.size}
        for name, population in (("split", split), ("one", one)):
            leaves = jax.tree.leaves(population.state)
            result = {"leaf_devices": sorted({len(x.sharding.device_set) for x in leaves}),
                      "obs_shard": list(population.state.pending["obs"]
                                        .addressable_shards[0].data.shape),
                      "loss": []}
            for _ in range(CALLS):
                metrics, _ = population.step()
                result["loss"].append(np.asarray(metrics["loss"]).tolist())
            snaps = population.snapshots(env_steps=0, elapsed_s=0.0, resumes=0)
            result["params"] = [np.asarray(x).reshape(M, -1).tolist()
                                for x in jax.tree.leaves(population.state.train.params)]
            result["returns"] = [list(s.returns) for s in snaps]
            result["episodes"] = [s.episodes for s in snaps]
            result["learner_steps"] = [s.learner_steps for s in snaps]
            pop[name] = result
        # A checkpoint's host copy goes back split over the devices.
        split.restore(jax.device_get(split.state))
        pop["restored_leaf_devices"] = sorted(
            {len(x.sharding.device_set) for x in jax.tree.leaves(split.state)})
        out["population"] = pop
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def four_devices():
    return run_with_cpu_devices(_DEVICES_SCRIPT, num_devices=4, timeout=300)


def test_population_mesh_on_four_cpu_devices(four_devices):
    """Members split whole over the most devices that divide them; a lone member (CPU rule)
    and a prime count above the devices stay on one."""
    assert four_devices["devices"] == ["cpu"] * 4
    expected = {1: 1, 2: 2, 3: 3, 4: 4, 5: 1, 6: 3, 8: 4}
    for m, count in expected.items():
        mesh = four_devices["meshes"][str(m)]
        assert mesh["devices"] == list(range(count)), (m, mesh)
        assert mesh["shards_members"] is (count > 1), (m, mesh)


@needs_gymnax
def test_members_split_over_devices_compute_what_one_device_computes(four_devices):
    pop = four_devices["population"]
    split, one = pop["split"], pop["one"]
    # make_population's learner: on one device (each member's update runs on one), its
    # initial state never made (the population makes its own).
    assert pop["learners_made"] == 0
    assert pop["mesh1"] == 1
    # Every leaf of the split state spans the 4 devices, one member each; the other is on one.
    assert split["leaf_devices"] == [4] and one["leaf_devices"] == [1]
    assert split["obs_shard"] == [1, 8, 4] and one["obs_shard"] == [4, 8, 4]
    assert pop["restored_leaf_devices"] == [4]
    for a, b in zip(split["params"], one["params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split["loss"], one["loss"], rtol=1e-5)
    assert split["episodes"] == one["episodes"] and all(n > 0 for n in split["episodes"])
    for a, b in zip(split["returns"], one["returns"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert split["learner_steps"] == one["learner_steps"] == [4] * 4
    # The members are different ones (own keys): the agreement is member by member.
    first = np.concatenate([np.ravel(p[0]) for p in split["params"]])
    second = np.concatenate([np.ravel(p[1]) for p in split["params"]])
    assert not np.allclose(first, second)


# --- use_cpu_cores -------------------------------------------------------------------------


def test_use_cpu_cores_adds_both_flags_when_xla_flags_is_empty_and_restores_it(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    expected = [f"--xla_force_host_platform_device_count={cores}",
                "--xla_cpu_multi_thread_eigen=false"]
    monkeypatch.setenv("XLA_FLAGS", "")
    with use_cpu_cores():
        assert os.environ["XLA_FLAGS"].split() == expected
    assert os.environ["XLA_FLAGS"] == ""
    monkeypatch.delenv("XLA_FLAGS")
    with use_cpu_cores():
        assert os.environ["XLA_FLAGS"].split() == expected
    assert "XLA_FLAGS" not in os.environ


def test_use_cpu_cores_counts_the_usable_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5})
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    with use_cpu_cores():
        assert os.environ["XLA_FLAGS"].split() == [
            "--xla_dump_to=/tmp/x", "--xla_force_host_platform_device_count=3",
            "--xla_cpu_multi_thread_eigen=false"]
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"


@pytest.mark.parametrize("own, added", [
    ("--xla_force_host_platform_device_count=7", "--xla_cpu_multi_thread_eigen=false"),
    ("--xla_cpu_multi_thread_eigen=true", "--xla_force_host_platform_device_count=3"),
])
def test_use_cpu_cores_keeps_the_users_own_settings(own, added, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setenv("XLA_FLAGS", own)
    with use_cpu_cores():
        assert os.environ["XLA_FLAGS"].split() == [own, added]
    monkeypatch.setenv("XLA_FLAGS", f"{own} {added}")  # Both given: nothing added.
    with use_cpu_cores():
        assert os.environ["XLA_FLAGS"].split() == [own, added]


def test_use_cpu_cores_before_jax_starts_gives_a_device_per_core():
    """With every flag run.py adds on anakin (xla_flags.py's too): XLA aborts the process on a
    flag it does not know, so a renamed flag would stop every run."""
    script = ("import os\nfrom trellis.builders.experiments.anakin_run import use_cpu_cores\n"
              "from trellis.builders.experiments.xla_flags import FAST_GPU_AUTOTUNE, "
              "xla_flags_unless_set\n"
              "with use_cpu_cores(), xla_flags_unless_set(FAST_GPU_AUTOTUNE):\n"
              "    import jax\n    jax.devices()\n"
              "print(len(jax.devices()), len(os.sched_getaffinity(0)), int(jax.jit(abs)(-21)))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=dict(env, JAX_PLATFORMS="cpu"), timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    devices, cores, computed = map(int, out.stdout.split())
    assert devices == cores
    assert computed == 21


def test_run_main_uses_the_cores_only_for_anakin(monkeypatch, tmp_path):
    """run.py sets XLA_FLAGS while it parses and trains: the CPU cores when the platform is
    anakin (a flag or its --config file), the GPU autotune level on every platform
    (tests/test_xla_flags.py); it restores XLA_FLAGS when it returns (here the parse fails: a
    Gymnasium env on anakin)."""
    seen = []
    parse = run.parse

    def parse_seeing_flags(argv, **kwargs):
        seen.append(os.environ["XLA_FLAGS"])
        return parse(argv, **kwargs)

    monkeypatch.setattr(run, "parse", parse_seeing_flags)
    monkeypatch.setenv("XLA_FLAGS", "")
    assert run.main(["--agent=ppo", "--platform=local_mp", "--num_seeds=x"]) == 2
    assert run.main(["--agent=ppo", "--platform=anakin", "--env=CartPole-v1",
                     f"--logdir={tmp_path / 'a'}"]) == 2
    (tmp_path / "anakin.yaml").write_text("agent: ppo\nplatform: anakin\nenv: CartPole-v1\n")
    assert run.main([f"--config={tmp_path / 'anakin.yaml'}", f"--logdir={tmp_path / 'b'}"]) == 2
    assert seen[0] == "--xla_gpu_autotune_level=1"
    for flags_seen in seen[1:]:
        assert "--xla_gpu_autotune_level=1" in flags_seen
        assert "--xla_force_host_platform_device_count=" in flags_seen
        assert "--xla_cpu_multi_thread_eigen=false" in flags_seen
    assert len(seen) == 3 and os.environ["XLA_FLAGS"] == ""


# --- platform_of ---------------------------------------------------------------------------


def test_platform_of_reads_flags_config_files_and_resumed_runs(tmp_path):
    assert flags.RunOptions.platform != "local_mt"  # So that reading it shows.
    assert flags.platform_of(["--agent=ppo", "--platform=anakin"]) == "anakin"
    assert flags.platform_of(["--platform=local_mt"]) == "local_mt"
    (tmp_path / "a.json").write_text(json.dumps({"agent": "ppo", "platform": "anakin"}))
    assert flags.platform_of([f"--config={tmp_path / 'a.json'}"]) == "anakin"
    (tmp_path / "a.yaml").write_text("agent: ppo\nplatform: local_mt\n")
    assert flags.platform_of([f"--config={tmp_path / 'a.yaml'}"]) == "local_mt"
    # The flag wins over the file.
    assert flags.platform_of([f"--config={tmp_path / 'a.yaml'}", "--platform=anakin"]) == "anakin"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_run_config(run_dir, ["--agent=ppo", "--platform=local_mt"])
    assert flags.platform_of([f"--resume={run_dir}"]) == "local_mt"
    data = json.loads((run_dir / "config.json").read_text())
    data["command_line"]["platform"] = "anakin"
    (run_dir / "config.json").write_text(json.dumps(data))
    assert flags.platform_of([f"--resume={run_dir}"]) == "anakin"
    # A sectioned file (a run's config.json) given as --config.
    assert flags.platform_of([f"--config={run_dir / 'config.json'}"]) == "anakin"


def test_platform_of_defaults_when_none_is_named():
    assert flags.platform_of([]) == flags.RunOptions.platform == "local_mp"
    assert flags.platform_of(["--agent=ppo", "--env=CartPole-v1", "--num_actors=3"]) == "local_mp"


@pytest.mark.parametrize("case", ["no value", "bad int", "missing file", "torn json", "a list",
                                  "missing run", "agent changed on resume"])
def test_platform_of_bad_input_gives_the_default(case, tmp_path):
    """Bad input is parse's to report (one line): platform_of does not raise on it."""
    (tmp_path / "torn.json").write_text('{"platform": ')
    (tmp_path / "list.yaml").write_text("- platform\n- anakin\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_run_config(run_dir, ["--agent=ppo", "--platform=local_mt"])
    argv = {"no value": ["--platform"],
            "bad int": ["--platform=anakin", "--num_seeds=x"],
            "missing file": [f"--config={tmp_path / 'none.json'}"],
            "torn json": [f"--config={tmp_path / 'torn.json'}"],
            "a list": [f"--config={tmp_path / 'list.yaml'}"],
            "missing run": [f"--resume={tmp_path / 'none'}"],
            "agent changed on resume": [f"--resume={run_dir}", "--agent=dqn"]}[case]
    with pytest.raises(flags.UsageError):
        flags.parse(argv)  # Bad indeed.
    assert flags.platform_of(argv) == flags.RunOptions.platform


@pytest.mark.parametrize("content", ['{"command_line": "anakin", "experiment": {}}',
                                     '{"experiment": [1, 2], "agent_config": {}}'])
def test_platform_of_bad_section_gives_the_default(content, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(flags.UsageError, match="must map setting names"):
        flags.parse([f"--config={path}"])
    assert flags.platform_of([f"--config={path}"]) == flags.RunOptions.platform


# --- PLATFORM_DEFAULTS ---------------------------------------------------------------------


def test_ppo_anakin_preset_is_valid_and_differs_from_the_defaults():
    preset = PLATFORM_DEFAULTS["anakin"]
    PPOConfig(**preset)  # Raises on a bad value or an unknown name.
    for name, value in preset.items():
        assert getattr(PPOConfig(), name) != value, name
    assert set(PLATFORM_DEFAULTS) == {"anakin"}


@needs_gymnax
def test_ppo_on_anakin_gets_the_preset_and_everything_overrides_it(tmp_path):
    preset = PLATFORM_DEFAULTS["anakin"]
    result = flags.parse(ANAKIN_PPO)
    assert result.agent == dataclasses.replace(PPOConfig(), **preset)
    flagged = flags.parse([*ANAKIN_PPO, "--batch_size=64"]).agent
    assert flagged == dataclasses.replace(PPOConfig(), **{**preset, "batch_size": 64})
    (tmp_path / "c.yaml").write_text("agent: ppo\nplatform: anakin\nenv: gymnax:CartPole-v1\n"
                                     "learning_rate: 0.001\nhidden_sizes: [8, 8]\n")
    from_file = flags.parse([f"--config={tmp_path / 'c.yaml'}"]).agent
    assert from_file == dataclasses.replace(PPOConfig(), **{
        **preset, "learning_rate": 0.001, "hidden_sizes": (8, 8)})
    # config.json records the values used; a resumed run keeps them, and its flags win.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = save_run_config(run_dir, [*ANAKIN_PPO, "--num_epochs=3"])
    data = json.loads((run_dir / "config.json").read_text())["agent_config"]
    assert data["batch_size"] == 16 and data["num_epochs"] == 3
    assert data["hidden_sizes"] == [32] and data["learning_rate"] == preset["learning_rate"]
    assert flags.parse([f"--resume={run_dir}"]).agent == saved.agent
    resumed = flags.parse([f"--resume={run_dir}", "--num_minibatches=4"]).agent
    assert resumed == dataclasses.replace(saved.agent, num_minibatches=4)


def test_ppo_off_anakin_keeps_its_own_defaults():
    assert flags.parse(["--agent=ppo", "--platform=local_mp", "--env=CartPole-v1"]).agent \
        == PPOConfig()
    assert flags.parse(["--agent=ppo", "--platform=local_mt"]).agent == PPOConfig()


@needs_gymnax
def test_impala_on_anakin_has_no_preset():
    impala = agent_module("impala")
    assert "anakin" not in getattr(impala, "PLATFORM_DEFAULTS", {})
    assert flags.parse(["--agent=impala", "--platform=anakin", f"--env={CARTPOLE}"]).agent \
        == impala.Config()


def test_help_shows_the_platforms_defaults(capsys):
    for argv, batch_size in ((["--agent=ppo", "--platform=anakin"], 16),
                             (["--agent=ppo", "--platform=local_mp"], 64)):
        with pytest.raises(SystemExit):
            flags.parse([*argv, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert f"unrolls per learner step (B) (default: {batch_size};" in help_text


# --- gymnax without its rendering libraries -------------------------------------------------


_GYMNAX_SCRIPT = textwrap.dedent("""
    import json, sys, types
    from trellis.envs import gymnax_envs

    rendering = ("seaborn", "scipy.stats", "matplotlib.pyplot", "pandas")
    out = {"before": [m for m in rendering if m in sys.modules]}
    gymnax = gymnax_envs._gymnax()
    out["after"] = [m for m in rendering if m in sys.modules]
    out["stand_ins_left"] = [name for name, m in sys.modules.items()
                             if isinstance(m, gymnax_envs._Deferred)]
    env, params = gymnax.make("CartPole-v1")
    out["env"] = type(env).__name__
    import gymnax.environments.misc.pong as p
    out["pong_sns"] = type(p.sns).__name__
    out["pong_plt"] = type(p.plt).__name__
    out["palette"] = len(p.sns.color_palette("cubehelix", 3))  # Loads the real seaborn.
    import seaborn
    out["seaborn_real"] = (type(seaborn) is types.ModuleType and sys.modules["seaborn"] is seaborn
                           and p.sns.color_palette is seaborn.color_palette)
    import matplotlib.pyplot as plt
    import matplotlib
    out["pyplot_real"] = (type(plt) is types.ModuleType and hasattr(plt, "subplots")
                          and plt.__file__.endswith("pyplot.py")
                          and matplotlib.pyplot is plt and p.plt.subplots is plt.subplots)
    gymnax_envs._gymnax()  # Again, with the real ones loaded: they stay.
    out["kept"] = sys.modules["seaborn"] is seaborn and sys.modules["matplotlib.pyplot"] is plt
    print(json.dumps(out))
""")


@needs_gymnax
def test_gymnax_imports_without_seaborn_and_pyplot_which_load_at_first_use():
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
    out = subprocess.run([sys.executable, "-c", _GYMNAX_SCRIPT], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == [] and result["after"] == [], result
    assert result["stand_ins_left"] == [] and result["env"] == "CartPole"
    # gymnax's envs hold the stand-ins, which forward to the real modules.
    assert result["pong_sns"] == result["pong_plt"] == "_Deferred"
    assert result["palette"] == 3 and result["seaborn_real"] and result["pyplot_real"]
    assert result["kept"]


# --- the learner's initial state, made at first use ----------------------------------------


SMALL_PPO = PPOConfig(batch_size=8, unroll_length=7, num_minibatches=2, hidden_sizes=(16,))


@pytest.fixture
def init_calls(monkeypatch):
    """Counts the PPO learners' init calls (traces: the init is jitted)."""
    from trellis.agents.ppo import learner as ppo_learner

    calls = []
    real = ppo_learner.init_training_state

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ppo_learner, "init_training_state", counting)
    return calls


def _learner(key: int, config: PPOConfig = SMALL_PPO):
    builder = PPOBuilder(config)
    return builder.make_learner(builder.make_networks(CARTPOLE_SPEC), CARTPOLE_SPEC,
                                jax.random.key(key))


def test_learner_makes_its_state_at_first_use(init_calls):
    learner = _learner(0)
    assert init_calls == [] and "_state" not in vars(learner)
    params = learner.params
    assert len(init_calls) == 1 and "_state" in vars(learner)
    assert learner.params is params and learner.state.params is params
    assert len(init_calls) == 1  # Made once.
    assert int(learner.state.step) == 0
    # A learner that is only made and not used makes none.
    other = _learner(1)
    assert "_state" not in vars(other)
    # A step on a learner never used makes it first, then updates it.
    fresh = _learner(0)
    fresh.step(random_batch(0))
    assert "_state" in vars(fresh) and int(fresh.state.step) == 1
    changed = [not np.allclose(a, b) for a, b in zip(
        jax.tree.leaves(params), jax.tree.leaves(fresh.params), strict=True)]
    assert any(changed)


def test_restore_into_a_learner_never_used(init_calls):
    source = _learner(0)
    source.step(random_batch(0))
    target = _learner(7, dataclasses.replace(SMALL_PPO, entropy_cost=0.5))
    assert "_state" not in vars(target)
    target.restore(source.state)
    for a, b in zip(jax.tree.leaves(target.params), jax.tree.leaves(source.params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(target.state.step) == 1
    # Its own hyper-parameters stay (its config's), as for any restore.
    assert float(target.state.hparams["entropy_cost"]) == 0.5
    assert float(source.state.hparams["entropy_cost"]) == SMALL_PPO.entropy_cost
    with pytest.raises(ValueError, match="cannot restore"):
        target.restore({"params": target.params})

