"""benchmarks/atari.py's figures from a run's metrics records, against hand-computed values."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def atari():
    """benchmarks/atari.py as a module (it imports its sibling `common` by name)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            "atari_benchmark", os.path.join(REPO, "benchmarks", "atari.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(os.path.join(REPO, "benchmarks"))


def _record(time, learner_steps, lag_mean, lag_max, batch_mean, queue_size):
    return {"time": time, "env_steps": 1000 * learner_steps, "learner_steps": learner_steps,
            "policy_lag_mean": lag_mean, "policy_lag_max": lag_max,
            "inference_batch_mean": batch_mean, "queue_size": queue_size}


def test_learner_figures_from_records(atari):
    records = [_record(100.0, 10, 6.0, 20, 200.0, 0),
               _record(102.0, 70, 7.0, 26, 210.0, 3),
               _record(104.0, 130, 8.0, 22, 190.0, 0),
               _record(105.0, 150, None, None, None, 0)]
    figures = atari.learner_figures(records)
    assert figures["learner_steps_per_s"] == pytest.approx((150 - 10) / 5.0)
    assert figures["policy_lag_mean"] == pytest.approx(7.0)   # (6 + 7 + 8) / 3
    assert figures["policy_lag_max"] == 26
    assert figures["inference_batch_mean"] == pytest.approx(200.0)
    assert figures["queue_empty_fraction"] == pytest.approx(3 / 4)


def test_learner_figures_of_too_few_records_are_none(atari):
    assert atari.learner_figures([]) == {
        "learner_steps_per_s": None, "policy_lag_mean": None, "policy_lag_max": None,
        "inference_batch_mean": None, "queue_empty_fraction": None}
    one = atari.learner_figures([_record(100.0, 10, 6.0, 20, 200.0, 1)])
    assert one["learner_steps_per_s"] is None
    assert one["queue_empty_fraction"] == 0.0
