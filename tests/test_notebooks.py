"""The notebooks run headless from top to bottom (as on Colab, minus the install)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", ["quickstart", "custom_agent", "warehouses"])
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
    assert any("image/png" in o.get("data", {}) for o in outputs)  # The learning curve.
    # Beside the run directory: the compilation cache (hidden).
    run_dirs = [name for name in os.listdir(tmp_path) if not name.startswith(".")]
    assert len(run_dirs) == 1
    assert "learning_curve.png" in os.listdir(tmp_path / run_dirs[0])
