"""The docs site (mkdocs.yml, `make docs`): it builds with warnings as errors, the README is its
front page, and the API reference holds the public functions' docstrings.

Needs the `docs` extra (`make docs` installs it; the default suite's .venv need not have it).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings_handlers.python")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _page(site: str, path: str) -> str:
    with open(os.path.join(site, path, "index.html") if path else
              os.path.join(site, "index.html")) as f:
        return f.read()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The site built as `make docs` builds it (its links first), into a temporary directory."""
    subprocess.run(["make", "-s", "links"], cwd=REPO, check=True)
    out = str(tmp_path_factory.mktemp("site"))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", out], cwd=REPO,
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_the_readme_is_the_front_page(site: str) -> None:
    with open(os.path.join(REPO, "README.md")) as f:
        first_line = next(line for line in f if line.startswith("A JAX-native"))
    assert first_line.split()[1] in _page(site, "")
    assert "On a GPU" in _page(site, "")


def test_the_api_reference_renders_docstrings(site: str) -> None:
    launch = _page(site, "api/launch")
    assert "trellis.launch.run" in launch and "trellis.launch.evaluate" in launch
    # A docstring's Args section, parsed (Google style) into a table of parameters.
    contract = _page(site, "api/contract")
    assert "one line for <code>--help</code> and the docs" in contract
    assert "make_env_factory" in _page(site, "api/envs")


def test_every_doc_is_in_the_nav(site: str) -> None:
    pages = [name[:-3] for name in os.listdir(os.path.join(REPO, "docs"))
             if name.endswith(".md") and name != "index.md"]
    assert "results" in pages
    for page in pages:
        assert os.path.exists(os.path.join(site, page, "index.html")), page
