"""mypy is clean on the packages pyproject's [tool.mypy] checks (the runtime, the agent contract).

The same command as `make lint`: `mypy` with its settings from pyproject.toml. Its cache
(.mypy_cache) makes a run after the first take about a second.
"""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# setup.py's folders, each `trellis.<folder>`.
FOLDERS = ("agents", "builders", "envs", "launch", "reverb_tables")


def _link_tree() -> None:
    """The links mypy reads `trellis` from (the Makefile's lint target makes the same ones):
    mypy cannot follow the editable install's import hook."""
    links = REPO / ".venv" / "mypy_path" / "trellis"
    links.mkdir(parents=True, exist_ok=True)
    for folder in FOLDERS:
        link = links / folder
        if not link.is_symlink():
            os.symlink(pathlib.Path("..", "..", "..", folder), link)


def test_mypy_is_clean():
    _link_tree()
    mypy = pathlib.Path(sys.executable).with_name("mypy")
    out = subprocess.run([str(mypy)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert out.stdout.startswith("Success"), out.stdout[-3000:]
