"""Points the notebooks at the repository they are published from:
`python notebooks/set_source.py OWNER/REPO [--branch=BRANCH]`.

Trellis has no public URL yet. Each notebook's first cell installs Trellis on Colab from
`TRELLIS_SOURCE = "git+https://github.com/OWNER/trellis"`, and its Colab badge (as README.md's
notebook badges) opens it from github.com/OWNER/trellis, branch main. This command writes
OWNER/REPO (and the branch) into all of them at once, so that the repository is given in one
place; tests/test_notebooks.py checks that they agree.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = ("quickstart", "custom_agent", "warehouses")
FILES = (*(os.path.join(HERE, f"{name}.ipynb") for name in NOTEBOOKS),
         os.path.join(os.path.dirname(HERE), "README.md"))
# TRELLIS_SOURCE's value; Colab's address of a notebook on GitHub (repository, branch).
SOURCE = re.compile(r'TRELLIS_SOURCE = \\?"git\+https://github\.com/([\w.-]+/[\w.-]+)\\?"')
BADGE = re.compile(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/([\w./-]+?)"
                   r"/notebooks/")


def source(repository: str) -> str:
    """TRELLIS_SOURCE for a GitHub repository OWNER/REPO."""
    return f"git+https://github.com/{repository}"


def badge_url(repository: str, branch: str, notebook: str) -> str:
    """Where the Colab badge of `notebook` (its name, without .ipynb) opens it."""
    return (f"https://colab.research.google.com/github/{repository}/blob/{branch}/notebooks/"
            f"{notebook}.ipynb")


def pointed(text: str, repository: str, branch: str) -> str:
    """`text` (a notebook's JSON or README.md) with its TRELLIS_SOURCE and Colab badges naming
    `repository` and `branch`."""
    text = SOURCE.sub(lambda m: m.group(0).replace(m.group(1), repository), text)
    return BADGE.sub(f"colab.research.google.com/github/{repository}/blob/{branch}/notebooks/",
                     text)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrites the notebooks and README.md; returns the exit code (2: a bad repository)."""
    parser = argparse.ArgumentParser(prog="set_source.py", description=__doc__.splitlines()[0])
    parser.add_argument("repository", help="the GitHub repository, OWNER/REPO")
    parser.add_argument("--branch", default="main", help="the branch the badges open")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", args.repository):
        print(f"set_source.py: error: the repository must be OWNER/REPO, got "
              f"{args.repository!r}", file=sys.stderr)
        return 2
    for path in FILES:
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(pointed(text, args.repository, args.branch))
        print(f"{os.path.relpath(path)}: {args.repository} ({args.branch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
