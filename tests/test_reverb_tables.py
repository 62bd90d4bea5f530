"""Conformance suite for replay tables with Reverb semantics.

Every test that takes the `make` fixture runs on both backends (the "reverb" cases where
dm-reverb is installed: `make test-reverb`) and states behaviour both must have. Item keys are
learned from samples, since dm-reverb's writer does not report them; counters only the native
backend keeps (`NATIVE_INFO`) and the counts its mutations return are checked on it alone.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from trellis import reverb_tables as rt

SIGNATURE = {"obs": rt.ArraySpec((3,), np.float32), "step": rt.ArraySpec((), np.int64)}


def item(i: int) -> dict:
    return {"obs": np.full((3,), i, np.float32), "step": np.int64(i)}


def spec(name="t", sampler=None, remover=None, max_size=100, limiter=None, mts=0,
         signature=SIGNATURE) -> rt.TableSpec:
    return rt.TableSpec(
        name=name,
        sampler=sampler if sampler is not None else rt.Uniform(),
        remover=remover if remover is not None else rt.Fifo(),
        max_size=max_size,
        rate_limiter=limiter if limiter is not None else rt.MinSize(1),
        max_times_sampled=mts,
        signature=signature,
    )


@pytest.fixture(params=["native", pytest.param("reverb", marks=pytest.mark.reverb)])
def backend(request) -> str:
    if request.param == "reverb" and not rt.reverb_available():
        pytest.skip("dm-reverb is not installed here (`make test-reverb` runs these)")
    return request.param


@pytest.fixture
def native(backend) -> bool:
    return backend == "native"


@pytest.fixture
def make(backend):
    """make(*specs, seed=0) -> a client of `backend`, closed at teardown."""
    clients = []

    def _make(*specs, seed=0):
        client = rt.make_client(list(specs), backend=backend, seed=seed)
        clients.append(client)
        return client

    yield _make
    for c in clients:
        c.close()


def steps(batch: rt.SampleBatch) -> list[int]:
    return batch.data["step"].tolist()


class Background:
    """Runs `fn` in a thread; `.result()` joins and returns its value or re-raises."""

    def __init__(self, fn):
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self._value = fn()
        except BaseException as e:  # re-raised in the test thread by result()
            self._error = e

    def blocked(self, wait_s=0.15) -> bool:
        self._thread.join(wait_s)
        return self._thread.is_alive()

    def result(self, timeout_s=5.0):
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "background call did not return"
        if self._error is not None:
            raise self._error
        return self._value


def keys_by_step(client, table, n_samples=400) -> dict[int, int]:
    """step -> key of the items a random sampler reaches (every item, with enough samples)."""
    batch = client.sample(table, n_samples)
    return dict(zip(steps(batch), batch.keys.tolist(), strict=True))


def drain_by_delete(client, table) -> list[int]:
    """Samples the next item and deletes it, until the table is empty (any max_times_sampled)."""
    out = []
    while client.info(table)["size"]:
        batch = client.sample(table, 1, timeout_s=1)
        out += steps(batch)
        client.delete(table, batch.keys.tolist())
    return out


def drain_steps(client, table) -> list[int]:
    """Samples one at a time until the table is empty (needs max_times_sampled=1)."""
    out = []
    while client.info(table)["size"]:
        out += steps(client.sample(table, 1, timeout_s=1))
    return out


# ------------------------------------------------------------------------------------------
# Selectors as samplers and removers.

PRIOS = [3.0, 1.0, 4.0, 1.5, 5.0]
ORDERS = {
    "Fifo": [0, 1, 2, 3, 4],
    "Lifo": [4, 3, 2, 1, 0],
    "MaxHeap": [4, 2, 0, 3, 1],
    "MinHeap": [1, 3, 0, 2, 4],
}


@pytest.mark.parametrize("sampler", ["Fifo", "Lifo", "MaxHeap", "MinHeap"])
@pytest.mark.parametrize("one_by_one", [True, False])
def test_deterministic_sampler_order(make, sampler, one_by_one):
    client = make(spec(sampler=getattr(rt, sampler)(), mts=1))
    for i, p in enumerate(PRIOS):
        client.insert(item(i), {"t": p})
    if one_by_one:
        got = drain_steps(client, "t")
    else:  # one batch: with max_times_sampled=1 each item leaves before the next is chosen
        batch = client.sample("t", 5, timeout_s=1)
        got = steps(batch)
        np.testing.assert_array_equal(batch.probabilities, 1.0)
        np.testing.assert_array_equal(batch.table_size, [5, 4, 3, 2, 1])
    assert got == ORDERS[sampler]


def test_heap_ties_go_to_least_recently_inserted_or_updated(make):
    client = make(spec(sampler=rt.MaxHeap()))
    for i in range(3):
        client.insert(item(i), {"t": 1.0})
    first = client.sample("t", 1)
    assert steps(first) == [0]
    client.update_priorities("t", {first.keys[0]: 1.0})  # Same priority, now the newest.
    assert drain_by_delete(client, "t") == [1, 2, 0]


def test_priority_update_reorders_heap(make):
    client = make(spec(sampler=rt.MinHeap()))
    for i in range(4):
        client.insert(item(i), {"t": float(i)})
    lowest = client.sample("t", 1)
    assert steps(lowest) == [0]
    client.update_priorities("t", {lowest.keys[0]: 2.5})
    assert drain_by_delete(client, "t") == [1, 2, 0, 3]


def test_fifo_sampler_without_max_times_sampled_repeats_the_oldest(make):
    client = make(spec(sampler=rt.Fifo()))
    for i in range(3):
        client.insert(item(i), {"t": 1.0})
    batch = client.sample("t", 3)
    assert steps(batch) == [0, 0, 0]
    assert batch.times_sampled.tolist() == [1, 2, 3]
    assert client.sample("t", 1).times_sampled.tolist() == [4]


@pytest.mark.parametrize(
    "remover, evicted",
    # As in Reverb, the new item (3, priority 0.5) is added first, so it can be the one evicted.
    [("Fifo", 0), ("Lifo", 3), ("MaxHeap", 1), ("MinHeap", 3), ("Prioritized", 2)],
)
def test_remover_evicts_at_max_size(make, native, remover, evicted):
    selector = rt.Prioritized(1.0) if remover == "Prioritized" else getattr(rt, remover)()
    client = make(spec(sampler=rt.Fifo(), remover=selector, max_size=3, mts=1))
    # Prioritized remover: only item 2 has a non-zero weight, so it is evicted with probability 1.
    prios = [0.0, 0.0, 2.0] if remover == "Prioritized" else [2.0, 3.0, 1.0]
    for i, p in enumerate(prios):
        client.insert(item(i), {"t": p})
    client.insert(item(3), {"t": 0.0 if remover == "Prioritized" else 0.5})
    info = client.info("t")
    assert (info["size"], info["num_deletes"]) == (3, 1)
    if native:
        assert info["num_evicted"] == 1
    assert drain_steps(client, "t") == [i for i in range(4) if i != evicted]


def test_uniform_remover_keeps_max_size(make):
    client = make(spec(sampler=rt.Fifo(), remover=rt.Uniform(), max_size=3, mts=1))
    for i in range(10):
        client.insert(item(i), {"t": 1.0})
    info = client.info("t")
    assert (info["size"], info["num_deletes"]) == (3, 7)
    remaining = drain_steps(client, "t")
    # The new item is added before the eviction (as in Reverb), so it may be the one evicted:
    # any 3 of the 10 can remain, still served in insertion order.
    assert len(set(remaining)) == 3 and set(remaining) <= set(range(10))
    assert remaining == sorted(remaining)


def test_max_times_sampled(make, native):
    client = make(spec(mts=2))
    client.insert(item(7), {"t": 1.0})
    assert client.sample("t", 1).times_sampled.tolist() == [1]
    assert client.info("t")["size"] == 1
    assert client.sample("t", 1).times_sampled.tolist() == [2]
    info = client.info("t")
    assert (info["size"], info["num_deletes"]) == (0, 1)
    if native:
        assert info["num_expired"] == 1


def test_max_times_sampled_one_batch_has_distinct_items(make):
    client = make(spec(mts=1))
    for i in range(6):
        client.insert(item(i), {"t": 1.0})
    batch = client.sample("t", 6, timeout_s=1)
    assert sorted(steps(batch)) == list(range(6))
    assert client.info("t")["size"] == 0


# ------------------------------------------------------------------------------------------
# Rate limiters.


def test_min_size_blocks_samples_until_reached(make, native):
    client = make(spec(limiter=rt.MinSize(3)))
    client.insert(item(0), {"t": 1.0})
    client.insert(item(1), {"t": 1.0})
    with pytest.raises(rt.RateLimiterTimeout):
        client.sample("t", 1, timeout_s=0)
    waiter = Background(lambda: client.sample("t", 2, timeout_s=5))
    assert waiter.blocked()
    if native:
        assert client.info("t")["rate_limiter"]["blocked_samples"] == 1
    client.insert(item(2), {"t": 1.0})  # MinSize never blocks inserts
    assert len(waiter.result()) == 2


def test_queue_blocks_inserts_when_full_and_samples_when_empty(make, native):
    client = make(rt.TableSpec.queue("q", 2, signature=SIGNATURE))
    reader = Background(lambda: client.sample("q", 1, timeout_s=5))
    assert reader.blocked()  # empty queue
    client.insert(item(0), {"q": 1.0})
    assert steps(reader.result()) == [0]

    client.insert(item(1), {"q": 1.0})
    client.insert(item(2), {"q": 1.0})
    with pytest.raises(rt.RateLimiterTimeout):
        client.insert(item(99), {"q": 1.0}, timeout_s=0)
    writer = Background(lambda: client.insert(item(3), {"q": 1.0}, timeout_s=5))
    assert writer.blocked()  # full queue
    assert steps(client.sample("q", 1)) == [1]
    writer.result()
    assert drain_steps(client, "q") == [2, 3]
    info = client.info("q")
    assert (info["num_inserts"], info["num_samples"], info["num_deletes"]) == (4, 4, 4)
    if native:
        assert info["num_expired"] == 4


def test_stack_is_lifo(make):
    client = make(rt.TableSpec.stack("s", 3, signature=SIGNATURE))
    for i in range(3):
        client.insert(item(i), {"s": 1.0})
    with pytest.raises(rt.RateLimiterTimeout):
        client.insert(item(3), {"s": 1.0}, timeout_s=0)
    assert drain_steps(client, "s") == [2, 1, 0]


def test_queue_serves_a_batch_larger_than_its_size_as_inserts_arrive(make):
    client = make(rt.TableSpec.queue("q", 2, signature=SIGNATURE))
    reader = Background(lambda: client.sample("q", 5, timeout_s=5))
    for i in range(5):
        client.insert(item(i), {"q": 1.0}, timeout_s=5)
    assert steps(reader.result()) == [0, 1, 2, 3, 4]


def test_sample_to_insert_ratio_hand_worked(make):
    # spi=2, min_size=2, error_buffer=3 -> offset 4, min_diff=1, max_diff=7; diff = 2*I - S.
    # A sample needs size >= 2 and diff - 1 >= 1; an insert needs I + 1 <= 2 (stage 1) or
    # 2*(I + 1) - S <= 7.
    limiter = rt.SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=2,
                                     error_buffer=3.0)
    assert (limiter.min_diff, limiter.max_diff) == (1.0, 7.0)
    client = make(spec(limiter=limiter))

    def try_insert(i):
        try:
            client.insert(item(i), {"t": 1.0}, timeout_s=0)
            return True
        except rt.RateLimiterTimeout:
            return False

    def try_sample():
        try:
            client.sample("t", 1, timeout_s=0)
            return True
        except rt.RateLimiterTimeout:
            return False

    assert try_insert(0)  # I=1: stage 1
    assert not try_sample()  # size 1 < 2
    assert try_insert(1)  # I=2: stage 1 (I + 1 - D = 2 <= 2)
    assert try_insert(2)  # 2*3 - 0 = 6 <= 7
    assert not try_insert(3)  # 2*4 - 0 = 8 > 7
    assert try_sample()  # S=1: diff before = 6, 6 - 1 = 5 >= 1
    assert try_insert(3)  # 2*4 - 1 = 7 <= 7 -> I=4, diff = 7
    assert not try_insert(4)  # 2*5 - 1 = 9 > 7
    # diff=7: samples while diff - 1 >= 1, i.e. six more (diff 7 -> 1), then blocked.
    assert [try_sample() for _ in range(7)] == [True] * 6 + [False]
    rl = client.info("t")["rate_limiter"]
    assert (rl["inserts"], rl["samples"]) == (4, 7)  # diff = 2 * 4 - 7 = 1
    assert try_insert(4)  # 2*5 - 7 = 3 <= 7

    # Blocking and unblocking across threads: insert until blocked, then a sample frees it.
    assert try_insert(5) and try_insert(6)  # diffs 5, 7
    writer = Background(lambda: client.insert(item(7), {"t": 1.0}, timeout_s=5))
    assert writer.blocked()  # 2*8 - 7 = 9 > 7
    client.sample("t", 2)  # 2*8 - 9 = 7 <= 7
    writer.result()
    # And a blocked sample is freed by an insert: drain, then wait.
    while try_sample():
        pass
    reader = Background(lambda: client.sample("t", 2, timeout_s=5))
    assert reader.blocked()
    client.insert(item(8), {"t": 1.0})  # +2 diff admits exactly two samples
    assert len(reader.result()) == 2


def test_sample_to_insert_ratio_with_a_range(make):
    limiter = rt.SampleToInsertRatio(1.0, 1, error_buffer=(0.0, 3.0))
    client = make(spec(limiter=limiter))
    for i in range(3):
        client.insert(item(i), {"t": 1.0}, timeout_s=0)
    with pytest.raises(rt.RateLimiterTimeout):
        client.insert(item(3), {"t": 1.0}, timeout_s=0)  # 4 - 0 > 3
    client.sample("t", 3, timeout_s=0)  # diff 3 -> 0, each with diff - 1 >= 0
    with pytest.raises(rt.RateLimiterTimeout):
        client.sample("t", 1, timeout_s=0)


def test_timeouts_raise_rate_limiter_timeout_in_time(make):
    client = make(spec(limiter=rt.MinSize(5)), rt.TableSpec.queue("q", 1, signature=SIGNATURE))
    start = time.monotonic()
    with pytest.raises(rt.RateLimiterTimeout) as info:
        client.sample("t", 4, timeout_s=0.2)
    elapsed = time.monotonic() - start
    # The lower bound is the behaviour; the upper one (2 s, what a busy 2-core machine keeps)
    # only says it did not hang.
    assert 0.2 <= elapsed < 2.0
    assert isinstance(info.value, TimeoutError)
    message = str(info.value)
    assert "'t'" in message and "sample" in message and "min_size_to_sample=5" in message
    assert info.value.partial is None

    client.insert(item(0), {"q": 1.0})
    start = time.monotonic()
    with pytest.raises(rt.RateLimiterTimeout, match="'q'.*insert"):
        client.insert(item(1), {"q": 1.0}, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - start < 2.0
    assert client.info("q")["size"] == 1


def test_timeout_mid_batch_returns_the_taken_items_on_the_error(make):
    client = make(rt.TableSpec.queue("q", 3, signature=SIGNATURE))
    for i in range(2):
        client.insert(item(i), {"q": 1.0})
    with pytest.raises(rt.RateLimiterTimeout) as info:
        client.sample("q", 5, timeout_s=0.1)
    assert steps(info.value.partial) == [0, 1]


def test_close_wakes_waiters(make):
    client = make(spec(limiter=rt.MinSize(2)))
    reader = Background(lambda: client.sample("t", 1))
    assert reader.blocked()
    client.close()
    with pytest.raises(rt.TableClosedError, match="closed"):
        reader.result(timeout_s=2)
    with pytest.raises(rt.TableClosedError):
        client.insert(item(0), {"t": 1.0})


# ------------------------------------------------------------------------------------------
# Prioritized and uniform sampling frequencies (chi-square).

# Upper 0.001 quantile of the chi-square distribution with 7 degrees of freedom.
CHI2_7DOF_P001 = 24.322


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(np.sum((counts - expected) ** 2 / expected))


def sample_counts(client, table, item_steps, n_batches=10, batch_size=4000):
    """How often each of `item_steps` was sampled, and the probability reported for each."""
    index = {s: i for i, s in enumerate(item_steps)}
    counts = np.zeros(len(item_steps))
    probs = {}
    for _ in range(n_batches):
        batch = client.sample(table, batch_size)
        for s, p in zip(steps(batch), batch.probabilities.tolist(), strict=True):
            probs[s] = p
        np.add.at(counts, [index[s] for s in steps(batch)], 1)
    return counts, probs


def test_prioritized_frequencies_match_and_follow_updates(make):
    alpha = 0.7
    client = make(spec(sampler=rt.Prioritized(alpha)), seed=1)
    prios = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0])
    for i, p in enumerate(prios):
        client.insert(item(i), {"t": float(p)})
    client.insert(item(99), {"t": 0.0})  # weight 0 ** 0.7 = 0: never sampled

    def check(prios):
        expected = prios**alpha / np.sum(prios**alpha)
        counts, probs = sample_counts(client, "t", list(range(8)) + [99])
        assert counts[-1] == 0
        np.testing.assert_allclose([probs[i] for i in range(8)], expected, rtol=1e-12)
        assert chi_square(counts[:-1], expected) < CHI2_7DOF_P001

    check(prios)
    keys = keys_by_step(client, "t", 2000)
    new = prios[::-1].copy()
    updated = client.update_priorities("t", {keys[i]: float(new[i]) for i in range(8)})
    assert updated in (8, None)  # dm-reverb reports no count
    check(new)


def test_prioritized_sampling_reports_priorities_and_exponent_zero_is_uniform(make):
    client = make(spec(sampler=rt.Prioritized(0.0)), seed=2)
    for i in range(9):
        client.insert(item(i), {"t": float(i)})  # Item 0 has priority 0: never sampled.
    batch = client.sample("t", 200)
    np.testing.assert_array_equal(batch.priorities, batch.data["step"].astype(float))
    np.testing.assert_allclose(batch.probabilities, 1 / 8)
    counts, _ = sample_counts(client, "t", list(range(9)), n_batches=4, batch_size=4000)
    assert counts[0] == 0
    assert chi_square(counts[1:], np.full(8, 1 / 8)) < CHI2_7DOF_P001


def test_uniform_frequencies(make):
    client = make(spec(sampler=rt.Uniform(), remover=rt.Fifo(), max_size=8), seed=3)
    for i in range(12):
        client.insert(item(i), {"t": float(i)})  # 0..3 evicted
    counts, probs = sample_counts(client, "t", list(range(4, 12)), n_batches=4,
                                  batch_size=4000)
    assert set(probs.values()) == {1 / 8}
    assert chi_square(counts, np.full(8, 1 / 8)) < CHI2_7DOF_P001


# ------------------------------------------------------------------------------------------
# Deletes, updates and info.


def test_delete_ignores_unknown_keys(make, native):
    client = make(spec())
    for i in range(5):
        client.insert(item(i), {"t": 1.0})
    keys = keys_by_step(client, "t")
    deleted = client.delete("t", [keys[1], keys[3], 12345])
    again = client.delete("t", [keys[1]])
    info = client.info("t")
    assert (info["size"], info["num_deletes"]) == (3, 2)
    if native:
        assert (deleted, again, info["num_deleted"]) == (2, 0, 2)
    assert set(steps(client.sample("t", 300))) == {0, 2, 4}


def test_update_priorities_ignores_unknown_keys(make, native):
    client = make(spec(sampler=rt.MaxHeap()))
    for i in range(3):
        client.insert(item(i), {"t": float(i)})
    top = client.sample("t", 1)
    assert steps(top) == [2]
    # Keys come back as uint64 numpy scalars; they must work as they are.
    updated = client.update_priorities("t", {top.keys[0]: 0.5, 424242: 1.0})
    batch = client.sample("t", 1)
    assert steps(batch) == [1] and batch.priorities.tolist() == [1.0]
    empty = client.update_priorities("t", {})
    if native:
        assert (updated, empty) == (1, 0)


# Counters only the native backend keeps (dm-reverb 0.14 does not report them).
NATIVE_INFO = {"num_evicted": 2, "num_expired": 1, "num_deleted": 1, "num_updates": 1,
               "closed": False}


def test_info_counters(make, native):
    client = make(spec(sampler=rt.Fifo(), max_size=4, mts=2, limiter=rt.MinSize(2)))
    for i in range(6):
        client.insert(item(i), {"t": 1.0})  # evicts 0, 1
    batch = client.sample("t", 3)  # item 2 sampled twice (expires), then item 3 once
    assert steps(batch) == [2, 2, 3]
    client.update_priorities("t", {batch.keys[0]: 5.0, batch.keys[2]: 2.0})  # 2 is gone
    client.delete("t", [batch.keys[2]])
    info = client.info("t")
    expected = {"name": "t", "size": 2, "max_size": 4, "max_times_sampled": 2,
                "num_inserts": 6, "num_samples": 3, "num_deletes": 4}
    assert {k: info[k] for k in expected} == expected
    rl = info["rate_limiter"]
    assert rl["min_size_to_sample"] == 2 and rl["samples_per_insert"] == 1.0
    assert (rl["inserts"], rl["samples"], rl["deletes"]) == (6, 3, 4)
    assert (rl["min_diff"], rl["max_diff"]) == (-math.inf, math.inf)
    if native:
        assert {k: info[k] for k in NATIVE_INFO} == NATIVE_INFO
        assert rl["type"] == "MinSize" and rl["diff"] == 3.0
        assert rl["can_insert"] and rl["can_sample"]


# ------------------------------------------------------------------------------------------
# Bad input leaves the tables unchanged.


def snapshot(client):
    return {name: client.info(name) for name in ("t", "u")}


@pytest.mark.parametrize(
    "data, match",
    [
        ({"obs": np.zeros((4,), np.float32), "step": np.int64(0)}, r"\['obs'\].*shape \(3,\)"),
        ({"obs": np.zeros((3,), np.float64), "step": np.int64(0)}, r"\['obs'\].*float32.*float64"),
        ({"obs": np.zeros((3,), np.float32)}, r"missing \[\"\['step'\]\"\]"),
        ({**item(0), "extra": np.zeros(())}, "unexpected"),
        ({"obs": np.zeros((3,), np.float32), "step": 1.5}, r"\['step'\].*int64"),
    ],
)
def test_signature_mismatch_leaves_tables_unchanged(make, data, match):
    client = make(spec("t"), spec("u", signature=None))
    client.insert(item(0), {"t": 1.0, "u": 1.0})
    before = snapshot(client)
    with pytest.raises(rt.SignatureError, match=match):
        client.insert(data, {"u": 1.0, "t": 1.0})  # "u" would accept it: nothing is written
    assert snapshot(client) == before


def test_python_scalars_are_converted_when_safe(make):
    client = make(spec())
    client.insert({"obs": np.ones(3, np.float32), "step": 4}, {"t": 1.0})  # int -> int64
    batch = client.sample("t", 1)
    assert batch.data["step"].dtype == np.int64 and steps(batch) == [4]


def test_unknown_table_lists_tables(make):
    client = make(spec("t"), spec("u"))
    client.insert(item(0), {"t": 1.0})
    before = snapshot(client)
    with pytest.raises(rt.UnknownTableError, match=r"'nope'.*\['t', 'u'\]"):
        client.insert(item(1), {"t": 1.0, "nope": 1.0})
    with pytest.raises(KeyError):
        client.sample("nope", 1)
    assert snapshot(client) == before


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "high", None])
def test_bad_priority_leaves_tables_unchanged(make, bad):
    client = make(spec("t", sampler=rt.Prioritized(1.0)), spec("u"))
    client.insert(item(0), {"t": 2.0, "u": 1.0})
    key = client.sample("t", 1).keys[0]
    before = snapshot(client)
    with pytest.raises(ValueError, match="priority for table 'u'"):
        client.insert(item(1), {"t": 1.0, "u": bad})
    with pytest.raises(ValueError, match="priority for table 't'"):
        client.update_priorities("t", {key: 3.0, 999: bad})
    assert snapshot(client) == before
    assert client.sample("t", 1).priorities.tolist() == [2.0]


def test_bad_arguments(make):
    client = make(spec())
    with pytest.raises(ValueError, match="batch_size"):
        client.sample("t", 0)
    with pytest.raises(ValueError, match="timeout_s"):
        client.sample("t", 1, timeout_s=-1)
    with pytest.raises(ValueError, match="non-empty"):
        client.insert(item(0), {})


# ------------------------------------------------------------------------------------------
# Storage and checkpoints.


def test_tables_without_signature_store_copies(make):
    client = make(spec(signature=None, sampler=rt.Fifo()))
    data = {"a": np.arange(3), "b": (np.float32(1.0), [np.ones((2, 2))])}
    client.insert(data, {"t": 1.0})
    data["a"][:] = -1  # the table holds a copy
    batch = client.sample("t", 2)
    np.testing.assert_array_equal(batch.data["a"], [[0, 1, 2], [0, 1, 2]])
    assert batch.data["b"][1][0].shape == (2, 2, 2)
    assert isinstance(batch.data["b"], tuple) and isinstance(batch.data["b"][1], list)


CKPT_SPECS = [
    spec("t", sampler=rt.Prioritized(0.6), remover=rt.Fifo(), max_size=6, mts=3),
    rt.TableSpec.queue("q", 4),  # no signature: object storage
    spec("u", sampler=rt.Uniform(), remover=rt.MinHeap(), max_size=5,
         limiter=rt.SampleToInsertRatio(2.0, 2, 40.0)),
    spec("h", sampler=rt.MaxHeap(), remover=rt.Lifo(), max_size=5),
]


def fill_for_checkpoint(client):
    for i in range(9):
        client.insert(item(i), {"t": 1.0 + i % 4, "u": float(i % 3), "h": float(i % 2)})
    for i in range(3):
        client.insert({"x": np.full((2,), i)}, {"q": 1.0})
    client.sample("t", 5)
    client.sample("q", 1)
    client.sample("u", 3)
    batch = client.sample("h", 2)
    client.update_priorities("h", {batch.keys[0]: 0.25})
    t_batch = client.sample("t", 2)
    client.update_priorities("t", {t_batch.keys[0]: 7.0})
    client.delete("t", t_batch.keys[1:].tolist())


def draw_all(client):
    """Samples from every table (identical outputs if the states, rngs included, are equal)."""
    out = []
    for name, n in (("t", 4), ("u", 6), ("h", 3), ("q", 2)):
        b = client.sample(name, n, timeout_s=1)
        out.append((b.keys.tolist(), b.probabilities.tolist(), b.priorities.tolist(),
                    b.times_sampled.tolist(), b.table_size.tolist(),
                    [(k, np.asarray(v).tolist()) for k, v in sorted(b.data.items())]))
    return out


def test_checkpoint_restore_round_trip(make, native, tmp_path):
    if not native:
        pytest.skip("checkpoints are the native backend's; dm-reverb has its own checkpointer")
    original = make(*CKPT_SPECS, seed=5)
    fill_for_checkpoint(original)
    path = original.checkpoint(tmp_path / "ckpt")
    assert os.listdir(tmp_path) == ["ckpt"]  # written atomically, nothing left behind

    restored = make(*CKPT_SPECS, seed=123)
    restored.insert(item(50), {"t": 1.0})  # state that restore must replace
    restored.restore(path)
    for name in ("t", "q", "u", "h"):
        assert restored.info(name) == original.info(name)
    assert draw_all(restored) == draw_all(original)
    for name in ("t", "q", "u", "h"):
        assert restored.info(name) == original.info(name)

    # Overwriting an existing checkpoint is atomic too.
    restored.checkpoint(path)
    assert os.listdir(tmp_path) == ["ckpt"]
    again = make(*CKPT_SPECS, seed=7)
    again.restore(path)
    for name in ("t", "q", "u", "h"):
        assert again.info(name) == restored.info(name)
    a, b = again.sample("u", 8), restored.sample("u", 8)
    assert a.keys.tolist() == b.keys.tolist() and steps(a) == steps(b)


def test_restore_rejects_a_different_spec_and_changes_nothing(make, native, tmp_path):
    if not native:
        pytest.skip("checkpoints are the native backend's; dm-reverb has its own checkpointer")
    original = make(*CKPT_SPECS, seed=5)
    fill_for_checkpoint(original)
    path = original.checkpoint(tmp_path / "ckpt")
    other_specs = [CKPT_SPECS[0], CKPT_SPECS[1], CKPT_SPECS[2],
                   spec("h", sampler=rt.MaxHeap(), remover=rt.Lifo(), max_size=6)]
    other = make(*other_specs, seed=5)
    other.insert(item(0), {"h": 1.0})
    before = {n: other.info(n) for n in ("t", "q", "u", "h")}
    with pytest.raises(ValueError, match="max_size"):
        other.restore(path)
    assert {n: other.info(n) for n in ("t", "q", "u", "h")} == before
    with pytest.raises(ValueError, match="tables"):
        make(spec("t")).restore(path)


# ------------------------------------------------------------------------------------------
# Concurrency.


def test_queue_under_concurrent_producers_and_consumers(make):
    client = make(rt.TableSpec.queue("q", 4, signature=SIGNATURE))
    n_producers, per_producer, n_consumers = 3, 40, 2
    total = n_producers * per_producer
    consumed: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def produce(p):
        for j in range(per_producer):
            client.insert(item(p * 1000 + j), {"q": 1.0}, timeout_s=10)

    def consume():
        while not stop.is_set():
            try:
                got = steps(client.sample("q", 1, timeout_s=0.05))
            except rt.RateLimiterTimeout:
                continue
            with lock:
                consumed.extend(got)
                if len(consumed) >= total:
                    stop.set()

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(n_producers)]
    threads += [threading.Thread(target=consume) for _ in range(n_consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    assert sorted(consumed) == sorted(p * 1000 + j for p in range(n_producers)
                                      for j in range(per_producer))
    info = client.info("q")
    assert (info["size"], info["num_inserts"], info["num_samples"]) == (0, total, total)


# ------------------------------------------------------------------------------------------
# Specs (backend-independent).


def test_spec_validation_messages():
    with pytest.raises(ValueError, match="max_size must be an int >= 1"):
        spec(max_size=0)
    with pytest.raises(ValueError, match="sampler must be a selector"):
        spec(sampler="uniform")
    with pytest.raises(ValueError, match="max_times_sampled"):
        spec(mts=-1)
    with pytest.raises(ValueError, match="rate_limiter"):
        spec(limiter=3)
    with pytest.raises(ValueError, match=r"signature leaf must be an ArraySpec.*\['a'\]"):
        spec(signature={"a": (3,)})
    with pytest.raises(ValueError, match="priority_exponent"):
        rt.Prioritized(-0.5)
    with pytest.raises(ValueError, match="non-negative"):
        rt.ArraySpec((-1,), np.float32)
    with pytest.raises(ValueError, match="min_size_to_sample"):
        rt.MinSize(0)
    with pytest.raises(ValueError, match="Queue.size"):
        rt.Queue(0)
    with pytest.raises(ValueError, match=r"at least 2 \* max\(1, samples_per_insert\)"):
        rt.SampleToInsertRatio(4.0, 10, error_buffer=3.0)
    with pytest.raises(ValueError, match="deadlock"):
        rt.SampleToInsertRatio(1.0, 10, error_buffer=(20.0, 30.0))
    with pytest.warns(UserWarning, match="below"):
        rt.SampleToInsertRatio(1.0, 10, error_buffer=(0.0, 5.0))
    with pytest.raises(ValueError, match="unique"):
        rt.NativeClient([spec("t"), spec("t")])
    with pytest.raises(ValueError, match="unknown replay backend"):
        rt.make_client([spec()], backend="nope")


def test_rate_limiter_params_match_reverb():
    assert rt.Queue(5).params() == {"samples_per_insert": 1.0, "min_size_to_sample": 1,
                                    "min_diff": 0.0, "max_diff": 5.0}
    assert rt.MinSize(3).params()["min_diff"] == -math.inf
    stir = rt.SampleToInsertRatio(8.0, 100, error_buffer=80.0)
    assert (stir.min_diff, stir.max_diff) == (720.0, 880.0)
    q = rt.TableSpec.queue("q", 7)
    assert (q.sampler, q.remover, q.max_times_sampled, q.rate_limiter) == (
        rt.Fifo(), rt.Fifo(), 1, rt.Queue(7))


def test_import_does_not_need_jax():
    code = "import sys, reverb_tables; assert 'jax' not in sys.modules, 'jax was imported'"
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_queue_without_signature_returns_expired_items_data(make):
    client = make(rt.TableSpec.queue("q", 4))
    for i in range(4):
        client.insert({"x": np.full((2,), i), "tag": (np.int32(i),)}, {"q": 1.0})
    batch = client.sample("q", 4)
    np.testing.assert_array_equal(batch.data["x"][:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(batch.data["tag"][0], [0, 1, 2, 3])
    assert client.info("q")["size"] == 0
