"""The import layers of docs/architecture.md hold, and the runtime loads no JAX."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.link_tree import link_tree

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "builders", "launch", "envs", "reverb_tables")
# The three command lines register the clone as `trellis` when run as files (see their tops).
SCRIPTS = {"launch/run.py", "launch/tune.py", "launch/evaluate.py", "launch/plot.py"}


def test_import_linter_contracts_are_kept():
    # As `make lint`: from the tree of links, where `trellis`'s folders lie in one package.
    linter = pathlib.Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(linter), str(REPO / "pyproject.toml")], cwd=link_tree(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "4 kept, 0 broken" in out.stdout, out.stdout[-2000:]


def test_runtime_imports_no_jax():
    code = ("import sys; import trellis.launch.runtime.local_mp, trellis.launch.runtime.local_mt; "
            "bad = sorted(m for m in ('jax', 'flax', 'optax', 'gymnasium', 'trellis.builders', "
            "'trellis.agents') if m in sys.modules); print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.expanduser("~"), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("script", ["launch/run.py", "benchmarks/throughput.py",
                                    "benchmarks/scaling.py"])
def test_scripts_that_launch_local_mp_import_no_jax_at_module_level(script):
    # A spawned node process re-runs its launcher's main module as __mp_main__: a main module
    # that imports JAX costs every env worker ~1 s of CPU (32 workers on 2 cores: ~20 s).
    path = REPO / script
    code = (f"import runpy, sys; sys.path.insert(0, {str(path.parent)!r}); "
            f"runpy.run_path({str(path)!r}, run_name='__mp_main__'); "
            "bad = sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]


def test_no_sys_path_edits_outside_the_scripts():
    offenders = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel not in SCRIPTS and re.search(r"sys\.path\s*(\[|\.insert|\.append|=)",
                                                path.read_text()):
                offenders.append(rel)
    assert not offenders, offenders


def test_building_a_program_starts_no_jax_backend():
    # The launcher builds the program and then only waits: a backend there would be, on a GPU,
    # a CUDA context holding XLA's preallocated share of the GPU's memory for the whole run,
    # started before any node. Stateful (LSTM IMPALA), replayed (DQN) and the agent's own
    # table (R2D2) each derive specs from the policy's state.
    code = """
import sys
from jax._src import xla_bridge  # No public API says whether a backend has started.
from trellis.agents.registry import agent_module
from trellis.builders.contract.config import ExperimentConfig
from trellis.builders.experiments.program import make_program
from trellis.envs import GymnasiumFactory
for name, overrides, unroll_queue in (("impala", {"core": "lstm"}, "local"),
                                      ("impala", {}, "replay"), ("dqn", {}, "local"),
                                      ("r2d2", {}, "local")):
    module = agent_module(name)
    make_program(module.Builder(module.Config(**overrides)), GymnasiumFactory("CartPole-v1"),
                 ExperimentConfig(num_actors=2, unroll_queue=unroll_queue), name=name)
    if xla_bridge.backends_are_initialized():
        sys.exit(f"{name} {overrides} {unroll_queue}: the build started a JAX backend")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]


def test_making_an_agents_networks_starts_no_jax_backend():
    # The learner node makes the networks before its state's init, which runs on the host's
    # CPU: a jax array made with them would run (and, on a GPU, compile) small programs on
    # the default device on the start-up's critical path.
    code = """
import sys
from jax._src import xla_bridge
from trellis.agents.registry import agent_module
from trellis.envs import GymnasiumFactory
for name, env in (("impala", "CartPole-v1"), ("ppo", "CartPole-v1"), ("dqn", "CartPole-v1"),
                  ("sac", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("d4pg", "Pendulum-v1")):
    module = agent_module(name)
    module.Builder(module.Config()).make_networks(GymnasiumFactory(env).spec())
    if xla_bridge.backends_are_initialized():
        sys.exit(f"{name}: making its networks started a JAX backend")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
