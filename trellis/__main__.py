"""The `trellis` command: `trellis run|evaluate|plot|tune ARGS...` (also `python -m trellis`).

Each subcommand is the command line of launch/<name>.py with its own flags and help
(`trellis run --agent=ppo --help`); `trellis --version` prints the version. Only the chosen
subcommand's module is imported: local_mp re-runs the main module in every node process, and
env workers must not load JAX.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from trellis import __version__

# Subcommand -> the module whose `main(argv) -> exit code` runs it.
COMMANDS = {
    "run": "trellis.launch.run",
    "evaluate": "trellis.launch.evaluate",
    "plot": "trellis.launch.plot",
    "tune": "trellis.launch.tune",
}

USAGE = f"""usage: trellis {{{",".join(COMMANDS)}}} [ARGS...]

  run       train an agent (launch/run.py): trellis run --agent=ppo --env=CartPole-v1
  evaluate  play, record or export a run's checkpoint (launch/evaluate.py): trellis evaluate RUN_DIR
  plot      learning curves of run directories (launch/plot.py): trellis plot RUN_DIR...
  tune      sweeps and PBT on Ray Tune (launch/tune.py, the `tune` extra)

`trellis COMMAND --help` lists a command's flags; `trellis --version` prints the version."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the subcommand `argv[0]` with the arguments after it; returns its exit code (2: no
    such subcommand)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "--version":
        print(f"trellis {__version__}")
        return 0
    if args[0] not in COMMANDS:
        print(f"trellis: error: unknown command {args[0]!r}; choose one of: "
              f"{', '.join(COMMANDS)} (trellis --help)", file=sys.stderr)
        return 2
    return int(importlib.import_module(COMMANDS[args[0]]).main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
