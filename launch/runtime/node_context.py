"""What code running inside a node may ask of the program: stop event, stop requests, label.

A node's code (its constructor, `run()`, its RPC methods, threads it starts) calls the module
functions here instead of receiving the program's plumbing as arguments, so the same class runs
unchanged on every platform and in plain tests.

Lookup order for "the current node": the context bound to the calling thread (a node's main
thread), then the context bound to the process (a `local_mp` child, or the one running `local_mt`
program), then a process-global default event, so that tests driving node classes by hand can call
these functions without launching anything.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol


class StopEvent(Protocol):
    """The part of `threading.Event` / `multiprocessing.Event` that nodes may use."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Status:
    """A message from a node to its launcher.

    Attributes:
      kind: "ready" (constructed, serving), "finished" (run loop or function returned),
        "error" (raised in construction or run), "stop_request" (called `request_stop`) or
        "final" (called `report_final`).
      label: the node's label.
      runs: for "ready": whether the node has a run loop whose end the launcher awaits.
      reason: for "stop_request": the reason; for "error": the exception one-liner.
      info: for "stop_request" and "final": the caller's info dict.
      traceback: for "error": the formatted traceback.
      peer_gone: for "error": the node lost a connection to a peer (expected while stopping).
    """

    kind: str
    label: str
    runs: bool = False
    reason: str = ""
    info: dict[str, Any] | None = None
    traceback: str = ""
    peer_gone: bool = False


def drain(statuses: queue.SimpleQueue[Status], timeout_s: float) -> list[Status]:
    """The statuses nodes reported in the launcher's process: waits up to `timeout_s` for
    the first, then takes the rest without waiting ([] if none came)."""
    try:
        out = [statuses.get(timeout=timeout_s)]
    except queue.Empty:
        return []
    while True:
        try:
            out.append(statuses.get_nowait())
        except queue.Empty:
            return out


@dataclasses.dataclass(frozen=True)
class NodeContext:
    """Where a node's code finds its program.

    Attributes:
      label: the node's label, e.g. "learner" or "actor/3".
      stop_event: set by the launcher when the program stops.
      report: sends a `Status` to the launcher; must be thread-safe.
      restarts: how many times the platform restarted this node before this run of it.
    """

    label: str
    stop_event: StopEvent
    report: Callable[[Status], None]
    restarts: int = 0


_thread_local = threading.local()
_process_context: NodeContext | None = None
_default_stop_event: threading.Event | None = None
_default_lock = threading.Lock()


def _default_event() -> threading.Event:
    # Created lazily: nothing happens at import time.
    global _default_stop_event
    with _default_lock:
        if _default_stop_event is None:
            _default_stop_event = threading.Event()
        return _default_stop_event


def current() -> NodeContext | None:
    """Returns the context of the node running the caller, or None outside any node."""
    context = getattr(_thread_local, "context", None)
    return context if context is not None else _process_context


def thread_context() -> NodeContext | None:
    """Returns the context bound to the calling thread, if any (platform code only)."""
    return getattr(_thread_local, "context", None)


def bind_thread(context: NodeContext | None) -> None:
    """Binds `context` to the calling thread (platform code only)."""
    _thread_local.context = context


def bind_process(context: NodeContext | None) -> None:
    """Binds `context` to the whole process (platform code only)."""
    global _process_context
    _process_context = context


def process_context() -> NodeContext | None:
    """Returns the context bound to the process, if any (platform code only)."""
    return _process_context


def stop_event() -> StopEvent:
    """Returns the event that is set when the program is stopping.

    Run loops poll `stop_event().is_set()` or sleep with `stop_event().wait(seconds)` so that
    they wake up as soon as the program stops.
    """
    context = current()
    return context.stop_event if context is not None else _default_event()


def stop_requested() -> bool:
    """Returns True once the program is stopping."""
    return stop_event().is_set()


def node_label() -> str | None:
    """Returns the label of the node running the caller, or None outside any node."""
    context = current()
    return context.label if context is not None else None


def restart_count() -> int:
    """Returns how many times this node was restarted (0 on its first run, and outside nodes).

    A restarted node runs again from its original arguments; code that must not repeat its
    first run (an env worker's seed, say) derives what it needs from this count.
    """
    context = current()
    return context.restarts if context is not None else 0


def request_stop(reason: str = "done", info: dict[str, Any] | None = None) -> None:
    """Asks the whole program to stop cleanly, e.g. when the learner reached its step budget.

    The launcher sets every node's stop event and returns a `LaunchResult` with
    `stopped_by="requested"`, this `reason` and this `info`. The first request wins. A request
    made once the program is stopping for another cause (a signal, an error) leaves that cause
    and gives the result this `info` where it has none. Outside any node, this sets the
    process-global default stop event.

    Args:
      reason: a short human-readable reason.
      info: a small picklable dict carried back to the launcher's result (e.g. final metrics).

    Raises:
      TypeError: if `info` is not a dict.
    """
    if info is not None and not isinstance(info, dict):
        raise TypeError(f"request_stop(info=...) must be a dict or None, got {type(info).__name__}")
    context = current()
    if context is None:
        _default_event().set()
        return
    # The launcher, not the node, sets the stop event: one authority decides how the program ended.
    context.report(Status("stop_request", context.label, reason=str(reason), info=dict(info or {})))


def report_final(info: dict[str, Any]) -> None:
    """Gives the launcher's result `info` where it has none, without asking for a stop: a
    node's final counts, sent as it ends, reach the result of a program stopped by a signal or
    by another node's error (a stop the node requested carries its own `info`). Outside any
    node, nothing happens.

    Raises:
      TypeError: if `info` is not a dict.
    """
    if not isinstance(info, dict):
        raise TypeError(f"report_final(info) must be a dict, got {type(info).__name__}")
    context = current()
    if context is not None:
        context.report(Status("final", context.label, info=dict(info)))
