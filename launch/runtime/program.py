"""The program graph: `Program`, its nodes (`CourierNode`, `PyNode`) and `Handle`s.

A program is a list of nodes in labelled groups. Adding a node returns a `Handle`; handles passed
(nested in lists, tuples or dicts) as arguments of other nodes are replaced by clients when those
nodes start. Nothing here knows about platforms: a platform gives each node an address, then runs
`Node.run_node` in a thread or a process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import pickle
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cloudpickle

from trellis.launch.runtime import node_context, rpc
from trellis.launch.runtime.node_context import NodeContext, Status


class Handle:
    """A reference to a service node, usable before the program is launched.

    Handles are picklable; they carry the node's label and, once launched, its address.
    """

    def __init__(self, node: Node | None, label: str = "", address: rpc.Address | None = None):
        self._node = node
        self._label = label
        self._address = address

    @property
    def label(self) -> str:
        """The node's label ("learner", "actor/3"); final once the program is launched."""
        return self._node.label if self._node is not None else self._label

    @property
    def address(self) -> rpc.Address | None:
        """Where the node serves; None before launch."""
        return self._node.address if self._node is not None else self._address

    def dereference(self, timeout_s: float = 60.0) -> rpc.Client:
        """Returns a client of the node (connects lazily, retrying for up to `timeout_s`).

        Raises:
          RuntimeError: if the node's program has not been launched, or the node serves no RPCs.
        """
        address = self.address
        if address is None:
            raise RuntimeError(
                f"handle of node '{self.label}' has no address: launch the program first, or "
                f"add a CourierNode (PyNodes serve no RPCs)"
            )
        return rpc.connect(self.label, address, timeout_s)

    def __reduce__(self) -> tuple[type[Handle], tuple[None, str, rpc.Address | None]]:
        # Pickle the resolved label and address, never the node (it holds the arguments).
        return (Handle, (None, self.label, self.address))

    def __repr__(self) -> str:
        return f"<Handle of node '{self.label}'>"


class Node:
    """Base class of program nodes. Platforms call `run_node` in the node's main thread."""

    #: Whether the node serves RPCs (and so needs an address).
    serves_rpcs = False

    def __init__(
        self, target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ):
        if not callable(target):
            raise TypeError(f"{type(self).__name__} needs a callable, got {target!r}")
        self._target = target
        self._args = args
        self._kwargs = kwargs
        self._handle: Handle | None = None
        self.label = getattr(target, "__name__", type(target).__name__).lower()
        self.address: rpc.Address | None = None
        #: How often the platform restarts the node after it fails (set by its group).
        self.max_restarts = 0
        #: What the node asks of a cluster platform, e.g. {"CPU": 1} (set by its group).
        self.resources: dict[str, float] = {}
        #: How much nicer (lower in CPU priority) than its launcher the node's process runs
        #: (set by its group).
        self.nice = 0

    def __getstate__(self) -> dict[str, Any]:
        # The handle points back at this node; drop it so only the arguments travel.
        state = dict(self.__dict__)
        state["_handle"] = None
        return state

    def run_node(self, context: NodeContext, serve: Callable[[Any], None]) -> None:
        """Runs the node to completion in the calling thread.

        Args:
          context: the node's context; also bound to this thread by the platform.
          serve: makes an instance's public methods reachable at `self.address`.

        Raises:
          Exception: whatever the node's code raised; the platform reports it.
        """
        raise NotImplementedError


class CourierNode(Node):
    """A service node: constructs `cls(*args, **kwargs)` and serves its public methods as RPCs.

    If the instance has a `run()` method it is called in the node's main thread once the RPC
    server is up; the node keeps serving after `run()` returns, until the program stops.
    """

    serves_rpcs = True

    def __init__(self, cls: Callable[..., Any], *args: Any, **kwargs: Any):
        super().__init__(cls, args, kwargs)
        self._run_enabled = True

    def disable_run(self) -> None:
        """Makes the node serve without calling `run()` (so tests can drive it by RPCs)."""
        self._run_enabled = False

    def run_node(self, context: NodeContext, serve: Callable[[Any], None]) -> None:
        instance = self._target(*dereference(self._args), **dereference(self._kwargs))
        serve(instance)
        run = getattr(instance, "run", None) if self._run_enabled else None
        runs = callable(run)
        context.report(Status("ready", self.label, runs=runs))
        if callable(run):
            run()
            context.report(Status("finished", self.label))
        context.stop_event.wait()


