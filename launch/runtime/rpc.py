"""RPC between nodes: clients, the loopback TCP server, and the in-process fast path.

A service node's public methods (names not starting with "_") are its RPCs. Callers hold a
`Client`: `client.method(*args, **kwargs)` is a synchronous call and
`client.futures.method(*args, **kwargs)` returns a `concurrent.futures.Future`. Both client kinds
give the same semantics:

- an exception raised by the remote method is re-raised as `RemoteError` carrying the remote
  traceback text;
- an unknown or private method raises `AttributeError` naming the node and its methods;
- a client connects lazily and retries for up to `timeout_s` (the node may still be starting),
  then raises `ConnectionError` naming the node and its address;
- a server that goes away mid-call raises `ConnectionError` at once;
- clients are picklable (they travel as label + address) and thread-safe (one connection per
  calling thread).

Wire format (TCP): every message is a header (the pickle's length, the number of out-of-band
buffers and their lengths), a cloudpickle payload (protocol 5) and the raw bytes of those
buffers: large contiguous arrays travel outside the pickle, so they are neither copied into
it when sent nor out of it when received. Both sides first prove they hold the program's
secret with HMAC-SHA256 over the other side's random nonce, so that neither side unpickles
bytes from a stranger.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import hmac
import os
import pickle
import queue
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import cloudpickle
import numpy as np

from trellis.launch.runtime import node_context

_MAGIC = b"TRELLIS-RPC-1"
_NONCE_BYTES = 32
_HEADER = struct.Struct("!Q")
_HANDSHAKE_TIMEOUT_S = 10.0
# The longest wait between a client's tries to reach a node that does not listen yet: env
# workers are up before their learner is built, and each connects at its first try after
# the learner serves, so this is start-up added to every launch (at 0.5 s, 32 workers'
# first requests came 0.26 s into the learner's run; at 0.05 s, 0.06 s). A refused local
# connect costs microseconds.
_CONNECT_RETRY_MAX_S = 0.05
# How long a closing server waits for calls in progress (a node process exits after it).
_CLOSE_TIMEOUT_S = 5.0
# Below this size one `sendall` of header + payload saves a packet; above it the copy costs more.
_COALESCE_BYTES = 64 * 1024
# A frame header is checked against these before anything is allocated: a corrupt or hostile
# header must not make a node reserve its announced size (the OS may grant it lazily and the
# thread would then wait forever for bytes that never come).
_MAX_MESSAGE_BYTES = 1 << 34  # 16 GiB: far above any params or unroll batch
_MAX_BUFFERS = 1 << 16

_P = ParamSpec("_P")
_T = TypeVar("_T")


class RemoteError(RuntimeError):
    """An exception raised by a remote method, re-raised in the caller.

    Attributes:
      node: label of the node that raised.
      method: the RPC method name.
      remote_type: the remote exception's type name, e.g. "ValueError".
      remote_traceback: the remote traceback text.
    """

    def __init__(
        self,
        message: str,
        node: str = "",
        method: str = "",
        remote_type: str = "",
        remote_traceback: str = "",
    ):
        super().__init__(message)
        self.node = node
        self.method = method
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> tuple[type[RemoteError], tuple[str, str, str, str, str]]:
        # The default reduce passes only `args`; keep the attributes when passed between nodes.
        return (
            RemoteError,
            (self.args[0], self.node, self.method, self.remote_type, self.remote_traceback),
        )

    @classmethod
    def from_parts(
        cls, node: str, method: str, remote_type: str, text: str, tb: str
    ) -> RemoteError:
        message = (
            f"{method}() on node '{node}' raised {remote_type}: {text}\n"
            f"--- remote traceback (node '{node}') ---\n{tb.rstrip()}"
        )
        return cls(message, node, method, remote_type, tb)


@dataclasses.dataclass(frozen=True)
class TcpAddress:
    """A node served over loopback TCP; `authkey` is the program's secret (never printed)."""

    host: str
    port: int
    authkey: bytes = dataclasses.field(repr=False)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class InprocAddress:
    """A node served in this process (`local_mt`); `key` indexes the in-process registry."""

    key: str

    def __str__(self) -> str:
        return f"inproc://{self.key}"


Address = TcpAddress | InprocAddress


def connect(label: str, address: Address, timeout_s: float = 60.0) -> Client:
    """Returns a client of the node `label` served at `address` (connects lazily)."""
    if isinstance(address, TcpAddress):
        return TcpClient(label, address, timeout_s)
    if isinstance(address, InprocAddress):
        return InprocClient(label, address, timeout_s)
    raise TypeError(f"unknown address type {type(address).__name__} for node '{label}'")


