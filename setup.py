"""The wheel's packages: `trellis` from the root package's folder, `trellis/` (its
`__version__`, `train`, `load` and the `trellis` command), and `trellis.<folder>` for the five
folders at the root and every subpackage found under them, so a new agent or module needs no
edit here (the rest is in pyproject.toml). Each package's `py.typed` (PEP 561) tells type
checkers that the installed package is annotated."""

from setuptools import find_packages, setup

FOLDERS = ("agents", "builders", "envs", "launch", "reverb_tables")

setup(
    packages=["trellis",
              *(f"trellis.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS]))],
    package_dir={"trellis": "trellis", **{f"trellis.{f}": f for f in FOLDERS}},
    package_data={"trellis": ["py.typed"], **{f"trellis.{f}": ["py.typed"] for f in FOLDERS}},
)