class PyNode(Node):
    """A function node: calls `fn(*args, **kwargs)`; the node is done when `fn` returns."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any):
        super().__init__(fn, args, kwargs)

    def run_node(self, context: NodeContext, serve: Callable[[Any], None]) -> None:
        args, kwargs = dereference(self._args), dereference(self._kwargs)
        context.report(Status("ready", self.label, runs=True))
        self._target(*args, **kwargs)
        context.report(Status("finished", self.label))


def pickle_node(node: Node) -> bytes:
    """Serialises `node` with its arguments (cloudpickle: lambdas and local classes travel too).

    Raises:
      TypeError: naming the node, if its arguments cannot be pickled.
    """
    try:
        payload: bytes = cloudpickle.dumps(node, protocol=pickle.HIGHEST_PROTOCOL)
        return payload
    except Exception as exc:
        raise TypeError(
            f"the arguments of node '{node.label}' cannot be pickled ({exc!r}); node arguments "
            f"must survive cloudpickle on every platform (pass configs and handles, not live "
            f"objects such as locks, sockets or open files)"
        ) from exc


def execute(payload: bytes, context: NodeContext, serve: Callable[[Any], None]) -> bool:
    """Unpickles a node and runs it in the calling thread, reporting any exception.

    Args:
      payload: the node, from `pickle_node`.
      context: the node's context.
      serve: see `Node.run_node`.

    Returns:
      True if the node ran to completion, False if it raised (the error was reported).
    """
    try:
        node = pickle.loads(payload)
        node.run_node(context, serve)
        return True
    except BaseException as exc:  # SystemExit/KeyboardInterrupt in a node are failures too
        context.report(
            Status(
                "error",
                context.label,
                reason=one_line(exc),
                traceback=traceback.format_exc(),
                peer_gone=isinstance(exc, ConnectionError | EOFError),
            )
        )
        return False


def execute_in_process(payload: bytes, context: NodeContext, address: rpc.TcpAddress | None,
                       sock: socket.socket | None = None) -> bool:
    """`execute` for a node that owns its process (local_mp, ray): binds `context` to the
    process and serves the node's RPCs over TCP at `address` (on `sock`, bound to it already,
    where given); returns as `execute`.

    Python's cyclic garbage collector is off until the node is up (serves its RPCs, or
    reports "ready"): its start (its imports, and for the learner the programs it traces)
    makes most of what the process will ever hold, and each full collection on the way walked
    all of it again (0.07-0.23 s each, 0.46 s in all, in the learner's process on 2 cores).
    Then one collection, and what is left is frozen out of later ones (`gc.freeze`), so that a
    full collection while the learner serves walks only what came since (one took 0.17 s 2.7 s
    into a run, with no env step served meanwhile).
    """
    gc.disable()
    context = dataclasses.replace(context, report=_collected_once_ready(context.report))
    node_context.bind_process(context)
    node_context.bind_thread(context)
    servers: list[rpc.TcpServer] = []

    def serve(instance: Any) -> None:
        assert address is not None, f"node '{context.label}' serves RPCs but has no address"
        _collect_start_garbage()  # Before the first call can come.
        servers.append(rpc.TcpServer(instance, context.label, address, sock))

    ok = execute(payload, context, serve)
    for server in servers:
        stuck = server.close()
        if stuck:
            print(f"[launch] node '{context.label}': {len(stuck)} RPC call(s) still running "
                  f"as its process exits", file=sys.stderr, flush=True)
    return ok


def _collect_start_garbage() -> None:
    """Once, while the collector is still off: collects the garbage of the node's start,
    freezes the rest and turns the collector back on (see `execute_in_process`)."""
    if not gc.isenabled():
        gc.collect()
        gc.freeze()
        gc.enable()


def _collected_once_ready(report: Callable[[Status], None]) -> Callable[[Status], None]:
    """`report`, which at the node's "ready" first collects the garbage of its start (for a
    node that serves no RPCs; one that does collected it as it began serving)."""

    def report_ready(status: Status) -> None:
        if status.kind == "ready":
            _collect_start_garbage()
        report(status)

    return report_ready


def one_line(exc: BaseException) -> str:
    """Returns "Type: first line of the message"."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def dereference(value: Any) -> Any:
    """Replaces every `Handle` inside nested lists, tuples (named too) and dicts by a client."""
    if isinstance(value, Handle):
        return value.dereference()
    if isinstance(value, list):
        return [dereference(v) for v in value]
    if isinstance(value, tuple):
        items = [dereference(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return type(value)((k, dereference(v)) for k, v in value.items())
    return value


@dataclasses.dataclass
class _Group:
    label: str
    nodes: list[Node] = dataclasses.field(default_factory=list)
    max_restarts: int = 0
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    nice: int = 0

    def configure(self, node: Node) -> None:
        """Gives `node` the group's settings."""
        node.max_restarts, node.resources, node.nice = (
            self.max_restarts, dict(self.resources), self.nice)


class Program:
    """A graph of nodes in labelled groups.

    Example:
      program = runtime.Program("impala")
      with program.group("learner"):
          learner = program.add_node(runtime.CourierNode(Learner, config))
      with program.group("actor"):
          for i in range(4):
              program.add_node(runtime.CourierNode(Actor, learner, i))
      runtime.launch(program, platform="local_mp")

    A node's label is its group's label when the group holds one node, else "group/index".

    A group may let its nodes be restarted after they fail (like a Ray actor's
    `max_restarts`): `with program.group("actor", max_restarts=3):`. A restarted node runs
    again from its original arguments at the same address; `launch.restart_count()` tells
    its code which incarnation it is, e.g. to draw a fresh seed.

    `preload` names modules that node processes import and that are safe to import before a
    fork: none may start a thread or an accelerator when imported (JAX may not be among them,
    nor import through them). `local_mp` forks its node processes from a server that imported
    these once (the first program of a launcher process decides what it imports), so that
    dozens of env workers do not each import them again; other platforms ignore it.
    """

    def __init__(self, name: str, preload: Sequence[str] = ()):
        self.name = name
        self.preload = tuple(preload)
        self._groups: dict[str, _Group] = {}
        self._current_group: str | None = None

    @contextlib.contextmanager
    def group(
        self, label: str, max_restarts: int | None = None,
        resources: dict[str, float] | None = None, nice: int | None = None,
    ) -> Iterator[None]:
        """Nodes added inside this block belong to group `label`.

        Args:
          label: the group's label.
          max_restarts: how many times each node of the group may be restarted after it
            raises or its process dies, before its failure stops the program; None keeps
            the group's setting (0 unless set before).
          resources: what each node of the group asks of a cluster platform (`ray`): "CPU",
            "GPU", custom resources, or "accelerator" (GPUs where the cluster has them);
            None keeps the group's setting. Platforms on one machine ignore it.
          nice: how much nicer than the launcher (`os.nice`, 0-19) each node's process runs,
            so that where the cores are short, other nodes' processes get them first;
            platforms that run nodes as processes (`local_mp`, `ray`) apply it, `local_mt`
            (threads of one process) does not. None keeps the group's setting (0 unless set).

        Raises:
          ValueError: a nested group, a bad label, a negative `max_restarts` or a `nice`
            outside 0-19.
        """
        _check_label(label)
        if max_restarts is not None and (not isinstance(max_restarts, int) or max_restarts < 0):
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        if nice is not None and (not isinstance(nice, int) or not 0 <= nice <= 19):
            raise ValueError(f"nice must be an int in [0, 19], got {nice!r}")
        if self._current_group is not None:
            raise ValueError(
                f"groups do not nest: group('{label}') opened inside group('{self._current_group}')"
            )
        self._current_group = label
        group = self._groups.setdefault(label, _Group(label))
        if max_restarts is not None:
            group.max_restarts = max_restarts
        if resources is not None:
            group.resources = dict(resources)
        if nice is not None:
            group.nice = nice
        for node in group.nodes:
            group.configure(node)
        try:
            yield
        finally:
            self._current_group = None

    def add_node(self, node: Node, label: str | None = None) -> Handle:
        """Adds `node` to the current group (or to group `label`) and returns its handle.

        Args:
          node: a `CourierNode` or `PyNode`, not yet part of a program.
          label: the group label, as an alternative to `with program.group(label):`; without
            either, the node's callable name is used.

        Returns:
          The node's handle; pass it to other nodes to give them a client.

        Raises:
          ValueError: if the node was already added, or `label` conflicts with the open group.
        """
        if not isinstance(node, Node):
            raise TypeError(f"add_node() takes a CourierNode or PyNode, got {node!r}")
        if node._handle is not None:
            raise ValueError(f"node '{node.label}' was already added to a program")
        if label is not None and self._current_group is not None and label != self._current_group:
            raise ValueError(
                f"add_node(label='{label}') inside group('{self._current_group}'): give one label"
            )
        group_label = label or self._current_group or node.label
        _check_label(group_label)
        group = self._groups.setdefault(group_label, _Group(group_label))
        group.nodes.append(node)
        group.configure(node)
        node._handle = Handle(node)
        self._relabel(group)
        return node._handle

    @property
    def nodes(self) -> list[Node]:
        """All nodes, in the order they were added per group."""
        return [node for group in self._groups.values() for node in group.nodes]

    @property
    def groups(self) -> dict[str, list[Node]]:
        """Group label -> the group's nodes."""
        return {label: list(group.nodes) for label, group in self._groups.items()}

    def handles(self, group: str) -> list[Handle]:
        """Returns the handles of the nodes of `group`, in the order they were added.

        Raises:
          KeyError: if there is no such group; the message lists the groups.
        """
        if group not in self._groups:
            raise KeyError(
                f"program '{self.name}' has no group {group!r}; its groups are: "
                f"{', '.join(self._groups) or '(none)'}"
            )
        # (every node of a group has its handle: add_node made it)
        return [node._handle for node in self._groups[group].nodes if node._handle is not None]

    @staticmethod
    def _relabel(group: _Group) -> None:
        if len(group.nodes) == 1:
            group.nodes[0].label = group.label
        else:
            for index, node in enumerate(group.nodes):
                node.label = f"{group.label}/{index}"

    def __repr__(self) -> str:
        sizes = ", ".join(f"{label}: {len(g.nodes)}" for label, g in self._groups.items())
        return f"<Program '{self.name}' ({sizes})>"


def _check_label(label: str) -> None:
    if not isinstance(label, str) or not label or "/" in label:
        raise ValueError(f"a group label must be a non-empty string without '/', got {label!r}")