# Ports this process has handed out, so that it never hands one out twice before they are bound.
_handed_out: set[int] = set()


def reserve_port(host: str = "127.0.0.1", port: int | None = None) -> socket.socket:
    """Returns a socket bound to `port` of `host`, or to a free port, not listening yet: a
    node's `TcpServer` listens on it.

    Bound from the launch until the node serves, the port cannot be taken by anyone else
    meanwhile: a port that was only free a moment ago was, while a learner was being built
    ("Address already in use" at its bind, beside another launch). A free port is bound
    without SO_REUSEADDR, so that no other socket may share it; a given `port` (a restarted
    node's) with it, since its last process's connections may linger in TIME_WAIT.
    Free ports are picked below the kernel's ephemeral range where Linux says what it is
    (elsewhere the kernel picks): one picked only to be bound later (`free_port`) could be
    taken by any outgoing connection.
    """
    if port is not None:
        return _bound(host, port, reuse=True)
    rng = np.random.default_rng()
    low = _ephemeral_low()
    for _ in range(100 if low > _LOWEST_PORT + 1000 else 0):
        pick = int(rng.integers(_LOWEST_PORT, low))
        if pick not in _handed_out:
            with contextlib.suppress(OSError):  # Taken: pick another.
                return _bound(host, pick, reuse=False)
    return _bound(host, 0, reuse=False)


