"""Shared-memory channels between processes of one host: arrays in a shared mapping, a byte to wake.

A channel joins one client (e.g. an env worker) to a `Hub` (e.g. the inference server). The
client creates an anonymous memfd holding named fixed-shape arrays (the `Layout`), maps it and
passes the fd to the hub over a Unix stream socket (SCM_RIGHTS), with a short hello. From then
on both sides read and write the arrays in place and send one byte over that socket to say
"your turn": a request-reply costs two one-byte socket writes and no pickling.

A hub with `rows` turns it around: the hub holds one mapping in which each field is an array of
`rows` clients' arrays ([rows, ...]); a client names its row when it connects and gets the
hub's fd back. The hub then reads or writes any set of clients' arrays with one numpy
operation (`np.take`, a fancy-indexed assignment), where separate mappings need one per client.

Why these choices:
- memfd, not /dev/shm: the mapping has no name, so nothing outlives the processes that map it,
  even after kill -9 of either side, and it is not limited by the size of /dev/shm (a container
  default of 64 MB). Its pages are reserved when it is created (`posix_fallocate`), so running
  out of memory is an `OSError` at connection time, never a SIGBUS later.
- The socket that carried the fd stays the wake-up line: a dead peer's end closes, so a waiting
  side sees EOF at once (`ConnectionError`), and the hub watches all channels with one
  `selectors` wait.
- The hub listens on an abstract Unix socket (Linux): no file to clean up, and a client on
  another host or in another network namespace cannot reach it, so `connect` fails there and
  the caller falls back to its socket path.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import selectors
import socket
import struct
import threading
from collections.abc import Mapping

import numpy as np

# name -> (shape, dtype), in the order they are laid out.
Layout = Mapping[str, tuple[tuple[int, ...], str]]

_ALIGN = 64  # A cache line: fields written by different sides do not share one.
_HELLO_BYTES = 256
_BYTES = [bytes((i,)) for i in range(256)]  # The one-byte messages, made once.


def available() -> bool:
    """Whether this platform has what channels need (Linux: memfd, fd passing, abstract sockets)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "send_fds") and os.name == "posix"


def _offsets(layout: Layout) -> tuple[dict[str, int], int]:
    offsets, end = {}, 0
    for name, (shape, dtype) in layout.items():
        offsets[name] = end
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        end += -(-size // _ALIGN) * _ALIGN
    return offsets, max(end, _ALIGN)


def _with_rows(layout: Layout, rows: int) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: ((rows, *shape), dtype) for name, (shape, dtype) in layout.items()}


def _create(layout: Layout) -> tuple[int, dict[str, np.ndarray]]:
    """A new anonymous mapping of `layout`: (its fd, its arrays)."""
    _, size = _offsets(layout)
    fd = os.memfd_create("trellis-shm", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        return fd, _map(fd, layout)
    except BaseException:
        os.close(fd)
        raise


def _map(fd: int, layout: Layout) -> dict[str, np.ndarray]:
    offsets, size = _offsets(layout)
    if os.fstat(fd).st_size != size:
        raise ValueError(f"shared mapping has {os.fstat(fd).st_size} bytes, layout needs {size}")
    buffer = mmap.mmap(fd, size)  # The arrays below keep it mapped; dropping them unmaps it.
    return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offsets[name])
            for name, (shape, dtype) in layout.items()}


class Channel:
    """One side of a channel: the shared `arrays` and the wake-up socket.

    Attributes:
      arrays: name -> array living in the shared mapping (both sides see each write).
      hello: what the client sent when it connected.
      row: on a hub's side, the client's row of the hub's arrays (a hub with `rows`), else
        None.
    """

    def __init__(self, sock: socket.socket, arrays: dict[str, np.ndarray], hello: bytes):
        self._sock = sock
        self._timeout = sock.gettimeout()
        self.arrays = arrays
        self.hello = hello
        self.row: int | None = None

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, message: int) -> None:
        """Wakes the peer with one byte (0-255)."""
        self._sock.sendall(_BYTES[message])

    def receive(self, timeout_s: float) -> int | None:
        """The peer's next byte, or None if none came within `timeout_s`.

        Raises:
          ConnectionError: the peer closed its end (it exited or died).
        """
        if timeout_s != self._timeout:  # Each settimeout costs two fcntl calls.
            self._sock.settimeout(timeout_s)
            self._timeout = timeout_s
        try:
            data = self._sock.recv(1)
        except TimeoutError:
            return None
        if not data:
            raise ConnectionError("shared-memory channel: the peer closed it (exited or died)")
        return data[0]

    def read_available(self) -> bytes | None:
        """The bytes waiting on a non-blocking (hub-side) channel; None once the peer closed."""
        try:
            return self._sock.recv(4096) or None
        except BlockingIOError:
            return b""
        except OSError:
            return None

    def close(self) -> None:
        """Closes the wake-up socket; the arrays stay mapped until the channel is dropped.

        A request still being served when its peer died may write its answer into them.
        """
        self._sock.close()


