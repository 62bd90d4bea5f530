"""Shared-memory channels: data crosses processes intact, dead peers are seen, nothing leaks."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from trellis.launch.runtime import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs Linux memfd")

LAYOUT = {"obs": ((4, 84, 84), "uint8"), "reward": ((4,), "float32"), "action": ((4,), "int32")}

# A client in its own process: sends 3 requests (obs filled with i, reward i / 2), checks each
# reply's actions (= 10 * i + k), prints "ok", then waits for its stdin to close.
CLIENT = """
import sys
import numpy as np
from trellis.launch.runtime import shm
layout = {"obs": ((4, 84, 84), "uint8"), "reward": ((4,), "float32"), "action": ((4,), "int32")}
channel = shm.connect(sys.argv[1].replace("@", "\\0"), layout, b"worker-7")
for i in range(3):
    channel.arrays["obs"][:] = i
    channel.arrays["reward"][:] = i / 2
    channel.send(1)
    assert channel.receive(30.0) == 1
    assert (channel.arrays["action"] == 10 * i + np.arange(4)).all(), channel.arrays["action"]
print("ok", flush=True)
sys.stdin.read()
"""


def _client(hub: shm.Hub) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, hub.address.replace("\0", "@")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def _poll_until(hub: shm.Hub, condition, timeout_s: float = 30.0) -> list:
    messages, deadline = [], time.monotonic() + timeout_s
    while not condition(messages):
        assert time.monotonic() < deadline, f"timed out; got {messages}"
        messages += hub.poll(0.1)
    return messages


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def test_requests_and_replies_cross_processes_intact():
    hub = shm.Hub(LAYOUT)
    client = _client(hub)
    try:
        for i in range(3):
            (channel, message), = _poll_until(hub, lambda m: m)
            assert (message, channel.hello) == (1, b"worker-7")
            np.testing.assert_array_equal(channel.arrays["obs"], np.full((4, 84, 84), i))
            np.testing.assert_array_equal(channel.arrays["reward"], np.full(4, i / 2))
            channel.arrays["action"][:] = 10 * i + np.arange(4)
            channel.send(1)
        assert client.stdout.readline() == "ok\n"
        # Its end closes when the client exits: the hub drops the channel.
        client.stdin.close()
        assert client.wait(30) == 0
        _poll_until(hub, lambda m: not hub.channels)
    finally:
        client.kill()
        hub.close()


def test_a_killed_client_is_dropped_and_leaves_no_segment():
    before = _shm_names()
    hub = shm.Hub(LAYOUT)
    client = _client(hub)
    try:
        (channel, _), = _poll_until(hub, lambda m: m)
        # The mapping is an anonymous memfd: mapped in both processes, named nowhere.
        maps = open(f"/proc/{client.pid}/maps").read()
        assert "/memfd:trellis-shm (deleted)" in maps
        assert _shm_names() == before
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        _poll_until(hub, lambda m: not hub.channels)
        assert _shm_names() == before
    finally:
        client.kill()
        hub.close()


def test_a_client_sees_the_hub_go_away_at_once():
    hub = shm.Hub(LAYOUT)
    channel = shm.connect(hub.address, LAYOUT, b"")
    _poll_until(hub, lambda m: hub.channels)
    assert channel.receive(0.01) is None  # Nothing sent yet: a bounded wait, no error.
    hub.close()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="the peer closed it"):
        channel.receive(30.0)
    assert time.monotonic() - start < 10.0  # Seen at EOF, not at the timeout.
    channel.close()


def test_an_unreachable_hub_is_an_oserror_for_the_caller_to_fall_back_on():
    # What a worker on another host (or network namespace) gets: no such abstract socket.
    with pytest.raises(OSError):
        shm.connect("\0trellis-shm-nobody-listens-here", LAYOUT, b"")


def test_a_client_with_another_layout_is_refused():
    hub = shm.Hub(LAYOUT)
    channel = shm.connect(hub.address, {"obs": ((3,), "float32")}, b"")
    try:
        hub.poll(10.0)  # The connection is waiting: the hub accepts it, maps, refuses.
        with pytest.raises(ConnectionError):
            channel.receive(10.0)
        assert hub.channels == []
    finally:
        channel.close()
        hub.close()


def _connect_while_polling(hub: shm.Hub, row: int, hello: bytes) -> shm.Channel:
    """A client of a hub with rows waits for the hub's fd: the hub polls meanwhile."""
    done = threading.Event()
    poller = threading.Thread(target=lambda: [hub.poll(0.05) for _ in iter(done.is_set, True)])
    poller.start()
    try:
        return shm.connect(hub.address, LAYOUT, hello, row=row)
    finally:
        done.set()
        poller.join()


def test_a_hub_with_rows_shares_one_mapping_a_row_per_client():
    """Each client's arrays are its row of the hub's: the hub gathers rows and scatters into
    them with one numpy operation; a row out of range is refused."""
    hub = shm.Hub(LAYOUT, rows=3)
    a = _connect_while_polling(hub, 2, b"a")
    b = _connect_while_polling(hub, 0, b"b")
    try:
        assert sorted((c.row, c.hello) for c in hub.channels) == [(0, b"b"), (2, b"a")]
        a.arrays["obs"][:] = 7
        b.arrays["reward"][:] = 1.5
        rows = np.take(hub.arrays["obs"], [2, 0], axis=0)
        assert (rows[0] == 7).all() and (rows[1] == 0).all() and (hub.arrays["obs"][1] == 0).all()
        assert hub.arrays["reward"].tolist() == [[1.5] * 4, [0] * 4, [0] * 4]
        hub.arrays["action"][[2, 0]] = [[1, 2, 3, 4], [5, 6, 7, 8]]
        assert a.arrays["action"].tolist() == [1, 2, 3, 4]
        assert b.arrays["action"].tolist() == [5, 6, 7, 8]
        with pytest.raises(OSError):
            _connect_while_polling(hub, 3, b"c")
    finally:
        a.close()
        b.close()
        hub.close()


def test_wake_ends_a_poll_early_from_another_thread():
    hub = shm.Hub(LAYOUT)
    timer = threading.Timer(0.2, hub.wake)
    timer.start()
    start = time.monotonic()
    assert hub.poll(30.0) == []
    assert time.monotonic() - start < 10.0
    timer.join()
    hub.close()
    hub.wake()  # After close: a no-op, not a write to a closed (or reused) fd.


def test_a_closed_channel_keeps_its_arrays_for_an_answer_in_progress():
    # The hub drops a dead worker's channel while the serving thread may still hold its
    # request: writing the answer must not fail, sending it fails as an OSError.
    hub = shm.Hub(LAYOUT)
    client = shm.connect(hub.address, LAYOUT, b"")
    client.send(1)
    (channel, _), = _poll_until(hub, lambda m: m)
    client.close()
    _poll_until(hub, lambda m: not hub.channels)
    channel.arrays["action"][:] = 3
    with pytest.raises(OSError):
        channel.send(1)
    hub.close()