def _bound(host: str, port: int, reuse: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """Returns a port that was free a moment ago (see `reserve_port`), for a server bound later
    in another way (a Ray head's)."""
    with reserve_port(host) as sock:
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port


# Above the well-known ports and Ray's worker ports (10002-19999 by default): Ray refuses a
# head's GCS port in that range, and its workers bind there on every node.
_LOWEST_PORT = 20000


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range, or 0 where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def resolve_method(instance: Any, name: str, label: str) -> Callable[..., Any]:
    """Returns the bound public method `name` of `instance`.

    Raises:
      AttributeError: if `name` is private, missing or not callable; the message lists the
        node's RPC methods.
    """
    if name.startswith("_"):
        raise AttributeError(
            f"{name!r} is private on node '{label}': only public methods (names not starting "
            f"with '_') are RPCs"
        )
    method: object = getattr(instance, name, None)
    if method is None or not callable(method):
        public = sorted(
            n for n in dir(instance) if not n.startswith("_") and callable(getattr(instance, n))
        )
        raise AttributeError(
            f"node '{label}' ({type(instance).__name__}) has no RPC method {name!r}; "
            f"its methods are: {', '.join(public) or '(none)'}"
        )
    return method


# ---------------------------------------------------------------------------------------------
# Clients


def address_of(client: Client) -> Address:
    """Where `client`'s node serves (not an attribute of the client: those are its RPCs)."""
    return client._address


class Client:
    """Base client: attribute access makes RPC stubs; subclasses implement `_call`."""

    def __init__(self, label: str, address: Address, timeout_s: float = 60.0):
        self._label = label
        self._address = address
        self._timeout_s = float(timeout_s)

    def __getattr__(self, name: str) -> _Stub:
        # Private names must raise AttributeError: pickle, copy and friends probe for them.
        if name.startswith("_"):
            raise AttributeError(
                f"{name!r}: private methods are not RPCs (client of node '{self._label}')"
            )
        return _Stub(self, name)

    @property
    def futures(self) -> _Futures:
        """`client.futures.method(...)` runs the call in a background thread -> Future."""
        return _Futures(self)

    def __reduce__(self) -> tuple[type[Client], tuple[str, Address, float]]:
        # Travel as (label, address, timeout): connections and threads stay behind.
        return (type(self), (self._label, self._address, self._timeout_s))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of node '{self._label}' at {self._address}>"

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _abort_if_stopping(self) -> None:
        # Inside a node of a stopping program, waiting for a peer that is going away only
        # delays the shutdown; outside nodes (tests, notebooks) the full timeout applies.
        context = node_context.current()
        if context is not None and context.stop_event.is_set():
            raise ConnectionError(
                f"program is stopping: not connecting to node '{self._label}' at {self._address}"
            )


class _Stub:
    """One RPC method of a client."""

    __slots__ = ("_client", "_name")

    def __init__(self, client: Client, name: str):
        self._client = client
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client._call(self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<RPC {self._name}() of node '{self._client._label}'>"


class _Futures:
    """`client.futures`: the same methods, returning `concurrent.futures.Future`s."""

    __slots__ = ("_client",)

    def __init__(self, client: Client):
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., concurrent.futures.Future[Any]]:
        if name.startswith("_"):
            raise AttributeError(
                f"{name!r}: private methods are not RPCs (client of node '{self._client._label}')"
            )

        def submit(*args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
            return _pool().submit(self._client._call, name, args, kwargs)

        submit.__name__ = name
        return submit


class TcpClient(Client):
    """Client of a node in another process; one socket per calling thread."""

    _address: TcpAddress

    def __init__(self, label: str, address: TcpAddress, timeout_s: float = 60.0):
        super().__init__(label, address, timeout_s)
        self._local = threading.local()

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            request = _dumps((name, args, kwargs))
        except Exception as exc:
            raise TypeError(
                f"arguments of {name}() for node '{self._label}' cannot be pickled: {exc}"
            ) from exc
        sock = self._socket()
        try:
            _send_message(sock, request)
            reply = _recv_message(sock)
        except (OSError, EOFError) as exc:
            self._forget_socket()
            raise ConnectionError(
                f"lost the connection to node '{self._label}' at {self._address} during "
                f"{name}(): {exc!r} (did the node stop or crash?)"
            ) from exc
        except BaseException:
            # Interrupted mid-message: the stream is out of step, never reuse it.
            self._forget_socket()
            raise
        return _unpack_reply(reply, self._label, name)

    def _socket(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._connect()
            self._local.sock = sock
        return sock

    def _forget_socket(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.sock = None
        if sock is not None:
            sock.close()

    def _connect(self) -> socket.socket:
        address = self._address
        deadline = time.monotonic() + self._timeout_s
        delay = 0.02
        while True:
            self._abort_if_stopping()
            if address in _stopped_tcp:
                raise ConnectionError(f"node '{self._label}' at {address} has stopped")
            sock = None
            try:
                sock = socket.create_connection((address.host, address.port), timeout=5.0)
                _client_handshake(sock, address.authkey)
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except _AuthenticationError as exc:
                if sock is not None:
                    sock.close()
                raise ConnectionError(
                    f"node '{self._label}' at {address} rejected the program secret (or is "
                    f"not a Trellis node): {exc}"
                ) from exc
            except (OSError, EOFError) as exc:
                if sock is not None:
                    sock.close()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionError(
                        f"could not connect to node '{self._label}' at {address} within "
                        f"{self._timeout_s:g} s (last error: {exc!r}); is the node running?"
                    ) from exc
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, _CONNECT_RETRY_MAX_S)


class InprocClient(Client):
    """Client of a node in this process (`local_mt`): calls the instance directly."""

    _address: InprocAddress

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        instance, context = self._target()
        method = resolve_method(instance, name, self._label)
        # The method runs in the caller's thread; let it see its own node, as it would remotely.
        caller_context = node_context.thread_context()
        node_context.bind_thread(context)
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            raise RemoteError.from_parts(
                self._label, name, type(exc).__name__, str(exc), traceback.format_exc()
            ) from exc
        finally:
            node_context.bind_thread(caller_context)

    def _target(self) -> tuple[Any, node_context.NodeContext]:
        deadline = time.monotonic() + self._timeout_s
        with _inproc_cond:
            while True:
                target = _inproc_servers.get(self._address.key)
                if isinstance(target, _Closed):
                    raise ConnectionError(f"node '{self._label}' at {self._address} has stopped")
                if target is not None:
                    return target
                self._abort_if_stopping()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionError(
                        f"node '{self._label}' at {self._address} did not start serving within "
                        f"{self._timeout_s:g} s; is the node running?"
                    )
                _inproc_cond.wait(min(remaining, 0.1))


def _unpack_reply(reply: _Message, label: str, name: str) -> Any:
    status, *rest = _loads(reply)
    if status == "ok":
        return rest[0]
    if status == "no_method":
        raise AttributeError(rest[0])
    remote_type, text, tb = rest
    raise RemoteError.from_parts(label, name, remote_type, text, tb)


# ---------------------------------------------------------------------------------------------
# Stopped nodes, and the in-process registry (local_mt)

_inproc_cond = threading.Condition()


class _Closed:
    """The tombstone of a stopped node: its clients fail at once instead of waiting."""


_CLOSED = _Closed()
# key -> (the node's instance, its context), or the tombstone once it stopped.
_inproc_servers: dict[str, tuple[Any, node_context.NodeContext] | _Closed] = {}
_stopped_tcp: set[TcpAddress] = set()  # (a few dozen bytes per node per launch)


def mark_stopped(address: Address) -> None:
    """Makes new connections to `address` from this process fail at once.

    The launcher calls this for every node when its program stops, so that clients it handed out
    (e.g. to a test or a notebook) raise `ConnectionError` instead of retrying for their timeout.
    """
    if isinstance(address, InprocAddress):
        with _inproc_cond:
            _inproc_servers[address.key] = _CLOSED
            _inproc_cond.notify_all()
    else:
        _stopped_tcp.add(address)


def serve_inproc(address: InprocAddress, instance: Any, context: node_context.NodeContext) -> None:
    """Makes `instance`, a node with `context`, reachable by `InprocClient`s of `address`."""
    with _inproc_cond:
        _inproc_servers[address.key] = (instance, context)
        _inproc_cond.notify_all()


# ---------------------------------------------------------------------------------------------
# TCP server (local_mp)


class TcpServer:
    """Serves the public methods of `instance` on `address`, one thread per connection.

    The threads are daemons, so a caller stuck on a dead peer cannot keep the process alive;
    `close()` still ends and joins them, so that no thread is inside a node's method (which may
    be running native code, e.g. JAX) when the process exits.
    """

    def __init__(self, instance: Any, label: str, address: TcpAddress,
                 sock: socket.socket | None = None):
        """`sock`: bound to `address` already (`reserve_port`), else the server binds it."""
        self._instance = instance
        self._label = label
        self._authkey = address.authkey
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        if sock is None:
            # create_server sets SO_REUSEADDR, so a port freed a moment ago binds.
            sock = socket.create_server((address.host, address.port))
        else:
            # Accepted connections take it on: a restarted node's process binds the port again
            # while they linger in TIME_WAIT.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.listen()
        self._sock = sock
        # Accept with a timeout so that close() is noticed without platform-specific tricks.
        self._sock.settimeout(0.5)
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"rpc-accept:{label}", daemon=True
        )
        self._thread.start()

    def close(self, timeout_s: float = _CLOSE_TIMEOUT_S) -> list[str]:
        """Stops serving: no new connections, and each open one ends after its current call.

        Args:
          timeout_s: how long calls in progress get to return.

        Returns:
          The names of the connection threads still in a call after `timeout_s` (left running).
        """
        self._closed.set()
        # On Linux, shutdown wakes a thread blocked in accept() at once; elsewhere the accept
        # timeout bounds the wait. Without it every node's exit waited ~0.25 s on average.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout_s)
        with self._lock:
            connections = dict(self._connections)
        for conn in connections:
            # The reading side only: a call in progress still sends its reply, then its
            # thread reads EOF and ends.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RD)
        deadline = time.monotonic() + timeout_s
        for thread in connections.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in connections.values() if thread.is_alive()]

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            thread = threading.Thread(
                target=self._serve_connection, args=(conn,), name=f"rpc:{self._label}", daemon=True
            )
            with self._lock:
                self._connections[conn] = thread
            thread.start()

    def _serve_connection(self, conn: socket.socket) -> None:
        try:
            self._serve_requests(conn)
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def _serve_requests(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(_HANDSHAKE_TIMEOUT_S)
            _server_handshake(conn, self._authkey)
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, EOFError, _AuthenticationError):
            return  # a stranger or a client that gave up: nothing to answer
        while not self._closed.is_set():
            try:
                request = _recv_message(conn)
            except (OSError, EOFError):
                return
            reply = self._handle(request)
            try:
                _send_message(conn, reply)
            except OSError:
                return

    def _handle(self, request: _Message) -> _Message:
        name = "?"
        try:
            name, args, kwargs = _loads(request)
            method = resolve_method(self._instance, name, self._label)
        except AttributeError as exc:
            return _dumps(("no_method", str(exc)))
        except Exception as exc:
            return _error_reply(exc)
        try:
            value = method(*args, **kwargs)
        except Exception as exc:
            return _error_reply(exc)
        try:
            return _dumps(("ok", value))
        except Exception as exc:
            return _error_reply(
                TypeError(f"the result of {name}() cannot be pickled: {exc!r}"), tb=""
            )


# A message: the pickle and its out-of-band buffers.
_Message = tuple[bytes | memoryview, list[memoryview]]


def _dumps(obj: Any) -> _Message:
    buffers: list[pickle.PickleBuffer] = []
    payload = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return payload, [b.raw() for b in buffers]


def _loads(message: _Message) -> Any:
    payload, buffers = message
    return pickle.loads(payload, buffers=buffers)


def _error_reply(exc: Exception, tb: str | None = None) -> _Message:
    text = traceback.format_exc() if tb is None else tb
    return _dumps(("error", type(exc).__name__, str(exc), text))


# ---------------------------------------------------------------------------------------------
# Framing and authentication


class _AuthenticationError(Exception):
    pass


class _FrameError(EOFError):
    """A frame header out of bounds; the stream cannot be trusted, so the connection ends."""


_FRAME = struct.Struct("!QI")  # pickle length, number of out-of-band buffers


def _send_message(sock: socket.socket, message: _Message) -> None:
    payload, buffers = message
    header = _FRAME.pack(len(payload), len(buffers)) + b"".join(
        _HEADER.pack(b.nbytes) for b in buffers)
    if len(payload) + sum(b.nbytes for b in buffers) < _COALESCE_BYTES:
        sock.sendall(b"".join([header, payload, *buffers]))
        return
    sock.sendall(header + payload)
    for buffer in buffers:  # Straight from the arrays' memory: no copy on this side.
        sock.sendall(buffer)


def _recv_exact(sock: socket.socket, size: int) -> memoryview:
    # Uninitialised memory: the socket fills it, zeroing it first would be a wasted pass.
    view = np.empty(size, np.uint8).data.cast("B")
    received = 0
    while received < size:
        count = sock.recv_into(view[received:])
        if count == 0:
            raise EOFError("connection closed by the peer")
        received += count
    return view


def _recv_message(sock: socket.socket) -> _Message:
    size, count = _FRAME.unpack(_recv_exact(sock, _FRAME.size))
    if count > _MAX_BUFFERS:
        raise _FrameError(f"frame announces {count} buffers (at most {_MAX_BUFFERS})")
    sizes = [n for (n,) in _HEADER.iter_unpack(_recv_exact(sock, _HEADER.size * count))]
    if size + sum(sizes) > _MAX_MESSAGE_BYTES:
        raise _FrameError(
            f"frame announces {size + sum(sizes)} bytes (at most {_MAX_MESSAGE_BYTES})")
    payload = _recv_exact(sock, size)
    # Arrays unpickled from these buffers use them as their memory (writable, no copy).
    return payload, [_recv_exact(sock, n) for n in sizes]


def _digest(authkey: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(authkey, role + nonce, hashlib.sha256).digest()


def _server_handshake(sock: socket.socket, authkey: bytes) -> None:
    server_nonce = os.urandom(_NONCE_BYTES)
    sock.sendall(_MAGIC + server_nonce)
    answer = bytes(_recv_exact(sock, hashlib.sha256().digest_size + _NONCE_BYTES))
    client_digest, client_nonce = answer[: -_NONCE_BYTES], answer[-_NONCE_BYTES:]
    if not hmac.compare_digest(client_digest, _digest(authkey, b"client", server_nonce)):
        raise _AuthenticationError("client did not prove the program secret")
    sock.sendall(_digest(authkey, b"server", client_nonce))


def _client_handshake(sock: socket.socket, authkey: bytes) -> None:
    greeting = bytes(_recv_exact(sock, len(_MAGIC) + _NONCE_BYTES))
    if not greeting.startswith(_MAGIC):
        raise _AuthenticationError("the server does not speak the Trellis RPC protocol")
    client_nonce = os.urandom(_NONCE_BYTES)
    server_nonce = greeting[len(_MAGIC) :]
    sock.sendall(_digest(authkey, b"client", server_nonce) + client_nonce)
    proof = bytes(_recv_exact(sock, hashlib.sha256().digest_size))
    if not hmac.compare_digest(proof, _digest(authkey, b"server", client_nonce)):
        raise _AuthenticationError("server did not prove the program secret")


# ---------------------------------------------------------------------------------------------
# Futures


class _DaemonPool:
    """A thread pool of daemon threads that grows on demand.

    Not `ThreadPoolExecutor`: its workers are joined at interpreter exit, so one RPC stuck on a
    dead peer would hang the process. Growing whenever no worker is idle (up to a cap) keeps a
    future that waits on another future from deadlocking.
    """

    def __init__(self, max_workers: int = 256):
        self._max_workers = max_workers
        self._queue: queue.SimpleQueue[
            tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...],
                  dict[str, Any]]
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = 0
        self._idle = 0
        self._pending = 0

    def submit(
        self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._queue.put((future, fn, args, kwargs))
        with self._lock:
            self._pending += 1
            if self._pending > self._idle and self._workers < self._max_workers:
                self._workers += 1
                threading.Thread(target=self._work, name="rpc-future", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            future, fn, args, kwargs = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._pending -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # delivered to whoever waits on the future
                future.set_exception(exc)


_pool_instance: _DaemonPool | None = None
_pool_lock = threading.Lock()


def _pool() -> _DaemonPool:
    global _pool_instance
    with _pool_lock:
        if _pool_instance is None:
            _pool_instance = _DaemonPool()
        return _pool_instance
