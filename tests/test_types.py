"""mypy is clean on the packages pyproject's [tool.mypy] checks, and the wheel says so.

The same command as `make lint`: `mypy` with its settings from pyproject.toml (strict on all of
Trellis: the agents, the builders, the envs, the launchers and the replay tables). Its cache
(.mypy_cache) makes a run after the first take a few seconds.
"""

import pathlib
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mypy's own TOML reader, installed with it.
    import tomli as tomllib

from tests.link_tree import FOLDERS, link_tree

REPO = pathlib.Path(__file__).resolve().parents[1]


def _mypy_settings() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["mypy"]


def test_mypy_is_clean():
    link_tree()
    mypy = pathlib.Path(sys.executable).with_name("mypy")
    out = subprocess.run([str(mypy)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert out.stdout.startswith("Success"), out.stdout[-3000:]


def test_mypy_checks_the_strict_packages_strictly():
    """What `make lint` checks: every folder's package, under the strict override, none of its
    modules with their errors ignored (a package dropped from either list, or an
    `ignore_errors` override, would pass the run above unchecked)."""
    settings = _mypy_settings()
    checked = {f"trellis.{folder}" for folder in FOLDERS}
    assert checked <= set(settings["packages"]), settings["packages"]
    assert {"trellis", "trellis.__main__"} <= set(settings["modules"]), settings["modules"]
    strict = [o for o in settings["overrides"] if o.get("disallow_untyped_defs")]
    assert len(strict) == 1, strict
    assert {f"{p}.*" for p in checked} <= set(strict[0]["module"]), strict[0]["module"]
    for flag in ("disallow_untyped_calls", "disallow_any_generics", "warn_return_any",
                 "check_untyped_defs", "no_implicit_reexport"):
        assert strict[0][flag] is True, flag
    ignored = [o["module"] for o in settings["overrides"] if o.get("ignore_errors")]
    assert not ignored, f"modules checked with their errors ignored: {ignored}"


def test_every_folder_ships_py_typed():
    """PEP 561: the wheel's root package and its five folders each carry `py.typed` (setup.py's
    package_data), so a user's type checker reads Trellis's annotations."""
    for folder in ("trellis", *FOLDERS):
        assert (REPO / folder / "py.typed").is_file(), folder
    setup = (REPO / "setup.py").read_text()
    assert ('package_data={"trellis": ["py.typed"], **{f"trellis.{f}": ["py.typed"] for f in '
            'FOLDERS}}') in setup
