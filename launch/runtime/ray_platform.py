"""The `ray` platform: every node is a Ray actor, on a local Ray instance or on a cluster.

Ray places the nodes (by the resources their groups ask for), starts and kills their processes;
nodes still call each other over the program's authenticated TCP RPC (launch/runtime/rpc.py), so
clients keep exactly the sync and `.futures` semantics of `local_mp`. Each actor first reports
the IP of the Ray node it landed on and, for a node that serves RPCs, a free port there, which
it keeps bound until its node serves: that becomes the node's address, which handles carry.
On a cluster of several Ray nodes, the nodes that ask for a GPU or a custom resource are placed
first, before any CPU-only node asks for room (see `_placement_waves`). Then its `run_node`
call runs the node; the launcher long-polls each actor for its `Status` messages, and a failed
`run_node` call (the actor's process died) is the node's error.

A restarted node gets a new actor pinned to the same Ray node and port, so its clients' address
stays valid; where that Ray node is gone (a machine lost), it is placed again on the nodes left,
at a new address (env workers, whom no node calls, go on so). Ray is imported only when this
platform is used.

Stopping kills every actor; the launcher then waits (bounded, then SIGKILL) until the processes
of the actors on its own host have exited, since Ray's kill only asks.

Group resources (`Program.group(..., resources=...)`): "CPU", "GPU", any custom resource, and
"accelerator", which asks for that many GPUs when the cluster has GPUs and for nothing otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from trellis.launch.runtime import program as program_lib
from trellis.launch.runtime import rpc
from trellis.launch.runtime.node_context import NodeContext, Status, drain

_SECRET_BYTES = 32
_STATUS_POLL_S = 0.5  # How long an actor holds a status long-poll open.
_NODE_ACTOR_CONCURRENCY = 4  # run_node, a status poll and stop may all be in flight at once.
_PID_TIMEOUT_S = 2.0  # How long live actors get to tell their pids at shutdown.
_EXIT_TIMEOUT_S = 10.0  # How long killed actor processes on this host get to exit.
# How long nodes may wait for Ray to find them room (machines an autoscaler adds meanwhile count).
_PLACE_TIMEOUT_S = 300.0
# A Ray node whose raylet takes no connection within this is gone (`Backend._ray_node_up`).
# Ray's GCS says so only once its health checks have missed (seconds after a machine's loss):
# a restart waits up to _DEAD_TIMEOUT_S for that, lest Ray place the new actor there.
_PROBE_TIMEOUT_S = 2.0
_DEAD_TIMEOUT_S = 60.0
_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
# A local instance of our own starts no idle workers: by default its raylet starts one per CPU,
# and ray.init waits for them, yet none can host a node (their runtime_env lacks the nodes' env
# vars, `_actor_env_vars`). On a busy 2-core machine they cost about 2 s of ray.init and more
# of the nodes' start (issue 20: a Ray test ran past 240 s under load).
_LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


class _NodeActor:
    """Hosts one node in a Ray worker process (wrapped with `ray.remote` at launch)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._statuses: queue.SimpleQueue[Status] = queue.SimpleQueue()
        self._sock: socket.socket | None = None

    def place(self, reserve_port: bool) -> tuple[str, int | None, str]:
        """(IP of this Ray node, a port bound there for the node if `reserve_port`, Ray node
        id)."""
        import ray

        host = ray.util.get_node_ip_address()
        port = None
        if reserve_port:
            self._sock = rpc.reserve_port(host)
            port = self._sock.getsockname()[1]
        return host, port, ray.get_runtime_context().get_node_id()

    def run_node(self, label: str, address: rpc.TcpAddress | None, payload: bytes,
                 restarts: int, nice: int) -> bool:
        # Linux keeps a niceness per thread: this one runs the node and starts its threads
        # (Ray's own threads keep the niceness Ray starts its workers with).
        os.nice(nice)
        os.environ["TRELLIS_NODE_LABEL"] = label
        context = NodeContext(label, self._stop, self._statuses.put, restarts)
        # A restarted node's actor was not placed: its server binds the port again.
        sock, self._sock = self._sock, None
        return program_lib.execute_in_process(payload, context, address, sock)

    def statuses(self, timeout_s: float) -> list[Status]:
        """The node's messages: waits up to `timeout_s` for the first, then takes the rest."""
        return drain(self._statuses, timeout_s)

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        """The actor's process id (on its Ray node)."""
        return os.getpid()


@dataclasses.dataclass
class _Actor:
    label: str
    handle: Any  # ray.actor.ActorHandle
    ray_node_id: str
    run_ref: Any = None  # ObjectRef of run_node
    status_ref: Any = None  # ObjectRef of the pending statuses() long-poll
    ended: bool = True  # not running: run_node not called yet, returned, or the actor died


