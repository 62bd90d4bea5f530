"""Every script in benchmarks/ runs its main path on a tiny budget, so none rots unseen.

A script is a file of benchmarks/ with an `if __name__ == "__main__":` block (the others are
helpers it imports). Each declares SMOKE_FLAGS, its command-line flags for a run of seconds;
this test finds the scripts by glob, so a new one is run here, or fails here until it declares
them. A smoke run must exit 0 and end, as every benchmark does, with one JSON object of what
it measured, with at least one positive rate (a key ending in `_per_s`) in it.

Not covered by default: compare.py's SB3 side, which pip-installs Stable-Baselines3 and
PyTorch from the package index (its smoke run passes --no_sb3), and the scripts of SLOW,
whose smoke runs take minutes on 2 cores; `make test-slow` runs them.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, "benchmarks")
TIMEOUT_S = 300


def _is_script(path: str) -> bool:
    with open(path) as f:
        return 'if __name__ == "__main__":' in f.read()


SCRIPTS = sorted(p for p in glob.glob(os.path.join(BENCHMARKS, "*.py")) if _is_script(p))
# Scripts whose smoke run costs minutes on 2 cores: atari.py's Pong run.py (the resnet torso's
# compilation alone took ~50 s of a 75 s run on a loaded machine).
# atari.py: minutes. The others: 9-28 s each on 2 cores, more than their share of the default
# suite's 15 minutes; their agents' and envs' runs are tested there (test_alphazero,
# test_anakin, test_ippo, test_soak, physics.py's smoke run for humanoid.py's envs;
# compare.py's own part is its PyTorch peer, which the smoke run skips anyway).
SLOW = {"atari.py", "alphazero.py", "anakin.py", "multi_agent.py", "soak.py", "humanoid.py",
        "compare.py", "mujoco_suite.py"}


def smoke_flags(path: str) -> list[str] | None:
    """The script's top-level `SMOKE_FLAGS = [...]`, read without importing it; None if none."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "SMOKE_FLAGS" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def rates(value) -> Iterator[float]:
    """Every number under a key ending in `_per_s`, at any depth of nested dicts and lists."""
    if isinstance(value, dict):
        for key, v in value.items():
            if key.endswith("_per_s") and isinstance(v, (int, float)):
                yield v
            else:
                yield from rates(v)
    elif isinstance(value, list):
        for v in value:
            yield from rates(v)


def run_script(path: str, flags: list[str], cwd: str, timeout_s: float = TIMEOUT_S) -> dict:
    """Runs `python path *flags` in `cwd`; fails unless it exits 0; its last line's JSON."""
    out = subprocess.run([sys.executable, path, *flags], cwd=cwd, capture_output=True,
                         text=True, timeout=timeout_s)
    name = os.path.basename(path)
    assert out.returncode == 0, (
        f"{name} {' '.join(flags)} exited {out.returncode}\nstdout:\n{out.stdout[-3000:]}\n"
        f"stderr:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    assert lines, f"{name} printed nothing"
    return json.loads(lines[-1])


def test_the_scripts_are_found():
    names = {os.path.basename(p) for p in SCRIPTS}
    assert {"scaling.py", "throughput.py", "soak.py"} <= names, names
    assert "common.py" not in names  # A helper, run by none.


def test_no_script_hides_a_package_its_imports_need():
    """A script's folder is first on its sys.path, so a module there named like an installed
    package replaces it for every script: benchmarks/mujoco.py made brax (`from mujoco import
    mjx`) fail to import in physics.py, as "Brax envs need the brax package"."""
    hidden = [name for name in (os.path.basename(p)[:-3] for p in glob.glob(
        os.path.join(BENCHMARKS, "*.py"))) if importlib.util.find_spec(name) is not None]
    assert hidden == []


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.slow) if os.path.basename(p) in SLOW else p
    for p in SCRIPTS], ids=os.path.basename)
def test_smoke_run(path, tmp_path):
    flags = smoke_flags(path)
    assert flags is not None, (
        f"benchmarks/{os.path.basename(path)} declares no SMOKE_FLAGS: give it the flags of a "
        "run of a few seconds that goes through its main path")
    # In a temporary directory: whatever it writes (scaling.py's plot) stays out of the tree.
    measured = run_script(path, flags, str(tmp_path))
    assert isinstance(measured, dict) and any(r > 0 for r in rates(measured)), measured


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compare_with_sb3(tmp_path):
    """compare.py's SB3 side too: installs SB3 and PyTorch into a throw-away environment."""
    measured = run_script(os.path.join(BENCHMARKS, "compare.py"),
                          ["--seeds=1", "--sb3_seeds=1", "--target=15"], str(tmp_path),
                          timeout_s=1700)
    assert measured["sb3_a2c"]["median_env_steps_per_s"] > 0, measured
    assert measured["ratios"]["impala_local_mp"]["env_steps_per_s"] > 0, measured
