"""The wheel a user builds (`pip wheel --no-deps .`) installs, and its `trellis` command solves
CartPole from a directory outside the checkout.

The wheel goes into a fresh virtual environment whose only other packages are this checkout's
.venv's dependencies, reached through a .pth line (no download; .venv's own .pth files, the
editable install's among them, are not run from there), so `trellis` can only come from the
wheel. Slow (a build and a training run): `make test-slow`.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
# Not part of the source a wheel is built from (tests/test_install.py's list).
_NOT_SOURCE = (".git", ".venv*", "build", "*.egg-info", "runs", "__pycache__", ".*_cache")


def _run(cmd: list[str], cwd: pathlib.Path, timeout_s: float) -> subprocess.CompletedProcess:
    # Without conftest's PYTHONPATH (the checkout) and the checkout's venv.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout_s)
    assert out.returncode == 0, (f"{' '.join(cmd)} exited {out.returncode}\n"
                                 f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def test_the_wheel_installs_and_its_command_solves_cartpole(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
          "-w", str(tmp_path / "dist"), str(source)], tmp_path, 600)
    (wheel,) = glob.glob(str(tmp_path / "dist" / "trellis_rl-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "trellis/__init__.py" in names and "trellis/py.typed" in names
    assert "trellis/launch/api.py" in names and "trellis/agents/ppo/builder.py" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "-q", wheel], tmp_path, 300)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                tmp_path, 60).stdout.strip()
    (pathlib.Path(site) / "checkout_venv.pth").write_text(sysconfig.get_path("purelib") + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([str(python), "-c", "import trellis; print(trellis.__file__, "
                  "trellis.__version__)"], elsewhere, 60).stdout.split()
    assert where[0].startswith(site) and where[1] == "0.2.0", where
    out = _run([str(env_dir / "bin" / "trellis"), "run", "--agent=ppo", "--env=CartPole-v1",
                "--platform=local_mt", "--stop_at_return=450", "--quiet"], elsewhere, 900)
    assert "stopped by return_target" in out.stdout, out.stdout[-2000:]
    (summary,) = glob.glob(str(elsewhere / "runs" / "ppo-CartPole-v1-*" / "summary.json"))
    with open(summary) as f:
        assert json.load(f)["mean_return"] >= 450
