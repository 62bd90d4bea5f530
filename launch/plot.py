"""Learning curves from run directories: `python launch/plot.py RUN_DIR [RUN_DIR ...]`.

One run gives its return against env steps and against wall time (a population trained with
--platform=anakin --num_seeds=N: the members' interquartile mean with its 95% bootstrap
confidence interval). Several runs are grouped by their settings (all but the seed); each group
is drawn as the interquartile mean (IQM) across its seeds with its 95% percentile-bootstrap
confidence interval shaded (Agarwal et al. 2021, rliable's reporting; docs/results.md's
aggregate), training return (mean over the last `return_window` episodes) on the left and the
greedy evaluation return on the right.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from collections.abc import Sequence

if not __package__:  # Run as a file from a clone, also in spawned nodes: docs/architecture.md.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != os.path.join(_root, "launch")]
    sys.modules["trellis"] = types.ModuleType("trellis", f"Trellis from the clone at {_root}")
    sys.modules["trellis"].__path__ = [_root]

from trellis.builders.experiments.curves import plot_run, plot_runs  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="plot.py", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default=None,
                   help="PNG to write (default: RUN_DIR/learning_curve.png for one run, "
                   "learning_curves.png here for several)")
    args = p.parse_args(argv)
    try:
        if len(args.run_dirs) == 1:
            path = plot_run(args.run_dirs[0], args.out)
        else:
            path = plot_runs(args.run_dirs, args.out or "learning_curves.png")
    except FileNotFoundError as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
