"""The wheel's packages: `trellis.<folder>` for the five folders at the root and every subpackage
found under them, so a new agent or module needs no edit here (the rest is in pyproject.toml)."""

from setuptools import find_packages, setup

FOLDERS = ("agents", "builders", "envs", "launch", "reverb_tables")

setup(
    packages=[f"trellis.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS])],
    package_dir={f"trellis.{f}": f for f in FOLDERS},
)
