"""Thread priorities: work that may wait (compiling programs a run needs only later) yields the
cores to the work a run's rate depends on."""

from __future__ import annotations

import os
import sys
import threading

# The lowest CPU priority (the highest nice value) on Linux.
LOWEST = 19


def lower_thread_priority(nice: int = LOWEST) -> None:
    """Lowers the calling thread's CPU priority to the nice value `nice`.

    On Linux a thread has a nice value of its own (`setpriority` on its thread id), which the
    threads it starts inherit. Elsewhere `setpriority` on that id would renice the whole
    process (or fail), so this does nothing there.

    Args:
      nice: the thread's nice value, at most `LOWEST`; a value below the thread's current one
        is ignored (raising it back needs privileges).
    """
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    if nice > os.getpriority(os.PRIO_PROCESS, tid):
        os.setpriority(os.PRIO_PROCESS, tid, min(nice, LOWEST))
