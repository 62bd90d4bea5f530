"""The replay node across processes: the client API over RPC, errors that keep their type,
a clear error (not a hang) when the node's process dies, and sampled batches through shared
memory (the same bits as over the socket, never overwritten while held, nothing left behind)."""

import gc
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest

from trellis import reverb_tables as rt
from trellis.launch import runtime
from trellis.launch.runtime import shm
from trellis.reverb_tables import tree

SIGNATURE = {"x": rt.ArraySpec((2,), np.float32)}
TABLES = [rt.TableSpec.queue("q", 3, signature=SIGNATURE),
          rt.TableSpec("p", rt.Prioritized(1.0), rt.Fifo(), 10, rt.MinSize(1),
                       signature=SIGNATURE)]


def item(i):
    return {"x": np.full((2,), i, np.float32)}


@pytest.fixture
def replay():
    program = runtime.Program("replay-node-test")
    handle = program.add_node(runtime.CourierNode(rt.ReplayNode, TABLES, "native", 0),
                              label="replay")
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        # Every batch of these tests is small: all but the first of a table and size go
        # through shared memory.
        client = rt.ReplayClient(handle.dereference(), shared_memory_min_bytes=0)
        yield client, handle.dereference(), running
    finally:
        running.stop()


def test_client_api_over_rpc(replay):
    client, _, _ = replay
    assert sorted(client.table_names) == ["p", "q"]
    keys = [client.insert(item(i), {"q": 1.0, "p": float(i)}) for i in range(3)]
    batch = client.sample("q", 3)
    np.testing.assert_array_equal(batch.data["x"][:, 0], [0, 1, 2])
    assert batch.keys.tolist() == keys
    assert client.update_priorities("p", {keys[0]: 5.0}) == 1
    assert client.delete("p", [keys[1]]) == 1
    info = client.info("p")
    assert (info["size"], info["num_inserts"]) == (2, 3)


def test_errors_keep_their_type_and_partial_samples_are_not_lost(replay):
    client, _, _ = replay
    with pytest.raises(rt.SignatureError, match="table 'q'"):
        client.insert({"x": np.zeros((3,), np.float32)}, {"q": 1.0})
    with pytest.raises(rt.UnknownTableError, match="unknown table 'nope'"):
        client.sample("nope", 1)
    for i in range(3):
        client.insert(item(i), {"q": 1.0})
    with pytest.raises(rt.RateLimiterTimeout) as caught:  # The queue is full.
        client.insert(item(3), {"q": 1.0}, timeout_s=0.05)
    assert caught.value.operation == "insert"
    start = time.monotonic()
    with pytest.raises(rt.RateLimiterTimeout) as caught:
        client.sample("q", 5, timeout_s=0.2)  # Only 3 items: the 3 taken come back.
    # The lower bound is the behaviour; the upper one (2 s, what a busy 2-core machine keeps)
    # only says it did not hang.
    assert 0.2 <= time.monotonic() - start < 2.0
    np.testing.assert_array_equal(caught.value.partial.data["x"][:, 0], [0, 1, 2])
    assert client.info("q")["size"] == 0


def test_killed_node_raises_a_clear_error_not_a_hang(replay):
    client, raw, running = replay
    pid = raw.pid()
    pending = raw.futures.sample("q", 1)  # Blocks on the empty queue inside the node.
    # The kill must find the call in flight, waiting inside the node, or the test proves nothing.
    deadline = time.monotonic() + 30
    while client.info("q")["rate_limiter"]["blocked_samples"] != 1:
        assert not pending.done(), f"the sample returned before the kill: {pending.result()}"
        assert time.monotonic() < deadline, "the sample never waited inside the node"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="replay"):
        pending.result(timeout=10)
    with pytest.raises(ConnectionError, match="replay"):
        client.sample("q", 1, timeout_s=1.0)
    assert time.monotonic() - start < 5
    result = running.wait(timeout=15)
    assert (result.stopped_by, result.error_node) == ("error", "replay")


def test_checkpoint_and_restore_through_the_node(replay, tmp_path):
    client, _, _ = replay
    for i in range(3):
        client.insert(item(i), {"p": float(i + 1), "q": 1.0})
    client.sample("q", 1)
    path = client.checkpoint(str(tmp_path / "ckpt"))
    before = {t: client.info(t) for t in ("p", "q")}
    client.insert(item(9), {"p": 1.0})
    client.restore(path)
    assert {t: client.info(t) for t in ("p", "q")} == before
    np.testing.assert_array_equal(client.sample("q", 2).data["x"][:, 0], [1, 2])


def test_streamed_inserts_arrive_intact_in_order_with_back_pressure(replay):
    client, _, _ = replay
    writer = rt.StreamingWriter(client, max_in_flight=4)
    try:
        # The queue holds 3: the writer's thread blocks in the node while this thread drains
        # it, and `insert` blocks once 4 are in flight, so both sides wait on each other.
        got = []
        for i in range(30):
            writer.insert(item(i), {"q": 1.0})
            if i % 3 == 2:
                got += client.sample("q", 3).data["x"][:, 0].tolist()
        writer.flush()
        while len(got) < 30:
            got += client.sample("q", 1).data["x"][:, 0].tolist()
        assert got == list(range(30))
        assert client.info("q")["num_inserts"] == 30
    finally:
        writer.close()


