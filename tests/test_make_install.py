"""The Makefile's install paths, read from `make -n` (what it would run) on a .venv of a
temporary directory: `make run` installs the core only, `make test` the suite's extras, and a
`make test` after a `make run` adds them to the same .venv."""

from __future__ import annotations

import os
import re
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _would_run(target: str, venv: str) -> list[str]:
    """The commands `make TARGET` would run with its .venv at `venv`."""
    # --no-print-directory: under `make test` this make is a sub-make, which would otherwise
    # print "make[1]: Entering directory ..." lines among the commands.
    out = subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
                         cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return out.splitlines()


def _installs(commands: list[str]) -> list[str]:
    """What each `pip install -e` among `commands` installs: `.` or `.[EXTRAS]`."""
    return [m.group(1) for c in commands if (m := re.search(r"pip install -q -e \"?([^\"\s]+)", c))]


def _stamp(path: str) -> None:
    """Writes a stamp newer than the Makefile and pyproject.toml, whenever they were edited."""
    with open(path, "w"):
        pass
    future = time.time() + 24 * 3600
    os.utime(path, (future, future))


def test_a_fresh_clone_runs_with_the_core_only(tmp_path):
    venv = str(tmp_path / ".venv")
    run = _would_run("run", venv)
    assert any("-m venv" in c for c in run), run
    assert _installs(run) == ["."], run
    assert "launch/run.py" in run[-1]
    test = _would_run("test", venv)
    assert len(_installs(test)) == 1 and _installs(test)[0].startswith(".[dev,"), test


def test_make_test_after_make_run_installs_the_extras(tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch(mode=0o755)
    _stamp(str(venv / ".core"))  # What `make run` leaves.
    assert _installs(_would_run("run", str(venv))) == []
    assert not any("-m venv" in c for c in _would_run("test", str(venv)))
    assert _installs(_would_run("test", str(venv)))[0].startswith(".[dev,")
    _stamp(str(venv / ".installed"))  # What `make test` leaves: nothing more to install.
    assert _installs(_would_run("test", str(venv))) == []
    assert _installs(_would_run("run", str(venv))) == []
