"""Hostile input to a node's RPC server: each bad connection is closed without unpickling
anything or allocating what a header announces, and a legitimate client keeps working."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from trellis.launch.runtime import rpc

SECRET = b"s" * 32


class Echo:
    def echo(self, value):
        return value


@pytest.fixture
def server(monkeypatch):
    """A served `Echo`, with spies on unpickling and on every receive size."""
    loads, received = [], []
    real_loads, real_recv = rpc._loads, rpc._recv_exact

    def spy_loads(message):
        loads.append(1)
        return real_loads(message)

    def spy_recv(sock, size):
        received.append(size)
        return real_recv(sock, size)

    monkeypatch.setattr(rpc, "_loads", spy_loads)
    monkeypatch.setattr(rpc, "_recv_exact", spy_recv)
    address = rpc.TcpAddress("127.0.0.1", rpc.free_port(), SECRET)
    served = rpc.TcpServer(Echo(), "fuzzed", address)
    yield address, loads, received
    served.close()


def _raw(address: rpc.TcpAddress) -> socket.socket:
    return socket.create_connection((address.host, address.port), timeout=10.0)


def _authenticated(address: rpc.TcpAddress) -> socket.socket:
    sock = _raw(address)
    rpc._client_handshake(sock, SECRET)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ended the connection (EOF or reset) within the socket's timeout."""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def _random_bytes(address):
    sock = _raw(address)
    sock.sendall(os.urandom(4096))
    return sock


def _wrong_secret(address):
    sock = _raw(address)
    with pytest.raises(EOFError):  # the server hangs up instead of proving itself
        rpc._client_handshake(sock, b"w" * 32)
    return sock


def _truncated_handshake(address):
    sock = _raw(address)
    sock.sendall(os.urandom(10))
    sock.shutdown(socket.SHUT_WR)
    return sock


def _truncated_frame(address):
    sock = _authenticated(address)
    sock.sendall(rpc._FRAME.pack(1000, 0) + b"x" * 10)
    sock.shutdown(socket.SHUT_WR)
    return sock


def _huge_payload_header(address):
    sock = _authenticated(address)
    sock.sendall(rpc._FRAME.pack(2**62, 0))
    return sock


def _huge_buffer_header(address):
    sock = _authenticated(address)
    sock.sendall(rpc._FRAME.pack(10, 1) + rpc._HEADER.pack(2**62))
    return sock


def _huge_header_before_handshake(address):
    sock = _raw(address)
    sock.sendall(rpc._FRAME.pack(2**62, 0).ljust(64, b"\0"))
    return sock


@pytest.mark.parametrize("attack", [
    _random_bytes, _wrong_secret, _truncated_handshake, _truncated_frame,
    _huge_payload_header, _huge_buffer_header, _huge_header_before_handshake,
])
def test_hostile_connection_is_closed_and_a_client_keeps_working(server, attack):
    address, loads, received = server
    client = rpc.connect("fuzzed", address, timeout_s=10.0)
    assert client.echo("before") == "before"
    loads.clear()
    received.clear()

    assert _closed_by_server(attack(address))

    assert loads == [], "the server unpickled bytes from a hostile connection"
    assert max(received) < 1 << 20, f"the server tried to receive {max(received)} bytes"
    array = np.arange(1000.0)
    np.testing.assert_array_equal(client.echo(array), array)
    assert loads, "the unpickling spy saw the legitimate call (so it would see a hostile one)"
