"""Progress in a Jupyter notebook (builders/experiments/progress.py): one line, redrawn in place
as reports arrive, instead of a plain line every few seconds (issue 46, item 10)."""

import io

import nbformat
from nbclient import NotebookClient

from trellis.builders.experiments.progress import Progress, in_notebook

CELL = """
from trellis.builders.experiments.progress import Progress

progress = Progress(1_000)
for steps in (100, 200, 300):
    progress.update({"env_steps": steps, "env_steps_per_s": 50.0, "mean_return": 20.0,
                     "returns_in_window": 3, "episodes": 3, "learner_steps": steps // 10})
progress.close()
"""


def test_a_notebook_gets_one_line_redrawn_in_place():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    # The display's updates replaced its content: one output, the last report's line.
    assert [o.output_type for o in outputs] == ["display_data"], outputs
    line = outputs[0].data["text/plain"]
    assert "env steps        300/1,000" in line and "learner steps 30" in line, line


def test_elsewhere_the_lines_are_plain():
    stream = io.StringIO()
    assert not in_notebook(stream)
    progress = Progress(1_000, stream=stream, plain_every_s=0.0)
    progress.update({"env_steps": 100})
    progress.update({"env_steps": 200})
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "env steps        200/1,000" in lines[1], lines