class Backend:
    """Runs each node of `program` as a Ray actor.

    Args:
      program: the program graph.
      ray_address: None starts a local Ray instance (shut down with the program); "auto" or
        "HOST:PORT" joins a running cluster (left running).
    """

    def __init__(self, program: program_lib.Program, ray_address: str | None = None):
        self._program = program
        self._address = ray_address
        self._ray: Any = None
        self._started_ray = False
        self._remote_class: Any = None
        self._actors: dict[str, _Actor] = {}
        self._payloads: dict[str, bytes] = {}
        self._stopping = False
        self._secret = b""

    def start(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError(
                "platform 'ray' needs Ray: pip install -e \".[ray]\" (or use local_mp)"
            ) from exc
        self._ray = ray
        if not ray.is_initialized():
            # Without an address: a fresh local instance, ours to stop, with at least as many
            # logical CPUs as the nodes ask for (they share the cores, as on local_mp).
            # log_to_driver keeps node tracebacks and prints on the launcher's terminal.
            num_cpus = None
            if self._address is None:
                asked = sum(_actor_options(n.resources, {})["num_cpus"]
                            for n in self._program.nodes)
                num_cpus = max(os.cpu_count() or 1, int(asked + 0.999))
            # "local", not None: None would join whatever cluster `ray start` last ran here.
            ray.init(address=self._address or "local", num_cpus=num_cpus,
                     include_dashboard=False, log_to_driver=True, configure_logging=False,
                     _system_config=_LOCAL_SYSTEM_CONFIG if self._address is None else None)
            self._started_ray = self._address is None
        # (Ray's annotations of `remote` leave out the actor option max_concurrency.)
        self._remote_class = ray.remote(  # type: ignore[call-overload]
            max_concurrency=_NODE_ACTOR_CONCURRENCY)(_NodeActor)
        self._secret = secret = os.urandom(_SECRET_BYTES)
        nodes = self._program.nodes
        several = sum(n["Alive"] for n in ray.nodes()) > 1
        places = {}
        for wave in _placement_waves(nodes, ray.cluster_resources(), several):
            places.update(self._place(wave))
        for node in nodes:
            host, port, ray_node_id = places[node.label]
            node.address = rpc.TcpAddress(host, port, secret) if port is not None else None
            self._actors[node.label].ray_node_id = ray_node_id
        self._payloads = {node.label: program_lib.pickle_node(node) for node in nodes}
        for node in nodes:
            self._run(node, restarts=0)

    def _place(self, nodes: list[program_lib.Node]
               ) -> dict[str, tuple[str, int | None, str]]:
        """Starts an actor for each of `nodes`; label -> its `place()` once all have answered.

        Raises:
          RuntimeError: some were not placed within _PLACE_TIMEOUT_S (no room in the cluster).
        """
        for node in nodes:  # Recorded at once, so that a failed start still kills them.
            self._actors[node.label] = _Actor(node.label, self._new_actor(node), "")
        refs = {self._actors[node.label].handle.place.remote(node.serves_rpcs): node
                for node in nodes}
        _, waiting = self._ray.wait(list(refs), num_returns=len(refs), timeout=_PLACE_TIMEOUT_S)
        if waiting:
            asked = "; ".join(f"{refs[ref].label} {refs[ref].resources or {'CPU': 1}}"
                              for ref in waiting)
            raise RuntimeError(
                f"Ray found no room for node(s) within {_PLACE_TIMEOUT_S:g} s: {asked} (free in "
                f"the cluster: {self._ray.available_resources()}); give the cluster those "
                f"resources or the groups fewer")
        return {node.label: self._ray.get(ref) for ref, node in refs.items()}

    def _new_actor(self, node: program_lib.Node, ray_node_id: str | None = None) -> Any:
        options = _actor_options(node.resources, self._ray.cluster_resources())
        options["runtime_env"] = {"env_vars": _actor_env_vars()}
        if ray_node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(ray_node_id,
                                                                            soft=False)
        return self._remote_class.options(name=None, **options).remote()

    def _run(self, node: program_lib.Node, restarts: int) -> None:
        actor = self._actors[node.label]
        actor.run_ref = actor.handle.run_node.remote(
            node.label, node.address, self._payloads[node.label], restarts, node.nice)
        actor.ended = False
        actor.status_ref = actor.handle.statuses.remote(_STATUS_POLL_S)

    def restart(self, label: str, restarts: int) -> None:
        old = self._actors[label]
        self._ray.kill(old.handle, no_restart=True)
        node = next(n for n in self._program.nodes if n.label == label)
        if self._ray_node_up(old.ray_node_id):
            # Same Ray node, same port: the clients other nodes hold stay valid.
            self._actors[label] = _Actor(label, self._new_actor(node, old.ray_node_id),
                                         old.ray_node_id)
        else:
            # Its Ray node is gone (a machine lost or preempted): placed again wherever there
            # is room, at a new address. Env workers, the nodes restarted most, are called by
            # no other node; a node that serves others cannot be found there.
            self._await_dead(old.ray_node_id)
            host, port, ray_node_id = self._place([node])[label]
            node.address = rpc.TcpAddress(host, port, self._secret) if port is not None else None
            self._actors[label].ray_node_id = ray_node_id
            print(f"[launch] node '{label}': its Ray node is gone; placed again on {host} "
                  f"(Ray node {ray_node_id[:8]})", file=sys.stderr, flush=True)
        self._run(node, restarts)

    def _ray_node_up(self, ray_node_id: str) -> bool:
        """Whether a Ray node is up: Ray's GCS says so and its raylet takes a connection. The
        GCS marks a lost machine dead only after missed heartbeats (15 s and more), while its
        actors' deaths are known at once."""
        for info in self._ray.nodes():
            if info["NodeID"] == ray_node_id and info["Alive"]:
                address = (info["NodeManagerAddress"], info["NodeManagerPort"])
                try:
                    with socket.create_connection(address, timeout=_PROBE_TIMEOUT_S):
                        return True
                except OSError:
                    return False
        return False

    def _await_dead(self, ray_node_id: str) -> None:
        """Waits (up to _DEAD_TIMEOUT_S) until Ray's GCS too holds a lost node dead: until
        then it may place the new actor there."""
        deadline = time.monotonic() + _DEAD_TIMEOUT_S
        while time.monotonic() < deadline and any(
                info["NodeID"] == ray_node_id and info["Alive"] for info in self._ray.nodes()):
            time.sleep(0.5)

    def poll(self, timeout_s: float) -> list[Status]:
        ray = self._ray
        refs = {}
        for actor in self._actors.values():
            if actor.status_ref is not None:
                refs[actor.status_ref] = (actor, "statuses")
            if not actor.ended:
                refs[actor.run_ref] = (actor, "run")
        if not refs:
            time.sleep(timeout_s)
            return []
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout_s)
        if ready:  # Take everything else that is ready too, without waiting.
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        statuses: list[Status] = []
        # Messages before ends: a node's last messages come before the news that it ended.
        for ref in sorted(ready, key=lambda r: refs[r][1] == "run"):
            actor, kind = refs[ref]
            if actor is not self._actors.get(actor.label):
                continue  # An actor replaced by a restart since the refs were gathered.
            if kind == "run":
                statuses += self._ended(actor)
            elif ref is actor.status_ref:
                statuses += self._statuses(actor)
        return statuses

    def _statuses(self, actor: _Actor) -> list[Status]:
        try:
            out: list[Status] = self._ray.get(actor.status_ref)
        except self._ray.exceptions.RayError:
            actor.status_ref = None  # The actor is gone; its run_node ref tells how.
            return []
        actor.status_ref = (None if actor.ended
                            else actor.handle.statuses.remote(_STATUS_POLL_S))
        return out

    def _ended(self, actor: _Actor) -> list[Status]:
        actor.ended = True
        try:
            self._ray.get(actor.run_ref)
        except self._ray.exceptions.RayError as exc:
            actor.status_ref = None
            if self._stopping:
                return []
            return [Status("error", actor.label,
                           reason=f"its Ray actor died: {program_lib.one_line(exc)}")]
        # run_node returned: its last messages ("finished", "error") are in the pending
        # long-poll (answered within _STATUS_POLL_S) or still queued.
        out: list[Status] = (self._ray.get(actor.status_ref) if actor.status_ref is not None
                             else [])
        out += self._ray.get(actor.handle.statuses.remote(0.0))
        actor.status_ref = None
        return out

    def shutdown(self, timeout_s: float, on_status: Callable[[Status], None]) -> list[str]:
        self._stopping = True
        ray = self._ray
        if ray is None:
            return []
        for node in self._program.nodes:
            if node.address is not None:
                rpc.mark_stopped(node.address)
        for actor in self._actors.values():
            if not actor.ended:
                actor.handle.stop.remote()
        deadline = time.monotonic() + timeout_s
        stuck: list[str] = []
        while any(not a.ended for a in self._actors.values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                stuck = [a.label for a in self._actors.values() if not a.ended]
                print(f"[launch] killing Ray actor(s) that did not stop within {timeout_s:g} s: "
                      f"{', '.join(stuck)}", file=sys.stderr, flush=True)
                break
            for status in self.poll(min(remaining, 0.1)):
                on_status(status)
        # ray.kill only asks: the processes of this host's actors are waited for (then
        # SIGKILLed), so that none outlives the launch. Actors elsewhere are their Ray node's.
        here = ray.get_runtime_context().get_node_id()
        pids = _pids(ray, [a.handle for a in self._actors.values() if a.ray_node_id == here])
        for actor in self._actors.values():
            ray.kill(actor.handle, no_restart=True)
        if self._started_ray:
            ray.shutdown()
        left = _wait_exited(pids, _EXIT_TIMEOUT_S)
        if left:
            print(f"[launch] killing Ray actor process(es) that did not exit within "
                  f"{_EXIT_TIMEOUT_S:g} s: {', '.join(map(str, left))}", file=sys.stderr,
                  flush=True)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_exited(left, _EXIT_TIMEOUT_S)
        return stuck


def _pids(ray: Any, handles: list[Any]) -> list[int]:
    """The pids of the live actors among `handles` (dead ones and slow answers are skipped)."""
    refs = [handle.pid.remote() for handle in handles]
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_PID_TIMEOUT_S)
    pids = []
    for ref in ready:
        with contextlib.suppress(ray.exceptions.RayError):
            pids.append(ray.get(ref))
    return pids


