"""Trellis: JAX-native, accelerator-centric distributed reinforcement learning.

The Python entry points (launch/api.py, docs/python_api.md):

    import trellis
    run = trellis.train(agent="ppo", env="CartPole-v1", platform="local_mt",
                        stop_at_return=450)
    policy = trellis.load(run.directory)
    action = policy(observation)
    policy.export("exported/")  # policy.jax and spec.json, for jax alone

The subpackages are the repository's folders (`trellis.agents`, `trellis.builders`,
`trellis.envs`, `trellis.launch`, `trellis.reverb_tables`); the `trellis` command (`trellis
run|evaluate|plot|tune`, also `python -m trellis`) runs the command lines of launch/.

Importing `trellis` loads neither JAX nor an agent: `train`, `load` and the classes they give
are imported at their first use (PEP 562's module `__getattr__`), so that a process that only
asks the version, or a local_mp env worker, does not pay for JAX.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trellis.launch.api import LoadedPolicy, Run, SearchPolicy, load, train

# The distribution's version, from its metadata: pyproject.toml's `version` is the one source.
__version__ = importlib.metadata.version("trellis-rl")

# The names of trellis.launch.api that `trellis` gives, imported at their first use.
_API = ("LoadedPolicy", "Run", "SearchPolicy", "load", "train")

__all__ = ["LoadedPolicy", "Run", "SearchPolicy", "__version__", "load", "train"]


def __getattr__(name: str) -> Any:
    """`trellis.train`, `trellis.load`, ...: imported from trellis.launch.api when first asked."""
    if name in _API:
        return getattr(importlib.import_module("trellis.launch.api"), name)
    raise AttributeError(f"module 'trellis' has no attribute {name!r}")
