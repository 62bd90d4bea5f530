"""docs/your_own_env.md runs as it reads: every block marked `<!-- snippet: NAME -->` there is
read out of the doc and run as it stands (a command line with --quiet and a --logdir appended,
a package's files written where pip would put them), so the guide cannot drift from what
works."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import gymnasium as gym
import pytest
import tomllib

from trellis.envs import HostEnvFactory, UnknownEnvError, make_env_factory, registry

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "your_own_env.md"
RUN_PY = ["python", "launch/run.py"]
_SNIPPET = re.compile(r"<!-- snippet: (\S+) -->\n```\w*\n(.*?)```", re.S)


def snippets(doc: pathlib.Path) -> dict[str, str]:
    """The blocks of `doc` marked `<!-- snippet: NAME -->` on the line before, by NAME."""
    found: dict[str, str] = {}
    for name, code in _SNIPPET.findall(doc.read_text()):
        assert name not in found, f"{doc.name}: two snippets named {name!r}"
        found[name] = code
    return found


SNIPPETS = snippets(DOC)


def command(name: str, run_dir: pathlib.Path) -> list[str]:
    """The doc's `python launch/run.py ...` block `name` as argv for this interpreter, with
    --quiet and --logdir=`run_dir` appended."""
    argv = shlex.split(SNIPPETS[name].replace("\\\n", " "))
    assert argv[:2] == RUN_PY, argv
    return [sys.executable, str(REPO / "launch" / "run.py"), *argv[2:], "--quiet",
            f"--logdir={run_dir}"]


def run_command(name: str, site: pathlib.Path, run_dir: pathlib.Path) -> dict:
    """Runs command `name` from the clone with `site` on PYTHONPATH; the run's summary."""
    out = subprocess.run(command(name, run_dir), capture_output=True, text=True, timeout=420,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(site)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def site(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory holding the doc's `mycart` package, as pip would leave it."""
    root = tmp_path / "site"
    (root / "mycart").mkdir(parents=True)
    (root / "mycart" / "__init__.py").write_text(SNIPPETS["mycart"])
    return root


@pytest.fixture
def fresh_registry(monkeypatch):
    """Trellis's env registry as a process starts with it, restored afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", registry._Registry())


def test_every_snippet_is_run_here():
    """A block added to the doc without a test here fails this test."""
    run_here = {"mycart", "module_id", "kwargs_and_wrappers", "registered_here",
                "gymnax_object", "multi_agent", "pyproject", "entry_point_module",
                "entry_point_run"}
    assert set(SNIPPETS) == run_here


# Slow: tests/test_user_envs.py trains this way in the default suite; here the doc runs as written.
@pytest.mark.slow
def test_module_id_trains_to_its_threshold(site, tmp_path):
    summary = run_command("module_id", site, tmp_path / "run")
    assert summary["env"] == "mycart:MyCart-v0"
    assert summary["stopped_by"] == "return_target", summary
    assert summary["stop_at_return"] == 150.0 and summary["mean_return"] >= 150.0, summary


def test_kwargs_and_wrappers_reach_the_env_workers(site, tmp_path):
    """The wrapper caps every episode of every env worker at 100 steps (a return of 100);
    without it, a CartPole whose mean return is 90 has episodes far longer than that."""
    run_dir = tmp_path / "run"
    summary = run_command("kwargs_and_wrappers", site, run_dir)
    assert summary["stopped_by"] == "return_target" and summary["mean_return"] >= 90, summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    highest = [r["return_max"] for r in records if r.get("return_max") is not None]
    assert highest and max(highest) <= 100.0, highest
    saved = json.loads((run_dir / "config.json").read_text())["command_line"]
    assert saved["env_kwargs"] == "pole_length=1.0"
    assert saved["env_wrappers"] == ["mycart:short_episodes"]


# Slow: tests/test_user_envs.py trains this way in the default suite; here the doc runs as written.
@pytest.mark.slow
def test_an_env_registered_here_trains_on_local_mp(tmp_path, monkeypatch):
    """The block runs as a script's __main__ (what a notebook's cells are too): its class is
    no module's, so the env workers get it by value with the factory."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    try:
        exec(SNIPPETS["registered_here"], namespace)
    finally:
        gym.registry.pop("NotebookCart-v0", None)
    assert namespace["NotebookCart"].__module__ == "__main__"
    assert namespace["exit_code"] == 0
    (summary_path,) = tmp_path.glob("runs/*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["platform"] == "local_mp" and summary["stopped_by"] == "return_target"
    assert summary["mean_return"] >= 150.0, summary


# Slow: tests/test_user_envs.py trains this way in the default suite; here the doc runs as written.
@pytest.mark.slow
def test_a_gymnax_object_trains_with_ppo_on_anakin(tmp_path, monkeypatch):
    pytest.importorskip("gymnax", reason="gymnax is an optional extra (pip install -e '.[gymnax]')")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    exec(SNIPPETS["gymnax_object"], namespace)
    summary = namespace["summary"]
    assert summary["platform"] == "anakin" and summary["env"] == "object:CartPole"
    assert summary["stopped_by"] == "return_target" and summary["mean_return"] >= 150.0, summary


# Slow: tests/test_user_envs.py trains this way in the default suite; here the doc runs as written.
@pytest.mark.slow
def test_a_multi_agent_env_of_ones_own_trains_with_ippo(tmp_path, monkeypatch, fresh_registry):
    """A random team returns 16 / 3 over 8 steps, the best team 16."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    exec(SNIPPETS["multi_agent"], namespace)
    assert namespace["exit_code"] == 0
    (summary_path,) = tmp_path.glob("runs/*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["env"] == "colours" and summary["mean_return"] > 12.0, summary


def _install(site: pathlib.Path) -> None:
    """The doc's entry-point package in `site` as pip leaves it: its modules and a dist-info
    directory whose entry_points.txt holds the pyproject's entry points."""
    (site / "mycart" / "trellis_envs.py").write_text(SNIPPETS["entry_point_module"])
    project = tomllib.loads(SNIPPETS["pyproject"])["project"]
    info = site / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    sections = [f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items())
                for group, entries in project["entry-points"].items()]
    (info / "entry_points.txt").write_text("".join(sections))


def test_an_entry_point_package_adds_a_family(site, tmp_path, monkeypatch, fresh_registry):
    _install(site)
    # Here, in-process: the family's factories meet the contract, and a bad id is one line.
    monkeypatch.syspath_prepend(str(site))
    try:
        factory = make_env_factory("pole:1.0")
        assert isinstance(factory, HostEnvFactory) and factory.reward_threshold() == 150.0
        assert factory.spec().num_actions == 2
        with pytest.raises(UnknownEnvError, match="LENGTH must be a number") as error:
            make_env_factory("pole:long").validate()
        assert "\n" not in str(error.value)
    finally:
        gym.registry.pop("MyCart-v0", None)
        for module in [m for m in sys.modules if m == "mycart" or m.startswith("mycart.")]:
            monkeypatch.delitem(sys.modules, module)
    # The doc's command line, in a process of its own as a user runs it.
    summary = run_command("entry_point_run", site, tmp_path / "run")
    assert summary["env"] == "pole:1.0" and summary["platform"] == "local_mp"
    assert summary["stopped_by"] == "return_target" and summary["mean_return"] >= 150.0, summary