def _exited(pid: int) -> bool:
    """Whether process `pid` (of this host) has exited; a zombie has (on Linux)."""
    if not os.path.isdir("/proc/self"):  # Not Linux: ask the kernel.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # It exists, as another user's process.
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # (The latter: it ended as it was read.)
        return True


def _wait_exited(pids: list[int], timeout_s: float) -> list[int]:
    """Polls until every process of `pids` has exited or `timeout_s` passed; returns the rest."""
    deadline = time.monotonic() + timeout_s
    left = [pid for pid in pids if not _exited(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if not _exited(pid)]
    return left


def _placement_waves(nodes: list[program_lib.Node], cluster: dict[str, float],
                     several_ray_nodes: bool) -> list[list[program_lib.Node]]:
    """The nodes in the order Ray places them, one wave after the other.

    Ray places actors one by one, in no fixed order. On a cluster of several machines, a
    CPU-only node placed first may take the last CPU of the only machine that has a group's
    GPU or custom resource; that group's node then waits forever (the two-node test's hang in
    issue 14: an env worker on the head, the learner pending). So the nodes asking for a GPU or
    a custom resource form a first wave, placed before the others ask. One machine: one wave.
    """
    def scarce(node: program_lib.Node) -> bool:
        options = _actor_options(node.resources, cluster)
        return options["num_gpus"] > 0 or any(v > 0 for v in options["resources"].values())

    if not several_ray_nodes:
        return [list(nodes)]
    first = [node for node in nodes if scarce(node)]
    rest = [node for node in nodes if not scarce(node)]
    return [wave for wave in (first, rest) if wave]


def _actor_env_vars() -> dict[str, str]:
    """Environment entries of every node actor (Ray's `runtime_env`).

    As local_mp does for its node processes: several nodes of one host may each put JAX on its
    GPU, so none may take most of its memory up front (XLA's default, 75%), or the next runs
    out of memory (issue 20). A value set in the launcher's environment is passed on instead.
    XLA_FLAGS too, where the launcher has it (run.py's GPU autotune level among them:
    builders/experiments/xla_flags.py): a local instance's workers inherit it, a cluster's
    other hosts would not.
    """
    env = {_PREALLOCATE: os.environ.get(_PREALLOCATE, "false")}
    if "XLA_FLAGS" in os.environ:
        env["XLA_FLAGS"] = os.environ["XLA_FLAGS"]
    return env


def _actor_options(resources: dict[str, float], cluster: dict[str, float]) -> dict[str, Any]:
    """Ray actor options for a group's resources (see the module docstring).

    Raises:
      ValueError: a negative amount.
    """
    wanted = dict(resources)
    for name, amount in wanted.items():
        if amount < 0:
            raise ValueError(f"resource {name!r}: amount must be >= 0, got {amount}")
    accelerator = wanted.pop("accelerator", 0)
    gpus = wanted.pop("GPU", 0) + (accelerator if cluster.get("GPU", 0) > 0 else 0)
    return {"num_cpus": wanted.pop("CPU", 1), "num_gpus": gpus, "resources": wanted}
