"""A regular (non-editable) install from a wheel works outside the repository.

Builds a wheel of the repository, installs it with its dependencies (from the package index)
into a fresh virtual environment in a temporary directory, checks that the distribution puts
exactly one import package, `trellis`, into site-packages, then runs every agent a few hundred
env steps with `python -m trellis.launch.run` from another directory, and evaluates and plots one
of the runs. Slow (the dependencies are downloaded and installed): `make test-slow`.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterator

import pytest

from trellis.agents.registry import AGENTS

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST = "trellis_rl"
# Flags an agent needs beyond run.py's defaults (an env it supports). Every agent registered in
# agents/registry.py is run, with no extra flags unless it is listed here.
AGENT_FLAGS = {
    **{agent: ["--platform=anakin", "--env=pgx:tic_tac_toe", "--unroll_length=9",
               "--batch_size=8", "--num_simulations=2", "--eval_every_updates=0"]
       for agent in ("alphazero", "muzero")},
    # Continuous actions: Pendulum (classic control, in the base install).
    **{agent: ["--env=Pendulum-v1"] for agent in ("d4pg", "ddpg", "mpo", "sac", "td3")},
    # Multi-agent: the JAX warehouses example (needs no extra), on anakin.
    **{agent: ["--platform=anakin", "--env=warehouses", "--unroll_length=8", "--batch_size=4",
               "--num_minibatches=2"] for agent in ("ippo", "mappo", "qmix", "vdn")},
    "iimpala": ["--platform=anakin", "--env=warehouses", "--batch_size=4"],
}
# The pyproject extra an agent's run needs beyond the base install, installed into the venv
# before its run (alphazero, muzero: mctx and pgx).
AGENT_EXTRAS = {"alphazero": "search", "muzero": "search"}
AGENT_RUNS = sorted(AGENTS)
ENV_STEPS = 300
# Not part of the source a wheel is built from.
_NOT_SOURCE = (".git", ".venv*", "build", "*.egg-info", "runs", "__pycache__", ".*_cache")


def _run(cmd: list[str], cwd: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Runs `cmd` away from the repository; fails the test with its output unless it exits 0."""
    # conftest puts the repository on PYTHONPATH for the other tests; here it would make pip
    # take its trellis_rl.egg-info for an installed trellis-rl, and Python import the clone.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout_s)
    assert result.returncode == 0, (
        f"{' '.join(cmd)} exited {result.returncode}\nstdout:\n{result.stdout[-4000:]}\n"
        f"stderr:\n{result.stderr[-4000:]}"
    )
    return result


def _top_level_names(site_packages: str) -> set[str]:
    """The top-level entries of site-packages that the installed distribution's RECORD lists."""
    (dist_info,) = glob.glob(os.path.join(site_packages, f"{DIST}-*.dist-info"))
    with open(os.path.join(dist_info, "RECORD")) as f:
        paths = [line.rsplit(",", 2)[0] for line in f if line.strip()]
    # Scripts land outside site-packages ("../../bin/..."); the dist-info folder is metadata.
    inside = [p for p in paths if not p.startswith("..")]
    return {p.split("/")[0] for p in inside} - {os.path.basename(dist_info)}


@pytest.fixture(scope="module")
def installed() -> Iterator[str]:
    """A fresh venv with the wheel installed; yields its python."""
    # Not under pytest's base temp: concurrent pytest sessions prune each other's old ones.
    with tempfile.TemporaryDirectory(prefix="trellis-install-") as tmp:
        yield _install(pathlib.Path(tmp))


def _install(root: pathlib.Path) -> str:
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and a
    # stale build/lib would put modules deleted since into the wheel.
    source = root / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    wheels = root / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
          str(source)], cwd=str(root), timeout_s=600)
    (wheel,) = glob.glob(str(wheels / f"{DIST}-*.whl"))
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", wheel], cwd=str(root), timeout_s=1800)
    return python


def test_the_wheel_installs_one_top_level_package(installed):
    site_packages = _run(
        [installed, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=os.path.dirname(installed), timeout_s=60,
    ).stdout.strip()
    assert _top_level_names(site_packages) == {"trellis"}
    # The package comes from site-packages, not from the repository.
    where = _run([installed, "-c", "import trellis.launch; print(trellis.launch.__file__)"],
                 cwd=os.path.dirname(installed), timeout_s=60).stdout.strip()
    assert where.startswith(site_packages) and not where.startswith(REPO), where


def test_agent_flags_name_registered_agents():
    assert set(AGENT_FLAGS) <= set(AGENTS), set(AGENT_FLAGS) - set(AGENTS)


@pytest.mark.parametrize("agent", AGENT_RUNS)
def test_every_agent_runs_from_another_directory(installed, tmp_path, agent):
    run_dir = tmp_path / "run"
    if agent in AGENT_EXTRAS:
        _run([installed, "-m", "pip", "install", "-q", f"{DIST}[{AGENT_EXTRAS[agent]}]"],
             cwd=str(tmp_path), timeout_s=1800)
    _run([installed, "-m", "trellis.launch.run", f"--agent={agent}", "--platform=local_mt",
          f"--total_env_steps={ENV_STEPS}", "--quiet", f"--logdir={run_dir}",
          *AGENT_FLAGS.get(agent, [])],
         cwd=str(tmp_path), timeout_s=600)
    assert (run_dir / "summary.json").is_file()
    if agent == "impala":  # One run is enough to show evaluate and plot work when installed.
        out = _run([installed, "-m", "trellis.launch.evaluate", str(run_dir), "--episodes=2"],
                   cwd=str(tmp_path), timeout_s=600).stdout
        assert "mean return" in out, out
        figure = tmp_path / "curve.png"
        _run([installed, "-m", "trellis.launch.plot", str(run_dir), f"--out={figure}"],
             cwd=str(tmp_path), timeout_s=300)
        assert figure.stat().st_size > 0
