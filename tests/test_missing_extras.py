"""An agent or env whose pyproject extra is not installed: run.py says which extra in one line
and exits 2, with no traceback.

AlphaZero's package imports mctx, so its case runs run.py in a fresh interpreter where a
sitecustomize hides the search extra's packages (`sys.modules[name] = None`: `import name` raises
ModuleNotFoundError, as for a package that is not installed). The others import their package
lazily and are hidden the same way in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trellis.agents.alphazero.config import AlphaZeroConfig
from trellis.agents.common.self_play_config import missing_search_extra
from trellis.launch import run as run_py

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [sys.executable, os.path.join(REPO, "launch", "run.py")]


def _assert_one_line(code: int, stderr: str, expected: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], stderr


def _hide(monkeypatch: pytest.MonkeyPatch, *packages: str) -> None:
    """Makes `import P` (and of its submodules, loaded already or not) fail in this process."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.setitem(sys.modules, name, None)
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)


def test_alphazero_without_the_search_extra(tmp_path):
    """The agent's package imports without mctx (its settings parse), and the game's id says
    what pgx needs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nsys.modules.update(dict.fromkeys(['mctx', 'pgx']))\n")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([*RUN, "--agent=alphazero", "--platform=anakin",
                          "--env=pgx:tic_tac_toe", f"--logdir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    _assert_one_line(out.returncode, out.stderr, "pip install -e '.[search]'")


def test_alphazero_builder_without_mctx_names_the_extra():
    """What agents/alphazero/__init__.py exports as its Builder when mctx is missing."""
    with pytest.raises(ValueError, match=r"^--agent=alphazero needs the search extra \(mctx "
                                         r"is not installed\): pip install -e '\.\[search\]'$"):
        missing_search_extra("mctx", "alphazero")(AlphaZeroConfig())


def test_evaluating_an_alphazero_run_without_the_search_extra(monkeypatch, capsys, tmp_path):
    """evaluate.py on a run whose agent's extra is missing here: one line, exit 2."""
    import json

    from trellis.agents import alphazero
    from trellis.launch import evaluate

    (tmp_path / "config.json").write_text(json.dumps({"command_line": {
        "agent": "alphazero", "env": "pgx:tic_tac_toe", "platform": "anakin"},
        "experiment": {}, "agent_config": {}}))
    monkeypatch.setattr(alphazero, "Builder", missing_search_extra("mctx", "alphazero"))
    assert evaluate.main([str(tmp_path)]) == 2
    _assert_one_line(2, capsys.readouterr().err, "evaluate.py: error: --agent=alphazero needs "
                     "the search extra (mctx is not installed)")


def test_es_strategy_of_evosax_without_the_es_extra(monkeypatch, capsys, tmp_path):
    _hide(monkeypatch, "evosax")
    code = run_py.main(["--agent=es", "--strategy=cma_es", "--platform=local_mt",
                        "--env=CartPole-v1", f"--logdir={tmp_path}"])
    _assert_one_line(code, capsys.readouterr().err,
                     "--strategy=cma_es needs evosax: pip install -e '.[es]'")


@pytest.mark.parametrize("hidden,env", [
    (("jaxmarl",), "jaxmarl:MPE_simple_spread_v3"),
    (("mpe2", "pettingzoo"), "pettingzoo:mpe2/simple_spread_v3"),
    (("pettingzoo",), "pettingzoo:sisl/pursuit_v5"),
], ids=["jaxmarl", "mpe2", "pettingzoo"])
def test_marl_ids_without_the_marl_extra(hidden, env, monkeypatch, capsys, tmp_path):
    _hide(monkeypatch, *hidden)
    platform = "anakin" if env.startswith("jaxmarl:") else "local_mt"
    code = run_py.main(["--agent=ippo", f"--env={env}", f"--platform={platform}",
                        f"--logdir={tmp_path}"])
    _assert_one_line(code, capsys.readouterr().err, "pip install -e '.[marl]'")


def test_pettingzoo_env_whose_module_needs_a_missing_package(monkeypatch, capsys, tmp_path):
    """pistonball needs pymunk, which no extra installs: found when the checks make an env."""
    pytest.importorskip("pettingzoo", reason="needs the marl extra")
    _hide(monkeypatch, "pymunk")
    for name in [n for n in sys.modules if n.startswith("pettingzoo.butterfly.pistonball")]:
        monkeypatch.delitem(sys.modules, name)
    code = run_py.main(["--agent=ippo", "--env=pettingzoo:butterfly/pistonball_v6",
                        "--platform=local_mt", f"--logdir={tmp_path}"])
    _assert_one_line(code, capsys.readouterr().err, "needs the 'pymunk' package")