def connect(address: str, layout: Layout, hello: bytes, timeout_s: float = 10.0,
            row: int | None = None) -> Channel:
    """Creates the shared arrays of `layout` and hands them to the hub at `address`; or, with
    `row`, maps the arrays of that row of the hub's (a hub made with `rows`).

    Raises:
      OSError: the hub cannot be reached from here (another host or network namespace), the
        mapping cannot be had (memory), or the hub refused the row (`ConnectionError`);
        callers fall back to their socket path.
    """
    if len(hello) > _HELLO_BYTES:
        raise ValueError(f"hello is {len(hello)} bytes, at most {_HELLO_BYTES}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        if row is not None:
            sock.connect(address)
            sock.sendall(struct.pack("!Hq", len(hello), row) + hello)
            data, fds, _, _ = socket.recv_fds(sock, 8, 1)
            try:
                if len(fds) != 1 or len(data) != 8:
                    raise ConnectionError(f"the shared-memory hub refused row {row}")
                (rows,) = struct.unpack("!q", data)
                full = _map(fds[0], _with_rows(layout, rows))
            finally:
                for fd in fds:
                    os.close(fd)
            return Channel(sock, {name: array[row, ...] for name, array in full.items()}, hello)
        fd, arrays = _create(layout)
        try:
            sock.connect(address)
            socket.send_fds(sock, [struct.pack("!H", len(hello)) + hello], [fd])
        finally:
            os.close(fd)  # The mapping (and the hub's) keep the memory; no fd or name is left.
    except BaseException:
        sock.close()
        raise
    return Channel(sock, arrays, hello)


class Hub:
    """Accepts channels of one `layout` and waits on all of them at once.

    `poll` accepts new clients, drops those whose peer closed, and returns the messages that
    arrived. Not thread-safe except `wake`, which any thread may call to end a `poll` early.

    Args:
      layout: each client's arrays.
      rows: None: each client brings its own mapping. Else the hub holds `arrays`, each field
        [rows, ...], and a client connects to one row (`connect(row=)`); its channel's
        `row` and `arrays` (views of that row) say which.
    """

    def __init__(self, layout: Layout, rows: int | None = None):
        self._layout = dict(layout)
        self.rows = rows
        self.arrays: dict[str, np.ndarray] = {}
        self._fd = None
        if rows is not None:
            self._fd, self.arrays = _create(_with_rows(layout, rows))
        self.address = f"\0trellis-shm-{secrets.token_hex(16)}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._wake_lock = threading.Lock()  # No wake() writes to the pipe's fd once closed.
        self._closed = False
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.channels: list[Channel] = []

    @property
    def layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return self._layout

    def wake(self) -> None:
        """Ends the current (or next) `poll` at once; safe from any thread."""
        with self._wake_lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):  # Full: a wake is pending anyway.
                    os.write(self._wake_w, b"\0")

    def poll(self, timeout_s: float) -> list[tuple[Channel, int]]:
        """Waits up to `timeout_s` for messages; returns (channel, byte) for each that came.

        Also returns early (possibly with nothing) after `wake`. A new client's channel is
        in `channels` once accepted; a channel whose peer closed is closed and removed.
        """
        messages: list[tuple[Channel, int]] = []
        for key, _ in self._selector.select(max(timeout_s, 0.0)):
            if key.data == "listener":
                messages.extend(self._accept())
            elif key.data == "wake":
                os.read(self._wake_r, 4096)
            else:
                channel = key.data
                data = channel.read_available()
                if data is None:
                    self._drop(channel)
                else:
                    messages.extend((channel, b) for b in data)
        return messages

    def _accept(self) -> list[tuple[Channel, int]]:
        """Takes one client's fd and hello; returns any message that came in the same read."""
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return []
        row = None
        try:
            sock.settimeout(1.0)  # The client sends its fd and hello right after connecting.
            if self.rows is None:
                data, fds, _, _ = socket.recv_fds(sock, 2 + _HELLO_BYTES, 1)
                try:
                    if len(fds) != 1 or len(data) < 2:
                        raise ConnectionError("a shared-memory client sent no mapping")
                    arrays = _map(fds[0], self._layout)
                finally:
                    for fd in fds:
                        os.close(fd)
                (length,) = struct.unpack("!H", data[:2])
                hello, data = bytes(data[2:2 + length]), data[2 + length:]
            else:
                assert self._fd is not None  # A hub with rows holds their mapping's fd.
                data = sock.recv(10 + _HELLO_BYTES)  # Sent in one write, like the fd above.
                length, row = struct.unpack("!Hq", data[:10])
                hello, data = bytes(data[10:10 + length]), data[10 + length:]
                if not 0 <= row < self.rows:
                    raise ConnectionError(f"row {row} not in [0, {self.rows})")
                socket.send_fds(sock, [struct.pack("!q", self.rows)], [self._fd])
                arrays = {name: array[row, ...] for name, array in self.arrays.items()}
        except (OSError, ValueError, struct.error):
            sock.close()  # A client that does not follow the protocol gets nothing.
            return []
        sock.setblocking(False)
        channel = Channel(sock, arrays, hello)
        channel.row = row
        self.channels.append(channel)
        self._selector.register(channel, selectors.EVENT_READ, channel)
        return [(channel, b) for b in data]

    def _drop(self, channel: Channel) -> None:
        self._selector.unregister(channel)
        self.channels.remove(channel)
        channel.close()

    def close(self) -> None:
        """Closes every channel (their clients see EOF) and the listener."""
        for channel in list(self.channels):
            self._drop(channel)
        self._selector.close()
        self._listener.close()
        if self._fd is not None:
            os.close(self._fd)  # `arrays` keep the hub's mapping until they are dropped.
            self._fd = None
        with self._wake_lock:
            self._closed = True
            os.close(self._wake_r)
            os.close(self._wake_w)