def test_a_streamed_insert_error_reaches_the_writer_and_writing_goes_on(replay):
    client, _, _ = replay
    writer = rt.StreamingWriter(client)
    try:
        writer.insert(item(0), {"q": 1.0})
        writer.flush()
        writer.insert({"x": np.zeros((3,), np.float32)}, {"q": 1.0})
        with pytest.raises(rt.SignatureError, match="table 'q'.*insert 1 of 1"):
            writer.flush()
        writer.flush()  # Raised once.
        writer.insert(item(1), {"q": 1.0})
        writer.insert(item(2), {"q": 1.0}, timeout_s=0.05)
        writer.insert(item(3), {"q": 1.0}, timeout_s=0.05)  # The queue is full: times out.
        with pytest.raises(rt.RateLimiterTimeout) as caught:
            writer.flush()
        assert caught.value.operation == "insert"
        assert client.sample("q", 3).data["x"][:, 0].tolist() == [0, 1, 2]
    finally:
        writer.close()
    with pytest.raises(rt.TableClosedError, match="writer is closed"):
        writer.insert(item(4), {"q": 1.0})


# ---------------------------------------------------------------- batches through shared memory

def shared_mappings(pid: int | str = "self") -> list[str]:
    """The lines of /proc/<pid>/maps that map a shared-memory segment (an anonymous memfd)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if "memfd:trellis-shm" in line]


def in_shared_memory(array: np.ndarray) -> bool:
    address = array.__array_interface__["data"][0]
    for line in shared_mappings():
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= address < high:
            return True
    return False


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def dev_shm() -> set[str]:
    """Named shared memory (the semaphores of multiprocessing, any process's, left out)."""
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


def wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


MIXED = {"obs": rt.ArraySpec((3, 5), np.uint8), "x": rt.ArraySpec((2,), np.float32),
         "more": (rt.ArraySpec((), np.int64), rt.ArraySpec((4,), bool),
                  rt.ArraySpec((2, 2), np.float64))}
# A native table with a signature samples straight into the segment; one without is copied in.
SHARED_TABLES = [rt.TableSpec("sig", rt.Prioritized(0.8), rt.Fifo(), 16, rt.MinSize(1),
                              signature=MIXED),
                 rt.TableSpec("free", rt.Uniform(), rt.Fifo(), 16, rt.MinSize(1))]


def mixed_item(rng):
    def leaf(spec):
        if spec.dtype == bool:
            return rng.random(spec.shape) < 0.5
        # Any bit pattern, NaN payloads included: a copy through floats would change some.
        raw = rng.integers(0, 256, (*spec.shape, spec.dtype.itemsize), dtype=np.uint8)
        return raw.view(spec.dtype).reshape(spec.shape)
    return {"obs": leaf(MIXED["obs"]), "x": leaf(MIXED["x"]),
            "more": tuple(leaf(s) for s in MIXED["more"])}


def fields(batch) -> list[np.ndarray]:
    """Every array of a batch but its keys (random per node)."""
    return tree.flatten(batch.data)[0] + [batch.probabilities, batch.priorities,
                                          batch.times_sampled, batch.table_size]


@pytest.fixture
def two_nodes():
    """Two replay nodes with the same tables and seed: the same inserts sample the same items."""
    program = runtime.Program("replay-shared-memory-test")
    handles = [program.add_node(runtime.CourierNode(rt.ReplayNode, SHARED_TABLES, "native", 0),
                                label=label) for label in ("a", "b")]
    running = runtime.launch(program, platform="local_mp", block=False)
    try:
        yield [handle.dereference() for handle in handles]
    finally:
        running.stop()


def test_batches_through_shared_memory_equal_the_socket_paths_bit_for_bit(two_nodes):
    shared = rt.ReplayClient(two_nodes[0], shared_memory_min_bytes=0)
    socket = rt.ReplayClient(two_nodes[1], shared_memory_min_bytes=None)
    rng = np.random.default_rng(0)
    for i in range(12):
        data = mixed_item(rng)
        for client in (shared, socket):
            client.insert(data, {"sig": 1.0 + i % 5, "free": 1.0})
    for table in ("sig", "free"):
        for n in range(6):
            a, b = shared.sample(table, 5), socket.sample(table, 5)
            assert tree.flatten(a.data)[1] == tree.flatten(b.data)[1]
            for x, y in zip(fields(a), fields(b), strict=True):
                assert (x.shape, x.dtype, x.tobytes()) == (y.shape, y.dtype, y.tobytes())
            # The first batch of a table and size comes over the socket: it tells the size.
            assert [in_shared_memory(x) for x in tree.flatten(a.data)[0]] == [n > 0] * 5
            assert not any(in_shared_memory(y) for y in tree.flatten(b.data)[0])
    shared.close()


def test_a_held_batch_is_never_overwritten_and_segments_are_reused(replay):
    client, _, _ = replay
    gc.collect()  # What earlier tests left for the collector must not go during this one.
    for i in range(10):
        client.insert(item(i), {"p": 1.0})
    client.sample("p", 4)  # Over the socket.
    held = client.sample("p", 4)
    kept = held.data["x"].copy()
    other = client.sample("p", 4)
    other = client.sample("p", 4)  # The first `other` is gone once this one is in hand.
    mapped = len(shared_mappings())
    seen = set()
    for _ in range(30):
        other = client.sample("p", 4)
        assert in_shared_memory(other.data["x"])
        assert not np.shares_memory(other.data["x"], held.data["x"])
        seen.update(other.data["x"][:, 0].tolist())
    assert len(seen) > 4, "the batches did not vary: an overwrite could go unseen"
    np.testing.assert_array_equal(held.data["x"], kept)
    assert len(shared_mappings()) == mapped  # Two segments take turns; no new ones.
    client.close()


def test_without_shared_memory_batches_come_over_the_socket_said_once(replay, monkeypatch,
                                                                      capfd):
    client, _, _ = replay

    def refuse(*args, **kwargs):
        raise OSError("test: the hub is out of reach")

    monkeypatch.setattr(shm, "connect", refuse)  # As on another host.
    for i in range(3):
        client.insert(item(i), {"p": 1.0})
    batches = [client.sample("p", 2) for _ in range(4)]
    assert not any(in_shared_memory(b.data["x"]) for b in batches)
    assert set(np.concatenate([b.data["x"][:, 0] for b in batches])) <= {0.0, 1.0, 2.0}
    lines = [line for line in capfd.readouterr().err.splitlines() if "replay client" in line]
    assert lines == ["replay client: no shared memory with the replay node (test: the hub is "
                     "out of reach); sampled batches come over the socket"]


def test_batches_below_the_threshold_come_over_the_socket(replay):
    _, raw, _ = replay
    raw.insert(item(1), {"p": 1.0})  # A batch of 2 holds 16 bytes: a segment of 64.
    for threshold, shared in ((64, True), (65, False)):
        client = rt.ReplayClient(raw, shared_memory_min_bytes=threshold)
        batches = [client.sample("p", 2) for _ in range(3)]
        assert [in_shared_memory(b.data["x"]) for b in batches] == [False, shared, shared]
        client.close()
    default = rt.ReplayClient(raw)
    assert not any(in_shared_memory(default.sample("p", 2).data["x"]) for _ in range(3))


def test_in_process_clients_use_no_segment_and_a_node_without_memfd_offers_none(monkeypatch):
    node = rt.ReplayNode(TABLES)
    try:
        client = rt.ReplayClient(node)
        client.insert(item(1), {"p": 1.0})
        assert not any(in_shared_memory(client.sample("p", 2).data["x"]) for _ in range(3))
        assert node.shared_memory_address(64) is not None
        monkeypatch.setattr(shm, "available", lambda: False)
        assert node.shared_memory_address(128) is None
    finally:
        node.close()


def test_no_segment_or_fd_outlives_the_client_and_the_node_drops_them(replay):
    client, raw, _ = replay
    for i in range(3):
        client.insert(item(i), {"p": 1.0})
    node_pid = raw.pid()
    gc.collect()  # What earlier tests left for the collector must not go during this one.
    mappings, fds, named = set(shared_mappings()), open_fds(), dev_shm()
    held = [client.sample("p", 2) for _ in range(4)]  # The first over the socket.
    assert len(set(shared_mappings()) - mappings) == 3
    assert len(shared_mappings(node_pid)) == 3
    client.close()
    assert len(set(shared_mappings()) - mappings) == 3  # Held batches stay readable.
    assert held[-1].data["x"].shape == (2, 2)
    del held
    assert (set(shared_mappings()), open_fds()) == (mappings, fds)
    # The node drops segments whose client closed them at its next call.
    wait_for(lambda: raw.shared_memory_address(64) and not shared_mappings(node_pid),
             "the node to unmap the closed segments")
    assert dev_shm() == named


def hold_shared_batches(node, ready) -> None:
    """In a child process: samples 3 batches into segments, holds them, waits to be killed."""
    client = rt.ReplayClient(node, shared_memory_min_bytes=0)
    batches = [client.sample("p", 2) for _ in range(4)]
    assert [in_shared_memory(b.data["x"]) for b in batches] == [False, True, True, True]
    ready.set()
    time.sleep(600)


def test_a_killed_clients_segments_are_dropped_by_the_node(replay):
    client, raw, _ = replay
    for i in range(3):
        client.insert(item(i), {"p": 1.0})
    node_pid = raw.pid()
    named = dev_shm()
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=hold_shared_batches, args=(raw, ready), daemon=True)
    child.start()
    try:
        assert ready.wait(60), "the child did not sample"
        assert len(shared_mappings(node_pid)) == 3
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        wait_for(lambda: raw.shared_memory_address(64) and not shared_mappings(node_pid),
                 "the node to drop the killed client's segments")
        assert dev_shm() == named
    finally:
        child.kill()
        child.join(10)
