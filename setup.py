"""The wheel's packages: `trellis.<folder>` for the five folders at the root and every subpackage
found under them, so a new agent or module needs no edit here (the rest is in pyproject.toml).
Each folder's `py.typed` (PEP 561) tells type checkers that the installed package is annotated."""

from setuptools import find_packages, setup

FOLDERS = ("agents", "builders", "envs", "launch", "reverb_tables")

setup(
    packages=[f"trellis.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={f"trellis.{f}": f for f in FOLDERS},
    package_data={f"trellis.{f}": ["py.typed"] for f in FOLDERS},
)
