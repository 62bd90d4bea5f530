"""The notebooks run headless from top to bottom (as on Colab, minus the install: the checkout's
Trellis is importable, so the set-up cell installs nothing); every notebook's Colab badge and
install source name the one repository that notebooks/set_source.py writes."""

import importlib.util
import os
import re
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ["quickstart", "custom_agent", "warehouses"]
# warehouses trains a population (28 s of the default suite on 2 cores): slow.
SLOW = {"warehouses"}


def _set_source():
    """notebooks/set_source.py as a module (notebooks/ is no package)."""
    spec = importlib.util.spec_from_file_location(
        "set_source", os.path.join(REPO, "notebooks", "set_source.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in NOTEBOOKS])
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TRELLIS_RUNS", str(tmp_path))  # Runs go here, not into the clone.
    path = os.path.join(REPO, "notebooks", f"{name}.ipynb")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute()  # Raises CellExecutionError, with the cell and its traceback, on failure.
    outputs = [o for cell in notebook.cells if cell.cell_type == "code"
               for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    # The set-up cell found the checkout's Trellis (nothing installed) and says so.
    setup = "".join(o.get("text", "") for o in notebook.cells[1].outputs)
    assert setup.startswith("Trellis ") and f"from {os.path.join(REPO, 'trellis')} |" in setup
    assert any("image/png" in o.get("data", {}) for o in outputs)  # The learning curve.
    # Beside the run directory: the compilation cache (hidden).
    run_dirs = [name for name in os.listdir(tmp_path) if not name.startswith(".")]
    assert len(run_dirs) == 1
    assert "learning_curve.png" in os.listdir(tmp_path / run_dirs[0])


def _named(text: str, set_source) -> set[tuple[str, ...]]:
    """The repositories (and branches) that `text`'s install sources and badges name."""
    return ({(m,) for m in set_source.SOURCE.findall(text)}
            | {tuple(m) for m in set_source.BADGE.findall(text)})


def test_every_notebook_has_a_colab_badge_and_installs_from_the_one_source():
    set_source = _set_source()
    for name in NOTEBOOKS:
        notebook = nbformat.read(os.path.join(REPO, "notebooks", f"{name}.ipynb"), as_version=4)
        badge = re.search(r"\]\((https://colab\.research\.google\.com/github/[^)\s]+)\)",
                          notebook.cells[0].source)
        assert badge and badge.group(1) == set_source.badge_url("OWNER/trellis", "main", name)
        assert (f'TRELLIS_SOURCE = "{set_source.source("OWNER/trellis")}"'
                in notebook.cells[1].source)
    with open(os.path.join(REPO, "README.md")) as f:
        assert _named(f.read(), set_source) == {("OWNER/trellis", "main")}


def test_set_source_points_every_badge_and_source_at_one_repository(tmp_path, monkeypatch):
    set_source = _set_source()
    copies = []
    for path in set_source.FILES:
        copies.append(str(tmp_path / os.path.basename(path)))
        shutil.copy(path, copies[-1])
    monkeypatch.setattr(set_source, "FILES", tuple(copies))
    assert set_source.main(["me/my-trellis", "--branch=dev"]) == 0
    for copy in copies:
        with open(copy) as f:
            text = f.read()
        assert _named(text, set_source) == (
            {("me/my-trellis",), ("me/my-trellis", "dev")} if copy.endswith(".ipynb")
            else {("me/my-trellis", "dev")}), copy
    assert set_source.main(["not a repository"]) == 2
