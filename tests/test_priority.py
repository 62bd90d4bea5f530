"""launch/runtime/priority.py: a thread's own CPU priority, read back from the kernel."""

import os
import sys
import threading

import pytest

from trellis.launch.runtime.priority import LOWEST, lower_thread_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' nice values are Linux's")
def test_lowers_only_the_calling_thread():
    seen = {}

    def work():
        tid = threading.get_native_id()
        lower_thread_priority()
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, tid)
        lower_thread_priority(5)  # Below its nice now: ignored, not an error.
        seen["after_lower_ask"] = os.getpriority(os.PRIO_PROCESS, tid)

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == {"thread": LOWEST, "after_lower_ask": LOWEST}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
