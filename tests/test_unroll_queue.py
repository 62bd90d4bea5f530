"""Unroll queues between inference and learner: bounded, in order, each unroll exactly once,
in-process and through a Queue table on a replay node (local_mp)."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from trellis import reverb_tables as rt
from trellis.builders.contract.agent import ArraySpec
from trellis.builders.experiments.unroll_queue import (
    UNROLL_VERSIONS,
    LocalUnrollQueue,
    TableUnrollQueue,
    unroll_table_spec,
)

T, K = 3, 2
SPECS = {"obs": ArraySpec((4,), "float32"), "action": ArraySpec((), "int32")}


def unroll(i: int) -> dict[str, np.ndarray]:
    """An unroll as `UnrollFeed` queues it, with the versions that acted."""
    return {"obs": np.full((T + 1, K, 4), i, np.float32),
            "action": np.full((T + 1, K), i, np.int32),
            UNROLL_VERSIONS: np.full(T + 1, i, np.int64)}


@pytest.fixture(params=["local", "table"])
def make_queue(request):
    clients = []

    def make(max_unrolls):
        if request.param == "local":
            return LocalUnrollQueue(max_unrolls)
        client = rt.make_client([unroll_table_spec(SPECS, T, K, max_unrolls)])
        clients.append(client)
        return TableUnrollQueue(client)

    yield make
    for c in clients:
        c.close()


def test_bounded_fifo(make_queue):
    q = make_queue(2)
    assert q.get(timeout_s=0.01) is None
    assert q.put(unroll(0), timeout_s=0.01) and q.put(unroll(1), timeout_s=0.01)
    assert not q.put(unroll(2), timeout_s=0.05)  # Full: refused, nothing stored.
    assert q.size() == 2
    got = [q.get(timeout_s=0.01) for _ in range(3)]
    assert [g["action"][0, 0] for g in got[:2]] == [0, 1] and got[2] is None
    np.testing.assert_array_equal(got[1]["obs"], unroll(1)["obs"])
    assert got[1]["obs"].dtype == np.float32 and got[1]["action"].shape == (T + 1, K)


def test_concurrent_producers_lose_and_duplicate_nothing(make_queue):
    q = make_queue(3)
    producers, per_producer = 3, 30

    def produce(p):
        for j in range(per_producer):
            while not q.put(unroll(p * 100 + j), timeout_s=0.05):
                pass

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    got = []
    while len(got) < producers * per_producer:
        u = q.get(timeout_s=5.0)
        assert u is not None, "a producer's unroll never arrived"
        got.append(int(u["action"][0, 0]))
    for t in threads:
        t.join(5)
    assert q.get(timeout_s=0.05) is None
    assert sorted(got) == sorted(p * 100 + j for p in range(producers)
                                 for j in range(per_producer))
    for p in range(producers):  # Each producer's unrolls arrive in the order it put them.
        mine = [g for g in got if g // 100 == p]
        assert mine == sorted(mine)


@pytest.mark.parametrize("backend", ["native", pytest.param("reverb", marks=pytest.mark.reverb)])
def test_run_through_a_replay_node_learns(backend, tmp_path):
    """Learning is reaching a return target within an env-step budget, as in
    tests/test_ray.py: at a fixed 60k steps the return ranged 90-173 over 12 runs three at a
    time (IMPALA at 4e-3) and once fell to 57.3 in a loaded `make test`; 4x random play is
    reached after 32k-48k steps."""
    if backend == "reverb" and not rt.reverb_available():
        pytest.skip("dm-reverb is not installed here (`make test-reverb` runs this)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, os.path.join(repo, "launch", "run.py"), "--platform=local_mp",
         "--unroll_queue=replay", f"--replay_backend={backend}", "--total_env_steps=200000",
         "--stop_at_return=88", "--eval_every=0", f"--logdir={tmp_path}"],
        capture_output=True, text=True, timeout=300, cwd=repo)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "summary.json") as f:
        s = json.load(f)
    # Random play scores about 22.
    assert s["stopped_by"] == "return_target" and s["mean_return"] >= 88, s
    assert s["env_steps"] < 200_000 and s["learner_steps"] > 50, s
