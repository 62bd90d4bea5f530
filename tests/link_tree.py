"""The tree of links mypy and import-linter read `trellis` from (the Makefile's lint target makes
the same ones): .venv/mypy_path/trellis/<folder> -> <folder> for setup.py's five folders and
.venv/mypy_path/trellis/<file> -> trellis/<file> for the root package's files. mypy cannot follow
the editable install's import hook, and import-linter needs a package's modules in its folder."""

from __future__ import annotations

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
# setup.py's folders, each `trellis.<folder>`.
FOLDERS = ("agents", "builders", "envs", "launch", "reverb_tables")
# Where mypy's and import-linter's `trellis` lies (pyproject's [tool.mypy] mypy_path).
MYPY_PATH = REPO / ".venv" / "mypy_path"


def link_tree() -> pathlib.Path:
    """Makes (or completes) the links; returns the folder holding `trellis`, MYPY_PATH."""
    links = MYPY_PATH / "trellis"
    links.mkdir(parents=True, exist_ok=True)
    targets = {folder: pathlib.Path("..", "..", "..", folder) for folder in FOLDERS}
    targets.update({f.name: pathlib.Path("..", "..", "..", "trellis", f.name)
                    for f in (REPO / "trellis").iterdir() if f.suffix in (".py", ".typed")})
    for name, target in targets.items():
        link = links / name
        if not link.is_symlink():
            os.symlink(target, link)
    return MYPY_PATH
