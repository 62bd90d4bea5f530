"""The process tree below a pid, read from /proc (Linux).

On local_mp a node process is a child of multiprocessing's fork server, which is a child of the
launcher beside its resource tracker: a launcher's node processes are among its descendants,
not its children.
"""

from __future__ import annotations

import glob


def children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes (of all its threads)."""
    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass  # The thread or the process ended meanwhile.
    return out


def descendants(pid: int) -> list[int]:
    """The pids of `pid`'s children, their children, and so on."""
    found, pending = [], [pid]
    while pending:
        for child in children(pending.pop()):
            found.append(child)
            pending.append(child)
    return found
