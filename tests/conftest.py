"""Makes the repository root importable, here and in processes the tests spawn.

The package is installed with explicit packages only, so `tests.*` helper modules (imported by
spawned node processes and by launcher scripts run as subprocesses) need the root on the path.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if _ROOT not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([_ROOT, *_paths])
