"""Internals of the native replay backend, checked against brute-force models."""

from __future__ import annotations

import numpy as np
import pytest

from trellis import reverb_tables as rt
from trellis.reverb_tables import _index


def random_ops(rng, capacity, n_ops):
    """Yields ("insert", slot, priority) / ("update", slot, priority) / ("remove", slot, None)."""
    live: set[int] = set()
    for _ in range(n_ops):
        free = sorted(set(range(capacity)) - live)
        r = rng.random()
        if free and (not live or r < 0.45):
            slot = int(rng.choice(free))
            live.add(slot)
            yield "insert", slot, float(rng.choice([0.0, rng.random() * 5]))
        elif live and r < 0.75:
            yield "update", int(rng.choice(sorted(live))), float(rng.random() * 5)
        elif live:
            slot = int(rng.choice(sorted(live)))
            live.remove(slot)
            yield "remove", slot, None


def test_sum_tree_matches_brute_force():
    rng = np.random.default_rng(0)
    capacity, alpha = 37, 0.8  # not a power of two: padding leaves must stay empty
    index = _index.PrioritizedIndex(capacity, alpha)
    weights: dict[int, float] = {}
    for step, (op, slot, prio) in enumerate(random_ops(rng, capacity, 600)):
        if op == "insert":
            index.insert(slot, prio, step, step)
        elif op == "update":
            if step % 2:
                index.update(slot, prio, step)
            else:  # the vectorised path
                index.update_many(np.array([slot] * 5), np.array([prio] * 5), np.arange(5))
        else:
            index.remove(slot)
        if op == "remove":
            weights.pop(slot)
        else:
            weights[slot] = prio**alpha
        total = sum(weights.values())
        assert index.tree[1] == pytest.approx(total, rel=1e-12, abs=1e-12)
        if weights:
            slots, probs = index.sample(64, rng)
            assert set(slots.tolist()) <= set(weights)
            if total > 0:
                assert all(weights[s] > 0 for s in slots.tolist())
                np.testing.assert_allclose(probs, [weights[s] / total for s in slots.tolist()])
            else:  # every weight 0: uniform fallback
                np.testing.assert_allclose(probs, 1 / len(weights))


@pytest.mark.parametrize("selector", [rt.Fifo(), rt.Lifo(), rt.MaxHeap(), rt.MinHeap()])
def test_deterministic_indices_match_brute_force(selector):
    rng = np.random.default_rng(1)
    capacity = 20
    index = _index.make_index(selector, capacity)
    state: dict[int, tuple[float, int, int]] = {}  # slot -> (priority, seq, useq)
    for step, (op, slot, prio) in enumerate(random_ops(rng, capacity, 3000)):
        if op == "insert":
            index.insert(slot, prio, step, step)
            state[slot] = (prio, step, step)
        elif op == "update":
            index.update(slot, prio, step)
            state[slot] = (prio, state[slot][1], step)
        else:
            index.remove(slot)
            del state[slot]
        if not state:
            continue
        if isinstance(selector, rt.Fifo):
            want = min(state, key=lambda s: state[s][1])
        elif isinstance(selector, rt.Lifo):
            want = max(state, key=lambda s: state[s][1])
        elif isinstance(selector, rt.MaxHeap):
            want = min(state, key=lambda s: (-state[s][0], state[s][2]))
        else:
            want = min(state, key=lambda s: (state[s][0], state[s][2]))
        assert index.sample(2, rng)[0].tolist() == [want, want]
    # Lazy deletion stays bounded by compaction.
    entries = getattr(index, "entries", None) or getattr(index, "heap", None)
    assert len(entries) <= 2 * len(state) + 64 + 1


def test_signature_storage_is_preallocated():
    sig = {"obs": rt.ArraySpec((4, 2), np.uint8), "r": rt.ArraySpec((), np.float32)}
    table = rt.Table(rt.TableSpec("t", rt.Uniform(), rt.Fifo(), 16, rt.MinSize(1), signature=sig))
    storage = [leaf.shape for leaf in table._store.leaves]
    assert storage == [(17, 4, 2), (17,)]  # max_size + 1: an insert precedes its eviction
    key = table.insert({"obs": np.ones((4, 2), np.uint8), "r": np.float32(2)}, 1.0)
    # Written into a slot, not appended.
    assert [leaf.shape for leaf in table._store.leaves] == storage
    assert table.sample(1).keys.tolist() == [key]


def test_sampling_into_out_writes_the_same_batch_there():
    sig = {"obs": rt.ArraySpec((4, 2), np.uint8), "r": rt.ArraySpec((), np.float32)}
    spec = rt.TableSpec("t", rt.Prioritized(0.7), rt.Fifo(), 16, rt.MinSize(1), signature=sig)
    tables = [rt.Table(spec, seed=3), rt.Table(spec, seed=3)]  # The same draws.
    for i in range(10):
        for table in tables:
            table.insert({"obs": np.full((4, 2), i, np.uint8), "r": np.float32(i / 2)}, 1.0 + i)
    out = [np.zeros((6, 4, 2), np.uint8), np.zeros((6,), np.float32)]  # flatten order: obs, r
    into, plain = tables[0].sample(6, out=out), tables[1].sample(6)
    assert np.shares_memory(into.data["obs"], out[0])
    np.testing.assert_array_equal(out[0], plain.data["obs"])
    np.testing.assert_array_equal(out[1], plain.data["r"])
    np.testing.assert_array_equal(into.probabilities, plain.probabilities)
    with pytest.raises(ValueError, match=r"`out` must be arrays of \(shape, dtype\)"):
        tables[0].sample(5, out=out)


def test_a_queue_timing_out_mid_batch_returns_the_rows_of_out_it_wrote():
    sig = {"x": rt.ArraySpec((2,), np.int64)}
    table = rt.Table(rt.TableSpec.queue("q", 8, signature=sig))
    for i in range(3):
        table.insert({"x": np.full(2, i)}, 1.0)
    out = [np.full((5, 2), -1, np.int64)]
    with pytest.raises(rt.RateLimiterTimeout) as caught:
        table.sample(5, timeout_s=0.05, out=out)
    np.testing.assert_array_equal(caught.value.partial.data["x"], [[0, 0], [1, 1], [2, 2]])
    assert np.shares_memory(caught.value.partial.data["x"], out[0])
    with pytest.raises(ValueError, match="no signature"):
        rt.Table(rt.TableSpec.queue("free", 8)).sample(1, out=out)
